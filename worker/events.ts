import { hostname } from 'node:os';
import { EventsV1Api, V1MicroTime, type KubeConfig, type V1ObjectReference } from '@kubernetes/client-node';
import { sha256Hex } from '../src/shared/crypto.js';
import type { KubeConfigFactory } from '../src/shared/kubeconfig.js';
import type { Logger } from '../src/shared/logger.js';
import { apiStatus, resolveKubeConfig } from './k8s.js';

/**
 * Kubernetes Events (events.k8s.io/v1): who restarted or deployed what, and how it ended, for
 * `kubectl describe` and cluster event pipelines. The note never carries a secret (requested_by is
 * a credential id). An Event is a record, not the work: a failed write is logged and the job goes on.
 */
const REPORTING_CONTROLLER = 'opsgate.io/worker';

/** Each reason and what its note says was done. */
const WHAT = {
  OpsgateRestart: 'rollout restart',
  OpsgateRestartRefused: 'rollout restart refused',
  OpsgateDeploy: 'deploy',
  // How a guarded change ended (worker/report.ts): on the Deployment, or on the deploy Job.
  OpsgateRolledOut: 'rollout restart rolled out',
  OpsgateRolloutFailed: 'rollout restart failed',
  OpsgateDeployed: 'deploy succeeded',
  OpsgateDeployFailed: 'deploy failed',
  OpsgateRestartRejected: 'rollout restart rejected',
  OpsgateRestartExpired: 'rollout restart approval expired',
  // How an alert-driven remediation ended (worker/jobs/remediate.ts), on the Deployment.
  OpsgateRemediated: 'remediation verified: the alert resolved',
  OpsgateRemediationFailed: 'remediation did not clear the alert',
};

export type EventReason = keyof typeof WHAT;

interface OpsgateEvent {
  namespace: string;
  regarding: Required<Pick<V1ObjectReference, 'apiVersion' | 'kind' | 'name' | 'namespace'>> & Pick<V1ObjectReference, 'uid'>;
  reason: EventReason;
  /** events.k8s.io/v1 `action`: what was done (Restart, Create, Refuse). */
  action: string;
  type: 'Normal' | 'Warning';
  queueJobId: string;
  auditId: string;
  requestedBy: string;
  /** Extra text after the standard part (bounded). */
  detail?: string;
  /** Who approved the change (four eyes), when it was approved. */
  approvers?: readonly string[];
}

/** Who asked for a change: the principal, and the owner and credential id where it does not already say them. */
export function describeRequester(d: { requested_by: string; requested_owner?: string; requested_credential?: string }): string {
  const extra = [
    ...(d.requested_owner && d.requested_owner !== d.requested_by ? [`owner ${d.requested_owner}`] : []),
    ...(d.requested_credential && !d.requested_by.includes(d.requested_credential) ? [`credential ${d.requested_credential}`] : []),
  ];
  return extra.length > 0 ? `${d.requested_by} (${extra.join(', ')})` : d.requested_by;
}

/** The note: "<what> requested by <key id> (audit <id>, job <id>)[: detail]", at most 1 kB as the API requires. */
export function eventNote(e: Pick<OpsgateEvent, 'reason' | 'requestedBy' | 'auditId' | 'queueJobId' | 'detail' | 'approvers'>): string {
  const approved = e.approvers && e.approvers.length > 0 ? `, approved by ${e.approvers.join(', ')}` : '';
  const note = `${WHAT[e.reason]} requested by ${e.requestedBy}${approved} (audit ${e.auditId}, job ${e.queueJobId})${e.detail ? `: ${e.detail}` : ''}`;
  return note.length > 1024 ? `${note.slice(0, 1021)}...` : note;
}

/** Deterministic per queue job and reason, so a retried attempt finds its own Event (409): `<object>.opsgate-<12 hex>`. */
export function eventName(e: Pick<OpsgateEvent, 'regarding' | 'reason' | 'queueJobId'>): string {
  return `${e.regarding.name.slice(0, 200)}.opsgate-${sha256Hex(`${e.reason}\n${e.queueJobId}`).slice(0, 12)}`;
}

export async function recordEvent(kc: KubeConfig, e: OpsgateEvent, logger: Logger): Promise<boolean> {
  const name = eventName(e);
  try {
    await kc.makeApiClient(EventsV1Api).createNamespacedEvent({
      namespace: e.namespace,
      body: {
        apiVersion: 'events.k8s.io/v1',
        kind: 'Event',
        metadata: { name, namespace: e.namespace, labels: { 'app.kubernetes.io/managed-by': 'opsgate' } },
        eventTime: new V1MicroTime(),
        reportingController: REPORTING_CONTROLLER,
        reportingInstance: `opsgate-worker-${hostname()}`.slice(0, 128),
        action: e.action,
        reason: e.reason,
        type: e.type,
        regarding: { ...e.regarding },
        note: eventNote(e),
      },
    });
    return true;
  } catch (err) {
    if (apiStatus(err) === 409) return true; // an earlier attempt of this job wrote it
    logger.warn('could not record the Kubernetes Event', {
      reason: e.reason,
      event: `${e.namespace}/${name}`,
      status: apiStatus(err) ?? null,
    });
    return false;
  }
}

/** recordEvent for a job without a Kubernetes client of its own: without a configuration it logs that it wrote none. */
export async function recordEventResolving(factory: KubeConfigFactory, e: OpsgateEvent, logger: Logger): Promise<boolean> {
  const kc = await resolveKubeConfig(factory).catch((err: unknown) => {
    logger.warn('no Kubernetes Event: no Kubernetes configuration', { reason: e.reason, err: (err as Error).message });
  });
  return kc ? recordEvent(kc, e, logger) : false;
}
