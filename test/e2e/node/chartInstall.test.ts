import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import {
  CHART,
  LOCAL_IMAGES,
  PAUSE_IMAGE,
  TESTTOOLS_IMAGE,
  apply,
  getJson,
  githubSignature,
  helm,
  http,
  kubectl,
  list,
  ok,
  podReady,
  serviceUrl,
  waitFor,
  type Obj,
} from '../../helpers/nodeSupport.js';
import { startMonitoring, type Monitoring } from '../../helpers/nodeMonitoring.js';

/**
 * The chart as a user installs it, on a real node (hack/node.sh: containerd + kubelet + kube-proxy +
 * CoreDNS), from the images `make images` built with podman: install --wait, helm test, the three
 * job kinds running for real in pods, a worker pod deleted mid-job, a Secret change rolling the
 * pods without dropping requests, Bull Board through the Service, the worker-down alert travelling
 * Prometheus -> Alertmanager -> opsgate's own /webhook/alerts, and an uninstall that leaves nothing.
 * One release, steps in order (each step builds on the one before).
 */
jest.setTimeout(600_000);

const RELEASE = 'opsgate';
const NS = 'e2e';
const APPS = 'e2e-apps';
const DEPLOY = 'e2e-deploy';
const PROJECT = 'group/shop';
const ROLLOUT_TIMEOUT_SECONDS = 120;

const secrets = {
  apiKeyRoles: `e2e-readonly-${randomBytes(12).toString('hex')}:readonly,e2e-operator-${randomBytes(12).toString('hex')}:operator`,
  bearerToken: `e2e-bearer-${randomBytes(16).toString('hex')}`,
  githubWebhookSecret: `e2e-github-${randomBytes(16).toString('hex')}`,
  alertsWebhookToken: `e2e-alerts-${randomBytes(16).toString('hex')}`,
};
const [READONLY_KEY, OPERATOR_KEY] = secrets.apiKeyRoles.split(',').map((i) => i.slice(0, i.lastIndexOf(':'))) as [string, string];

/** The values of the upgrade that makes the release useful: inventory and credentials. */
const flowValues = {
  secrets,
  adminUI: { enabled: true },
  config: { rolloutTimeoutSeconds: ROLLOUT_TIMEOUT_SECONDS },
  inventory: {
    hosts: { 'web-1': { namespace: APPS, deployments: ['web', 'slow', 'broken'] } },
    projects: {
      [PROJECT]: {
        namespace: DEPLOY,
        serviceAccountName: 'deployer',
        image: TESTTOOLS_IMAGE,
        command: ['sh', '-c'],
        args: ['echo "deploying $OPSGATE_PROJECT $OPSGATE_REF audit=$OPSGATE_AUDIT_ID"'],
        activeDeadlineSeconds: 300,
      },
    },
    // The dashboard's Remediation row counts by rule, and a rule's series exist from the start: one
    // rule (dry-run, on an alert nothing here fires; the remediation loop is remediation.test.ts's)
    // so every panel has data to show.
    // A dry-run rule may run unconfirmed (no PROMETHEUS_URL here); like every rule it pins its targets.
    remediations: [{ name: 'web-unavailable', match: { alertname: 'E2EWebUnavailable' }, targets: ['web-1'], mode: 'dry-run' }],
  },
};

function valuesFile(v: unknown): string {
  const f = join(mkdtempSync(join(tmpdir(), 'opsgate-e2e-')), 'values.yaml');
  writeFileSync(f, stringify(v), { mode: 0o600 });
  return f;
}

function deployment(
  name: string,
  opts: { replicas: number; image: string; minReadySeconds?: number; progressDeadlineSeconds?: number; pullPolicy?: string },
): string {
  return stringify({
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name, namespace: APPS },
    spec: {
      replicas: opts.replicas,
      minReadySeconds: opts.minReadySeconds ?? 0,
      progressDeadlineSeconds: opts.progressDeadlineSeconds ?? 600,
      selector: { matchLabels: { app: name } },
      strategy: { type: 'RollingUpdate', rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } },
      template: {
        metadata: { labels: { app: name } },
        spec: {
          terminationGracePeriodSeconds: 2,
          automountServiceAccountToken: false,
          containers: [{ name: 'main', image: opts.image, imagePullPolicy: opts.pullPolicy ?? 'IfNotPresent' }],
        },
      },
    },
  });
}

async function pods(namespace: string, selector: string): Promise<Obj[]> {
  return list('pods', namespace, selector);
}

async function releasePods(component: string): Promise<Obj[]> {
  return pods(NS, `app.kubernetes.io/instance=${RELEASE},app.kubernetes.io/component=${component}`);
}

let api = '';
const operator = { 'X-API-Key': OPERATOR_KEY };
const readonly = { 'X-API-Key': READONLY_KEY };
const bearer = { Authorization: `Bearer ${secrets.bearerToken}` };

async function job(id: string): Promise<Obj> {
  const r = await http('GET', `${api}/ops/jobs/${encodeURIComponent(id)}`, { headers: readonly });
  expect(r.status).toBe(200);
  return r.body;
}

async function jobEnds(id: string, timeoutMs: number): Promise<Obj> {
  return waitFor(
    `job ${id} to finish`,
    async () => {
      const j = await job(id);
      return j.state === 'completed' || j.state === 'failed' ? j : undefined;
    },
    timeoutMs,
    1000,
  );
}

async function restart(service: string): Promise<string> {
  const r = await http('POST', `${api}/ops/restart?host=web-1&service=${service}`, { headers: bearer });
  expect(r.status).toBe(200);
  expect(r.body).toMatchObject({ host: 'web-1', service, status: 'submitted' });
  expect(typeof r.body.job_id).toBe('string');
  return r.body.job_id as string;
}

describe('charts/opsgate on a real node', () => {
  let monitoring: Monitoring | undefined;

  beforeAll(async () => {
    for (const ns of [NS, APPS, DEPLOY]) {
      // a namespace of an earlier run may still be terminating
      await waitFor(`namespace ${ns} gone`, async () => !(await getJson('namespace', ns)), 120_000, 1000);
    }
    for (const ns of [APPS, DEPLOY]) ok(await kubectl(['create', 'namespace', ns]), `create namespace ${ns}`);
    ok(await kubectl(['-n', DEPLOY, 'create', 'serviceaccount', 'deployer']), 'create serviceaccount');
    await apply(deployment('web', { replicas: 2, image: PAUSE_IMAGE, minReadySeconds: 2 }));
    await apply(deployment('slow', { replicas: 1, image: PAUSE_IMAGE, minReadySeconds: 25 }));
    // its pods can never start: the image is on no node and may not be pulled
    await apply(
      deployment('broken', { replicas: 1, image: 'localhost/opsgate-missing:1', pullPolicy: 'Never', progressDeadlineSeconds: 10 }),
    );
  });

  afterAll(async () => {
    await monitoring?.stop();
    await helm(['uninstall', RELEASE, '-n', NS, '--ignore-not-found', '--wait', '--timeout', '2m']);
    for (const ns of [NS, APPS, DEPLOY]) await kubectl(['delete', 'namespace', ns, '--ignore-not-found', '--wait=false']);
  });

  test('helm install --wait with the defaults and local images only, then helm test Succeeded', async () => {
    const t0 = Date.now();
    ok(
      await helm(['install', RELEASE, CHART, '-n', NS, '--create-namespace', '-f', LOCAL_IMAGES, '--wait', '--timeout', '6m']),
      'helm install --wait',
    );
    process.stderr.write(`[e2e] helm install --wait: ${Date.now() - t0} ms\n`);
    for (const c of ['api', 'worker', 'redis']) {
      const ps = await releasePods(c);
      expect(ps.length).toBeGreaterThan(0);
      for (const p of ps) expect(podReady(p)).toBe(true);
    }
    api = await serviceUrl(`${RELEASE}-api`, NS);
    // the test pod curls /health through the Service and greps {"status":"ok"} (templates/tests)
    const t = ok(await helm(['test', RELEASE, '-n', NS, '--timeout', '3m']), 'helm test');
    expect(t.stdout).toMatch(/TEST SUITE:\s+opsgate-test-health[\s\S]*Phase:\s+Succeeded/);
  });

  test('api and worker run with a read-only root filesystem and no shell: kubectl exec sh fails, an exec-form node command runs', async () => {
    for (const c of ['api', 'worker']) {
      const pod = (await releasePods(c)).find(podReady)!;
      const container = (pod.spec.containers as Obj[]).find((x) => x.name === c)!;
      expect(container.securityContext.readOnlyRootFilesystem).toBe(true);
      const sh = await kubectl(['-n', NS, 'exec', pod.metadata.name, '-c', c, '--', 'sh', '-c', 'true']);
      expect(sh.code).not.toBe(0);
      expect(sh.stderr).toMatch(/executable file not found|no such file or directory/);
      // The image's only program: node, without a shell in between; the root filesystem refuses a write.
      const probe = ok(
        await kubectl([
          '-n',
          NS,
          'exec',
          pod.metadata.name,
          '-c',
          c,
          '--',
          'node',
          '-e',
          "let e = ''; try { require('fs').writeFileSync('/app/x', '') } catch (err) { e = err.code } process.stdout.write(process.getuid() + ' ' + e)",
        ]),
        `kubectl exec ${c} node`,
      );
      expect(probe.stdout).toBe('1000 EROFS');
    }
  });

  test('helm upgrade that changes Secret values: api and worker pods roll (checksum) and the API keeps serving', async () => {
    const before = {
      api: (await releasePods('api')).map((p) => p.metadata.name),
      worker: (await releasePods('worker')).map((p) => p.metadata.name),
    };
    const sumBefore = (await getJson('deployment', `${RELEASE}-api`, NS))!.spec.template.metadata.annotations['checksum/secret'];
    // /health through the Service the whole time
    let stop = false;
    const answers = { ok: 0, bad: [] as string[] };
    const prober = (async () => {
      while (!stop) {
        try {
          const r = await http('GET', `${api}/health`, { timeoutMs: 3000 });
          if (r.status === 200) answers.ok++;
          else answers.bad.push(String(r.status));
        } catch (e) {
          answers.bad.push((e as Error).message);
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    })();
    ok(
      await helm(['upgrade', RELEASE, CHART, '-n', NS, '-f', LOCAL_IMAGES, '-f', valuesFile(flowValues), '--wait', '--timeout', '6m']),
      'helm upgrade --wait',
    );
    stop = true;
    await prober;
    const sumAfter = (await getJson('deployment', `${RELEASE}-api`, NS))!.spec.template.metadata.annotations['checksum/secret'];
    expect(sumAfter).not.toBe(sumBefore);
    const after = {
      api: (await releasePods('api')).filter(podReady).map((p) => p.metadata.name),
      worker: (await releasePods('worker')).filter(podReady).map((p) => p.metadata.name),
    };
    expect(after.api.length).toBeGreaterThan(0);
    expect(after.worker.length).toBeGreaterThan(0);
    for (const n of after.api) expect(before.api).not.toContain(n);
    for (const n of after.worker) expect(before.worker).not.toContain(n);
    expect(answers.ok).toBeGreaterThan(10);
    expect(answers.bad).toEqual([]);
    // once the old pods (still serving their preStop seconds with the old keys) are gone:
    await waitFor(
      'the old api pods gone',
      async () => (await releasePods('api')).every((p) => !before.api.includes(p.metadata.name)),
      120_000,
      1000,
    );
    // the new keys work, the generated ones of the install are gone
    expect((await http('GET', `${api}/ops/hosts`, { headers: readonly })).body).toEqual({ hosts: ['web-1'] });
  });

  test('a signed GitHub push through the Service: the worker creates the deploy Job, its pod runs to completion, GET /ops/jobs shows completed', async () => {
    const sha = randomBytes(20).toString('hex');
    const body = JSON.stringify({ ref: 'refs/heads/main', after: sha, repository: { full_name: PROJECT } });
    const r = await http('POST', `${api}/webhook/github`, {
      headers: {
        'Content-Type': 'application/json',
        'X-GitHub-Event': 'push',
        'X-GitHub-Delivery': randomUUID(),
        'X-Hub-Signature-256': githubSignature(secrets.githubWebhookSecret, body),
      },
      body,
    });
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ accepted: true, duplicate: false, project: PROJECT });
    const jobId = r.body.job_id as string;
    expect(jobId).toBeTruthy();

    const k8sJob = await waitFor(
      'the deploy Job to succeed',
      async () => {
        const jobs = await list('jobs', DEPLOY);
        return jobs.find((j) => (j.status?.succeeded ?? 0) >= 1);
      },
      180_000,
      1000,
    );
    const jobPods = await pods(DEPLOY, `job-name=${k8sJob.metadata.name}`);
    expect(jobPods.some((p) => p.status.phase === 'Succeeded')).toBe(true);
    const logs = ok(await kubectl(['-n', DEPLOY, 'logs', `job/${k8sJob.metadata.name}`]), 'kubectl logs').stdout;
    expect(logs).toContain(`deploying ${PROJECT} refs/heads/main audit=`);
    expect(k8sJob.spec.template.spec.serviceAccountName).toBe('deployer');

    const done = await jobEnds(jobId, 120_000);
    expect(done).toMatchObject({ id: jobId, name: 'ops_worker.run_deploy_pipeline', state: 'completed' });
  });

  test('POST /ops/restart of a 2-replica Deployment: the worker pod patches it, new pods replace the old ones, the job completes only after the rollout', async () => {
    await waitFor(
      'web available',
      async () => {
        const d = await getJson('deployment', 'web', APPS);
        return d?.status?.availableReplicas === 2 && d.status.updatedReplicas === 2 && d.status.replicas === 2;
      },
      120_000,
    );
    const oldPods = (await pods(APPS, 'app=web')).map((p) => p.metadata.name as string);
    expect(oldPods).toHaveLength(2);

    const id = await restart('web');
    const done = await jobEnds(id, 180_000);
    // observed right when the job reports completion: the rollout is over
    const d = (await getJson('deployment', 'web', APPS))!;
    const now = await pods(APPS, 'app=web');
    expect(done.state).toBe('completed');
    expect(done.progress).toMatchObject({ phase: 'done', message: 'successfully rolled out' });
    expect(d.spec.template.metadata.annotations['kubectl.kubernetes.io/restartedAt']).toBeTruthy();
    expect(d.status).toMatchObject({ replicas: 2, updatedReplicas: 2, availableReplicas: 2 });
    expect(now).toHaveLength(2);
    for (const p of now) {
      expect(oldPods).not.toContain(p.metadata.name);
      expect(podReady(p)).toBe(true);
    }
  });

  test('a Deployment whose new pods cannot start: the job fails with the rollout reason within ROLLOUT_TIMEOUT_SECONDS', async () => {
    const t0 = Date.now();
    const id = await restart('broken');
    const done = await jobEnds(id, (ROLLOUT_TIMEOUT_SECONDS + 60) * 1000);
    expect(done.state).toBe('failed');
    expect(done.failed_reason).toMatch(/exceeded its progress deadline/);
    expect(Date.now() - t0).toBeLessThan(ROLLOUT_TIMEOUT_SECONDS * 1000);
  });

  test('kubectl delete pod of the worker while a restart job is active: the job is recovered and the Deployment restarts once', async () => {
    await waitFor('slow available', async () => (await getJson('deployment', 'slow', APPS))?.status?.availableReplicas === 1, 120_000);
    const rsBefore = (await list('replicasets', APPS, 'app=slow')).length;
    const id = await restart('slow');
    const active = await waitFor(
      'the restart job rolling out',
      async () => {
        const j = await job(id);
        return j.state === 'active' && (j.progress as Obj | null)?.phase === 'rolling_out' ? j : undefined;
      },
      120_000,
    );
    expect(active.attempts_made).toBe(0);
    const restartedAt = (await getJson('deployment', 'slow', APPS))!.spec.template.metadata.annotations[
      'kubectl.kubernetes.io/restartedAt'
    ];
    expect(restartedAt).toBeTruthy();

    const [worker] = (await releasePods('worker')).filter(podReady);
    // one second of grace: the worker cannot finish the ~25 s rollout, so the job must be recovered
    ok(await kubectl(['-n', NS, 'delete', 'pod', worker!.metadata.name, '--grace-period=1', '--wait=true']), 'kubectl delete pod');

    const done = await jobEnds(id, 240_000);
    expect(done.state).toBe('completed');
    const d = (await getJson('deployment', 'slow', APPS))!;
    // the retry reused the first attempt's restartedAt: one restart, one new ReplicaSet
    expect(d.spec.template.metadata.annotations['kubectl.kubernetes.io/restartedAt']).toBe(restartedAt);
    expect((await list('replicasets', APPS, 'app=slow')).length).toBe(rsBefore + 1);
    expect(d.status).toMatchObject({ replicas: 1, updatedReplicas: 1, availableReplicas: 1 });
    const newWorker = (await releasePods('worker')).filter(podReady).map((p) => p.metadata.name);
    expect(newWorker).not.toContain(worker!.metadata.name);
  });

  test('Bull Board through the Service: 200 with the operator key, 403 with the readonly key', async () => {
    const op = await http('GET', `${api}/admin/queues`, { headers: operator });
    expect(op.status).toBe(200);
    expect(op.text).toMatch(/<html/i);
    const ro = await http('GET', `${api}/admin/queues`, { headers: readonly });
    expect(ro.status).toBe(403);
    expect(ro.body.detail).toBeTruthy();
  });

  test('Prometheus scrapes the pods, the worker-down alert reaches /webhook/alerts through Alertmanager, one notify_oncall job; dashboard queries return data', async () => {
    monitoring = await startMonitoring({
      namespace: NS,
      release: RELEASE,
      alertsUrl: `${api}/webhook/alerts`,
      alertsToken: secrets.alertsWebhookToken,
      forOverride: { OpsgateWorkerDown: '20s' },
    });
    await monitoring.waitForTargets(['api', 'worker']);
    const empty = await monitoring.emptyDashboardPanels();
    expect(empty).toEqual([]);

    ok(await kubectl(['-n', NS, 'scale', `deployment/${RELEASE}-worker`, '--replicas=0']), 'scale worker to 0');
    const alert = await monitoring.waitForAlertDelivered('OpsgateWorkerDown', 240_000);
    expect(alert.status).toBe('firing');

    ok(await kubectl(['-n', NS, 'scale', `deployment/${RELEASE}-worker`, '--replicas=1']), 'scale worker to 1');
    const notifyJobs = async (state: string) => {
      const r = await http('GET', `${api}/ops/jobs?state=${state}&limit=100`, { headers: readonly });
      expect(r.status).toBe(200);
      return (r.body.jobs as Obj[]).filter((j) => j.name === 'ops_worker.notify_oncall');
    };
    // the worker, back, runs the notification the API queued while it was down (its log line
    // names the alert and the job: job data is never shown by the API)
    const lines = await waitFor(
      'the worker to run notify_oncall for OpsgateWorkerDown',
      async () => {
        const ps = (await releasePods('worker')).filter(podReady);
        const text = ps.length === 1 ? (await kubectl(['-n', NS, 'logs', ps[0]!.metadata.name])).stdout : '';
        const found = text
          .split('\n')
          .filter((l) => l.includes('"msg":"alert notification"') && l.includes('"alertname":"OpsgateWorkerDown"'));
        return found.length > 0 ? found.map((l) => JSON.parse(l) as Obj) : undefined;
      },
      180_000,
      2000,
    );
    const jobId = String(lines[0]!.job_id);
    expect((await jobEnds(jobId, 60_000)).state).toBe('completed');
    expect((await job(jobId)).name).toBe('ops_worker.notify_oncall');
    // once: one notification for the alert although Alertmanager may send the group again, and no
    // other notify job left waiting behind it
    await waitFor(
      'every notify job run',
      async () => (await Promise.all(['waiting', 'active', 'delayed'].map(notifyJobs))).flat().length === 0,
      60_000,
      1000,
    );
    const ps = (await releasePods('worker')).filter(podReady);
    const logsNow = (await kubectl(['-n', NS, 'logs', ps[0]!.metadata.name])).stdout;
    expect(
      logsNow.split('\n').filter((l) => l.includes('"msg":"alert notification"') && l.includes('"alertname":"OpsgateWorkerDown"')),
    ).toHaveLength(1);
    expect(await notifyJobs('failed')).toEqual([]);
  });

  test('helm uninstall leaves no object of the release behind', async () => {
    ok(await helm(['uninstall', RELEASE, '-n', NS, '--wait', '--timeout', '3m']), 'helm uninstall');
    // the pods of the deleted workloads finish terminating (preStop + drain) on their own
    await waitFor(
      'the release pods gone',
      async () => (await pods(NS, `app.kubernetes.io/instance=${RELEASE}`)).length === 0,
      120_000,
      1000,
    );
    const left = ok(await kubectl(['api-resources', '--verbs=list', '-o', 'name']), 'api-resources')
      .stdout.split('\n')
      .filter(Boolean);
    const leftovers: string[] = [];
    const namespaced = ok(await kubectl(['api-resources', '--verbs=list', '--namespaced=true', '-o', 'name']), 'api-resources')
      .stdout.split('\n')
      .filter(Boolean);
    for (const kind of left) {
      if (kind.startsWith('events')) continue; // Events of the release's pods age out on their own
      const scope = namespaced.includes(kind) ? ['-n', NS] : [];
      const r = await kubectl(['get', kind, ...scope, '-l', `app.kubernetes.io/instance=${RELEASE}`, '-o', 'name']);
      if (r.code === 0 && r.stdout.trim()) leftovers.push(...r.stdout.trim().split('\n'));
    }
    // and nothing named after the release in its namespace (objects without labels, e.g. the Secret)
    for (const kind of ['secret', 'configmap', 'serviceaccount', 'service', 'deployment', 'statefulset', 'pod', 'role', 'rolebinding']) {
      const r = await kubectl(['get', kind, '-n', NS, '-o', 'name']);
      for (const n of r.stdout.trim().split('\n').filter(Boolean))
        if (n.includes(RELEASE) && !n.includes('kube-root-ca')) leftovers.push(n);
    }
    expect(leftovers).toEqual([]);
    expect(ok(await helm(['list', '-n', NS, '-q']), 'helm list').stdout.trim()).toBe('');
  });
});
