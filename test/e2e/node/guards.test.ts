import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { credentialId } from '../../../src/shared/crypto.js';
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

/**
 * Guarded changes end to end on the real node (hack/node.sh), with the chart installed from the
 * images `make images` built: the worker pod's own ServiceAccount answers dry runs (the Deployment's
 * resourceVersion does not move; a Deployment its Role no longer covers is refused by RBAC, and the
 * answer says so); an approved restart rolls out for real; a deploy held by a freeze runs once the
 * freeze is lifted; a rollout whose pods cannot start fails past its progressDeadlineSeconds and is
 * reported as failed to a real HTTP receiver this test runs on the node's bridge address, where the
 * worker pod posts its notifications.
 */
jest.setTimeout(600_000);

const RELEASE = 'opsgate-guards';
const NS = 'grd';
const APPS = 'grd-apps';
const DEPLOY = 'grd-deploy';
const PROJECT = 'group/guarded';
const ORDERED = 'group/ordered';
const NODE_IP = process.env.NODE_IP ?? '10.244.0.1';

const secrets = {
  apiKeys: [
    { key: `grd-readonly-${randomBytes(12).toString('hex')}`, role: 'readonly' },
    { key: `grd-operator-${randomBytes(12).toString('hex')}`, role: 'operator' },
    { key: `grd-approver-${randomBytes(12).toString('hex')}`, role: 'operator' },
  ],
  bearerToken: `grd-bearer-${randomBytes(16).toString('hex')}`,
  githubWebhookSecret: `grd-github-${randomBytes(16).toString('hex')}`,
};
const [READONLY_KEY, OPERATOR_KEY, APPROVER_KEY] = secrets.apiKeys.map((k) => k.key) as [string, string, string];
const readonly = { 'X-API-Key': READONLY_KEY };
const bearer = { Authorization: `Bearer ${secrets.bearerToken}` };
const json = { 'Content-Type': 'application/json' };

/** The notification endpoint: a plain HTTP server on the bridge address, which the pods reach. */
interface Received {
  headers: IncomingMessage['headers'];
  body: Obj;
}
let receiver: Server;
const received: Received[] = [];

function deployment(
  name: string,
  opts: { replicas: number; image: string; progressDeadlineSeconds?: number; pullPolicy?: string; minReadySeconds?: number },
) {
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

let api = '';

async function job(id: string): Promise<Obj> {
  const r = await http('GET', `${api}/ops/jobs/${encodeURIComponent(id)}`, { headers: readonly });
  expect(r.status).toBe(200);
  return r.body;
}

/** A signed GitHub push of `project`'s main at `sha`, as GitHub delivers it. */
function githubPush(project: string, sha: string) {
  const body = JSON.stringify({ ref: 'refs/heads/main', after: sha, repository: { full_name: project } });
  return http('POST', `${api}/webhook/github`, {
    headers: {
      ...json,
      'X-GitHub-Event': 'push',
      'X-GitHub-Delivery': randomUUID(),
      'X-Hub-Signature-256': githubSignature(secrets.githubWebhookSecret, body),
    },
    body,
  });
}

const jobEnds = (id: string, timeoutMs: number) =>
  waitFor(
    `job ${id} to end`,
    async () => {
      const j = await job(id);
      return j.state === 'completed' || j.state === 'failed' ? j : undefined;
    },
    timeoutMs,
    1000,
  );

async function opsgateEvents(name: string, reason: string): Promise<Obj[]> {
  const r = ok(await kubectl(['get', 'events.events.k8s.io', '-n', APPS, '-o', 'json']), 'kubectl get events');
  return (JSON.parse(r.stdout).items as Obj[]).filter((e) => e.regarding?.name === name && e.reason === reason);
}

describe('guarded changes on a real node', () => {
  beforeAll(async () => {
    for (const ns of [NS, APPS, DEPLOY])
      await waitFor(`namespace ${ns} gone`, async () => !(await getJson('namespace', ns)), 120_000, 1000);
    receiver = createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        try {
          received.push({ headers: req.headers, body: JSON.parse(body) as Obj });
        } catch {
          received.push({ headers: req.headers, body: {} });
        }
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
      });
    });
    await new Promise<void>((resolve) => receiver.listen(0, NODE_IP, resolve));
    const hook = `http://${NODE_IP}:${(receiver.address() as AddressInfo).port}/hook`;

    for (const ns of [APPS, DEPLOY]) ok(await kubectl(['create', 'namespace', ns]), `create namespace ${ns}`);
    ok(await kubectl(['-n', DEPLOY, 'create', 'serviceaccount', 'deployer']), 'create serviceaccount');
    await apply(deployment('web', { replicas: 1, image: PAUSE_IMAGE }));
    await apply(deployment('pay', { replicas: 2, image: PAUSE_IMAGE, minReadySeconds: 2 }));
    await apply(deployment('uncovered', { replicas: 1, image: PAUSE_IMAGE }));
    // its pods can never start: the image is on no node and may not be pulled
    await apply(
      deployment('broken', { replicas: 1, image: 'localhost/opsgate-missing:1', pullPolicy: 'Never', progressDeadlineSeconds: 10 }),
    );

    const values = {
      secrets: { ...secrets, notifyWebhookUrls: hook },
      config: { rolloutTimeoutSeconds: 180, publicUrl: 'https://opsgate.example.com' },
      inventory: {
        hosts: {
          'web-1': { namespace: APPS, deployments: ['web', 'uncovered', 'broken'] },
          'pay-1': { namespace: APPS, deployments: ['pay'], policy: { approval: { required: 1, ttl: '1h' } } },
        },
        projects: {
          [PROJECT]: {
            namespace: DEPLOY,
            serviceAccountName: 'deployer',
            image: TESTTOOLS_IMAGE,
            command: ['sh', '-c'],
            args: ['echo "deploying $OPSGATE_PROJECT $OPSGATE_REF"'],
            activeDeadlineSeconds: 300,
          },
          // Deploys of one group in order: each Job prints its commit and takes 10 s.
          [ORDERED]: {
            namespace: DEPLOY,
            serviceAccountName: 'deployer',
            image: TESTTOOLS_IMAGE,
            command: ['sh', '-c'],
            args: ['echo "deploying $OPSGATE_COMMIT_SHA"; sleep 10'],
            activeDeadlineSeconds: 300,
          },
        },
      },
    };
    const file = join(mkdtempSync(join(tmpdir(), 'opsgate-e2e-guards-')), 'values.yaml');
    writeFileSync(file, stringify(values), { mode: 0o600 });
    const t0 = Date.now();
    ok(
      await helm(['install', RELEASE, CHART, '-n', NS, '--create-namespace', '-f', LOCAL_IMAGES, '-f', file, '--wait', '--timeout', '6m']),
      'helm install --wait',
    );
    process.stderr.write(`[e2e guards] helm install --wait: ${Date.now() - t0} ms\n`);
    api = await serviceUrl(`${RELEASE}-api`, NS);
    // An operator narrows the worker's rights by hand: its Role no longer names "uncovered".
    ok(
      await kubectl([
        '-n',
        APPS,
        'patch',
        'role',
        `${RELEASE}-worker`,
        '--type=json',
        '-p',
        JSON.stringify([{ op: 'replace', path: '/rules/0/resourceNames', value: ['broken', 'pay', 'web'] }]),
      ]),
      'narrow the worker Role',
    );
    for (const d of ['web', 'pay']) {
      await waitFor(
        `${d} available`,
        async () => {
          const dep = await getJson('deployment', d, APPS);
          return (dep?.status?.availableReplicas ?? 0) >= (dep?.spec?.replicas ?? 1);
        },
        180_000,
        1000,
      );
    }
  });

  afterAll(async () => {
    await helm(['uninstall', RELEASE, '-n', NS, '--ignore-not-found', '--wait', '--timeout', '2m']);
    for (const ns of [NS, APPS, DEPLOY]) await kubectl(['delete', 'namespace', ns, '--ignore-not-found', '--wait=false']);
    receiver?.closeAllConnections();
    await new Promise((r) => receiver?.close(r));
  });

  test('a dry run leaves the Deployment untouched (resourceVersion); a Deployment the worker Role does not cover is refused by RBAC, and the answer says so', async () => {
    const before = (await getJson('deployment', 'web', APPS))!;
    const r = await http('POST', `${api}/ops/restart?host=web-1&service=web&dry_run=true`, { headers: bearer, timeoutMs: 30_000 });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({
      dry_run: true,
      would: 'queue',
      kubernetes: {
        checked: true,
        identity: `system:serviceaccount:${NS}:${RELEASE}-worker`,
        admitted: true,
        object: { kind: 'Deployment', name: 'web', found: true, resource_version: before.metadata.resourceVersion, replicas: 1 },
      },
    });
    const after = (await getJson('deployment', 'web', APPS))!;
    expect(after.metadata.resourceVersion).toBe(before.metadata.resourceVersion);
    expect(after.spec.template.metadata.annotations?.['kubectl.kubernetes.io/restartedAt']).toBeUndefined();
    expect(after.metadata.generation).toBe(before.metadata.generation);

    const denied = await http('POST', `${api}/ops/restart?host=web-1&service=uncovered&dry_run=true`, {
      headers: bearer,
      timeoutMs: 30_000,
    });
    expect(denied.status).toBe(200);
    expect(denied.body.kubernetes).toMatchObject({ checked: true, admitted: false, refused_by: 'rbac', status: 403 });
    expect(denied.body.kubernetes.message).toMatch(/cannot patch resource "deployments"/);
  });

  test('an approved restart rolls out: 202 pending, approved by another operator, new pods, outcome rolled_out, the approver in the Event and the report', async () => {
    const oldPods = (await list('pods', APPS, 'app=pay')).map((p) => p.metadata.name as string);
    const asked = await http('POST', `${api}/ops/restart?host=pay-1&service=pay&reason=memory%20leak`, {
      headers: { 'X-API-Key': OPERATOR_KEY },
    });
    expect(asked.status).toBe(202);
    const id = asked.body.approval_id as string;
    await waitFor(
      'the approval request notified',
      async () => received.find((p) => p.body.event === 'approval_requested' && p.body.approval_id === id),
      120_000,
      500,
    );
    // the requester cannot approve their own restart
    const self = await http('POST', `${api}/ops/approvals/${id}/approve`, {
      headers: { 'X-API-Key': OPERATOR_KEY, ...json },
      body: '{"reason":"me"}',
    });
    expect(self.status).toBe(403);
    const approved = await http('POST', `${api}/ops/approvals/${id}/approve`, {
      headers: { 'X-API-Key': APPROVER_KEY, ...json },
      body: JSON.stringify({ reason: 'dashboards agree' }),
    });
    expect(approved.body).toMatchObject({ status: 'approved', job_id: id });
    const done = await jobEnds(id, 240_000);
    expect(done).toMatchObject({ state: 'completed', outcome: { result: 'rolled_out', duration_s: expect.any(Number) } });
    // At `rolled_out` the last old pod may still be terminating (it has a deletionTimestamp and is
    // listed until the kubelet ends it): the ready pods are all new, and the old ones then go.
    const now = (await list('pods', APPS, 'app=pay')).filter(podReady);
    expect(now).toHaveLength(2);
    for (const p of now) expect(oldPods).not.toContain(p.metadata.name);
    await waitFor(
      'the old pods gone',
      async () => !(await list('pods', APPS, 'app=pay')).some((p) => oldPods.includes(p.metadata.name as string)),
      120_000,
      1000,
    );
    const approver = `key:${credentialId(APPROVER_KEY)}`;
    const [restartEvent] = await opsgateEvents('pay', 'OpsgateRestart');
    expect(restartEvent?.note).toContain(`approved by ${approver}`);
    expect(await opsgateEvents('pay', 'OpsgateRolledOut')).toHaveLength(1);
    const report = await waitFor(
      'the outcome report',
      async () => received.find((p) => p.body.event === 'outcome' && p.body.job_id === id),
      120_000,
      500,
    );
    expect(report.body).toMatchObject({
      approvers: [approver],
      requester: `key:${credentialId(OPERATOR_KEY)}`,
      outcome: { result: 'rolled_out' },
    });
  });

  test('a deploy held by a freeze runs when the freeze is lifted', async () => {
    const declared = await http('POST', `${api}/ops/freezes`, {
      headers: { 'X-API-Key': OPERATOR_KEY, ...json },
      body: JSON.stringify({ scope: 'project', project: PROJECT, reason: 'e2e release freeze', duration: '2h' }),
    });
    expect(declared.status).toBe(201);
    const pushed = await githubPush(PROJECT, randomBytes(20).toString('hex'));
    expect(pushed.status).toBe(202);
    expect(pushed.body).toMatchObject({ accepted: true, status: 'held', held_until: declared.body.ends_at });
    const id = pushed.body.job_id as string;
    expect(await job(id)).toMatchObject({ state: 'held', hold: { reasons: [{ guard: 'freeze', freeze_id: declared.body.id }] } });
    expect((await http('GET', `${api}/ops/holds`, { headers: readonly })).body.holds.map((h: Obj) => h.job_id)).toContain(id);
    expect(await list('jobs', DEPLOY)).toEqual([]);

    const lifted = await http('DELETE', `${api}/ops/freezes/${declared.body.id}`, {
      headers: { 'X-API-Key': OPERATOR_KEY, ...json },
      body: JSON.stringify({ reason: 'release signed off' }),
    });
    expect(lifted.body).toMatchObject({ lifted: true, released: [id] });
    const done = await jobEnds(id, 240_000);
    expect(done).toMatchObject({ state: 'completed', outcome: { result: 'rolled_out' } });
    const k8sJobs = await list('jobs', DEPLOY);
    expect(k8sJobs).toHaveLength(1);
    expect(k8sJobs[0]!.status.succeeded).toBe(1);
  });

  test('a rollout whose pods cannot start fails past its progressDeadlineSeconds and is reported as failed to the HTTP receiver', async () => {
    const r = await http('POST', `${api}/ops/restart?host=web-1&service=broken`, { headers: bearer });
    expect(r.status).toBe(200);
    const id = r.body.job_id as string;
    const done = await jobEnds(id, 240_000);
    expect(done).toMatchObject({ state: 'failed', outcome: { result: 'progress_deadline_exceeded' } });
    const report = await waitFor(
      'the failure report',
      async () => received.find((p) => p.body.event === 'outcome' && p.body.job_id === id),
      120_000,
      500,
    );
    expect(report.headers['x-opsgate-delivery']).toBe(`report.${id}.outcome`);
    expect(report.body).toMatchObject({
      change: 'restart',
      host: 'web-1',
      service: 'broken',
      namespace: APPS,
      job_id: id,
      requester: `bearer:${credentialId(secrets.bearerToken)}`,
      approvers: [],
      outcome: { result: 'progress_deadline_exceeded', reason: expect.stringContaining('progress deadline') },
      duration_s: expect.any(Number),
    });
    expect(report.body.text).toMatch(/^:checkered_flag: Progress deadline exceeded in [0-9.]+ s: restart of Deployment grd-apps\/broken/);
    expect(await opsgateEvents('broken', 'OpsgateRolloutFailed')).toHaveLength(1);
  });
  test('three pushes of one project within a second: one deploy Job at a time, and the last to finish carries the newest commit', async () => {
    const shas = [0, 1, 2].map(() => randomBytes(20).toString('hex'));
    const ids: string[] = [];
    for (const sha of shas) {
      const pushed = await githubPush(ORDERED, sha);
      expect(pushed.status).toBe(202);
      expect(pushed.body).toMatchObject({ accepted: true });
      ids.push(pushed.body.job_id as string);
    }
    const ends = [];
    for (const id of ids) ends.push(await jobEnds(id, 240_000));
    // The newest ran; an older one ran before it started, or ended superseded without a Job.
    expect(ends[2]).toMatchObject({ state: 'completed', outcome: { result: 'rolled_out' } });
    for (const e of ends.slice(0, 2)) expect(['rolled_out', 'superseded']).toContain(e.outcome?.result);

    const sha = (j: Obj) =>
      ((j.spec.template.spec.containers[0].env ?? []) as Obj[]).find((v) => v.name === 'OPSGATE_COMMIT_SHA')?.value as string;
    const runs = (await list('jobs', DEPLOY))
      .filter((j) => shas.includes(sha(j)))
      .map((j) => ({ sha: sha(j), start: Date.parse(j.status.startTime), end: Date.parse(j.status.completionTime) }))
      .sort((a, b) => a.start - b.start);
    expect(runs.length).toBe(ends.filter((e) => e.outcome?.result === 'rolled_out').length);
    for (const r of runs) expect(Number.isFinite(r.end)).toBe(true);
    // Never two at once: each Job starts after the one before it completed (times in whole seconds).
    for (let i = 1; i < runs.length; i++) expect(runs[i]!.start).toBeGreaterThanOrEqual(runs[i - 1]!.end);
    expect(runs.at(-1)!.sha).toBe(shas[2]);
  });

  test('a rollback deploys the commit of the succeeded deploy before the current one, as GET /ops/deploys lists it, and GET /ops/projects says so', async () => {
    const succeeded = async (): Promise<Obj[]> => {
      const r = await http('GET', `${api}/ops/deploys?project=${encodeURIComponent(ORDERED)}&state=succeeded&limit=100`, {
        headers: readonly,
      });
      expect(r.status).toBe(200);
      return r.body.deploys as Obj[];
    };
    let listed = await succeeded();
    if (!listed.slice(1).some((d) => d.commit !== listed[0]!.commit)) {
      // Only the newest of the pushes above ran: one more push gives the history a commit before the current one.
      const pushed = await githubPush(ORDERED, randomBytes(20).toString('hex'));
      expect(pushed.status).toBe(202);
      expect(await jobEnds(pushed.body.job_id as string, 240_000)).toMatchObject({ outcome: { result: 'rolled_out' } });
      listed = await succeeded();
    }
    const [current, ...older] = listed;
    const target = older.find((d) => d.commit !== current!.commit)!;
    expect(target).toBeDefined();

    const asked = await http('POST', `${api}/ops/deploys/rollback`, {
      headers: { 'X-API-Key': OPERATOR_KEY, ...json },
      body: JSON.stringify({ project: ORDERED, ref: current!.ref, reason: 'node e2e: back to the deploy before' }),
    });
    expect(asked.status).toBe(202);
    expect(asked.body).toMatchObject({ sha: target.commit, rolled_back_from: current!.id, rolled_back_to: target.id });
    const id = asked.body.job_id as string;
    expect(await jobEnds(id, 240_000)).toMatchObject({ state: 'completed', outcome: { result: 'rolled_out' } });

    // The Job the kubelet ran carries the target's commit and says it is a rollback.
    const env = (j: Obj) => Object.fromEntries(((j.spec.template.spec.containers[0].env ?? []) as Obj[]).map((v) => [v.name, v.value]));
    const ran = (await list('jobs', DEPLOY)).filter((j) => env(j).OPSGATE_ROLLBACK === 'true');
    expect(ran.map((j) => env(j).OPSGATE_COMMIT_SHA)).toContain(target.commit);

    const entry = await http('GET', `${api}/ops/deploys/${encodeURIComponent(id)}`, { headers: readonly });
    expect(entry.body).toMatchObject({ origin: 'rollback', commit: target.commit, state: 'succeeded', rolled_back_from: current!.id });
    const newest = await http('GET', `${api}/ops/deploys?project=${encodeURIComponent(ORDERED)}&limit=1`, { headers: readonly });
    expect(newest.body.deploys[0]).toMatchObject({ id, origin: 'rollback' });
    const project = await http('GET', `${api}/ops/projects/${encodeURIComponent(ORDERED)}`, { headers: readonly });
    expect(project.status).toBe(200);
    expect(JSON.stringify(project.body)).toContain(target.commit);
    const ref = (project.body.refs as Obj[]).find((r) => r.ref === current!.ref)!;
    expect(ref.current).toMatchObject({ id, commit: target.commit });
  });
});
