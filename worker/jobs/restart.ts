import { AppsV1Api, PatchStrategy, setHeaderOptions, type V1Deployment } from '@kubernetes/client-node';
import { UnrecoverableError } from 'bullmq';
import { findHost } from '../../src/shared/inventory.js';
import { IDEMPOTENCY_TTL_SECONDS, type RestartServiceData } from '../../src/shared/jobs.js';
import { restartedAtKey } from '../../src/shared/keys.js';
import type { JobContext } from '../context.js';
import { describeRequester, recordEvent, type EventReason } from '../events.js';
import { k8sFailure, resolveKubeConfig, rfc3339, sleep } from '../k8s.js';
import { ChangeFailedError, isFinal } from '../report.js';

/**
 * restart_service(host, service): `kubectl rollout restart` (a strategic-merge patch of the
 * template's restartedAt annotation), then a wait for the rollout like `kubectl rollout status`.
 * The restartedAt value is kept in Redis per job id and reused by retries: the same patch again
 * is a no-op, so a retried job never restarts the Deployment twice. A paused Deployment is
 * refused as kubectl refuses it; ProgressDeadlineExceeded fails at once (waiting cannot help).
 * Each step is a Kubernetes Event on the Deployment (worker/events.ts).
 */
export const RESTARTED_AT_ANNOTATION = 'kubectl.kubernetes.io/restartedAt';

/** kubectl's refusal (`kubectl rollout restart` of a paused Deployment), with the namespace. */
export function pausedReason(namespace: string, name: string): string {
  return `deployments.apps "${name}" (namespace ${namespace}) can't restart paused deployment (run rollout resume first)`;
}

/** The end of a restart of a Deployment scaled to 0: said plainly, reached as soon as the controller saw the new template. */
export const SCALED_TO_ZERO =
  'successfully rolled out, but scaled to 0 replicas: no pod was restarted (the new template applies when it is scaled up)';

interface RolloutState {
  done: boolean;
  /** Why it is not done yet (or failed), kubectl-style. */
  message: string;
  /** The rollout can no longer succeed by waiting (ProgressDeadlineExceeded). */
  failed?: boolean;
  desired: number;
  updated: number;
  available: number;
}

/** kubectl's DeploymentStatusViewer logic. */
export function rolloutState(d: V1Deployment): RolloutState {
  const desired = d.spec?.replicas ?? 1;
  const st = d.status ?? {};
  const updated = st.updatedReplicas ?? 0;
  const available = st.availableReplicas ?? 0;
  const replicas = st.replicas ?? 0;
  const base = { desired, updated, available };
  const generation = d.metadata?.generation ?? 0;
  const notDone = (message: string): RolloutState => ({ ...base, done: false, message });
  if ((st.observedGeneration ?? 0) < generation) return notDone('waiting for the deployment spec update to be observed');
  const progressing = st.conditions?.find((c) => c.type === 'Progressing');
  if (progressing?.reason === 'ProgressDeadlineExceeded') {
    return { ...base, done: false, failed: true, message: 'rollout exceeded its progress deadline' };
  }
  if (updated < desired) return notDone(`${updated} of ${desired} updated replicas are available`);
  if (replicas > updated) return notDone(`${replicas - updated} old replicas are pending termination`);
  if (available < updated) return notDone(`${available} of ${updated} updated replicas are available`);
  if (desired === 0) return { ...base, done: true, message: SCALED_TO_ZERO };
  return { ...base, done: true, message: 'successfully rolled out' };
}

export async function restartService(
  data: RestartServiceData,
  ctx: JobContext,
): Promise<{ namespace: string; deployment: string; restartedAt: string; replicas?: 0; note?: string }> {
  const { config, logger, redis, signal } = ctx;
  const entry = findHost(ctx.inventory, data.host);
  if (!entry) throw new UnrecoverableError(`host ${JSON.stringify(data.host)} is not in the inventory`);
  if (!entry.deployments.includes(data.service)) {
    throw new UnrecoverableError(
      `service ${JSON.stringify(data.service)} is not a Deployment of host ${JSON.stringify(data.host)} in the inventory`,
    );
  }
  const namespace = entry.namespace;
  const name = data.service;
  const what = `Deployment ${namespace}/${name}`;
  const kc = await resolveKubeConfig(ctx.kubeConfig);
  const apps = kc.makeApiClient(AppsV1Api);
  const jobId = String(ctx.job.id);
  const ACTION: Partial<Record<EventReason, string>> = {
    OpsgateRestart: 'Restart',
    OpsgateRolledOut: 'RolledOut',
    OpsgateRolloutFailed: 'Fail',
  };
  const event = (
    reason: 'OpsgateRestart' | 'OpsgateRestartRefused' | 'OpsgateRolledOut' | 'OpsgateRolloutFailed',
    d: V1Deployment | undefined,
    detail?: string,
  ) =>
    recordEvent(
      kc,
      {
        namespace,
        regarding: { apiVersion: 'apps/v1', kind: 'Deployment', name, namespace, uid: d?.metadata?.uid },
        reason,
        action: ACTION[reason] ?? 'Refuse',
        type: reason === 'OpsgateRestart' || reason === 'OpsgateRolledOut' ? 'Normal' : 'Warning',
        queueJobId: jobId,
        auditId: data.audit_id,
        requestedBy: describeRequester(data),
        ...(data.approvers ? { approvers: data.approvers } : {}),
        detail: [detail, data.override ? `gate overridden by ${data.override.by}: ${data.override.reason}` : undefined]
          .filter(Boolean)
          .join('; '),
      },
      logger,
    );
  const started = Date.now();

  // What kubectl checks before it patches: a paused Deployment is refused, with kubectl's words.
  let current: V1Deployment;
  try {
    current = await apps.readNamespacedDeployment({ name, namespace });
  } catch (err) {
    throw k8sFailure(err, what, 'read');
  }
  if (current.spec?.paused) {
    const reason = pausedReason(namespace, name);
    await event('OpsgateRestartRefused', current, reason);
    throw new UnrecoverableError(reason);
  }

  // One restartedAt per job: the first attempt chooses it, retries reuse it.
  const key = restartedAtKey(jobId);
  await redis.set(key, rfc3339(new Date()), 'EX', IDEMPOTENCY_TTL_SECONDS, 'NX');
  const restartedAt = (await redis.get(key)) ?? rfc3339(new Date());

  await ctx.job.updateProgress({ phase: 'patching', namespace, deployment: name });
  let patched: V1Deployment;
  try {
    patched = await apps.patchNamespacedDeployment(
      {
        name,
        namespace,
        fieldManager: 'opsgate',
        body: { spec: { template: { metadata: { annotations: { [RESTARTED_AT_ANNOTATION]: restartedAt } } } } },
      },
      setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch),
    );
  } catch (err) {
    throw k8sFailure(err, what, 'patch');
  }
  logger.info('deployment restart requested', { namespace, deployment: name, restarted_at: restartedAt });
  await event(
    'OpsgateRestart',
    patched,
    (patched.spec?.replicas ?? 1) === 0
      ? `restartedAt ${restartedAt}; scaled to 0 replicas, no pod restarted`
      : `restartedAt ${restartedAt}`,
  );

  const deadline = Date.now() + config.ROLLOUT_TIMEOUT_SECONDS * 1000;
  let last: RolloutState | undefined;
  let lastSeen: V1Deployment = patched;
  try {
    for (;;) {
      let d: V1Deployment;
      try {
        d = await apps.readNamespacedDeployment({ name, namespace });
      } catch (err) {
        throw k8sFailure(err, what, 'read');
      }
      lastSeen = d;
      // Paused while we wait: the rollout cannot progress until someone resumes it.
      if (d.spec?.paused) throw new UnrecoverableError(`${pausedReason(namespace, name)}; it was paused during the rollout`);
      const state = rolloutState(d);
      if (!last || state.message !== last.message) {
        await ctx.job.updateProgress({ phase: state.done ? 'done' : 'rolling_out', namespace, deployment: name, ...state });
        logger.info('rollout status', { namespace, deployment: name, status: state.message });
      }
      last = state;
      if (state.done) break;
      if (state.failed) {
        throw new ChangeFailedError(
          `${what}: ${state.message} (progressDeadlineSeconds ${d.spec?.progressDeadlineSeconds ?? 600})`,
          'progress_deadline_exceeded',
        );
      }
      if (Date.now() + config.ROLLOUT_POLL_INTERVAL_MS > deadline) {
        throw new Error(`${what}: rollout did not finish within ${config.ROLLOUT_TIMEOUT_SECONDS}s (${state.message})`);
      }
      await sleep(config.ROLLOUT_POLL_INTERVAL_MS, signal);
    }
  } catch (err) {
    if (isFinal(err, ctx)) await event('OpsgateRolloutFailed', lastSeen, (err as Error).message);
    throw err;
  }
  const seconds = Math.round((Date.now() - started) / 100) / 10;
  await event('OpsgateRolledOut', lastSeen, `${last?.message ?? 'successfully rolled out'} in ${seconds} s`);
  return { namespace, deployment: name, restartedAt, ...(last?.desired === 0 ? { replicas: 0 as const, note: SCALED_TO_ZERO } : {}) };
}
