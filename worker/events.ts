import { hostname } from 'node:os';
import { EventsV1Api, V1MicroTime, type KubeConfig, type V1ObjectReference } from '@kubernetes/client-node';
import { sha256Hex } from '../src/shared/crypto.js';
import type { Logger } from '../src/shared/logger.js';
import { apiStatus } from './k8s.js';

/**
 * Kubernetes Events (events.k8s.io/v1) for what the worker does to a cluster object, so
 * `kubectl describe` and every cluster event pipeline show who restarted or deployed what:
 * reason `OpsgateRestart` on the Deployment, `OpsgateDeploy` on the deploy Job, `OpsgateRestartRefused`
 * (Warning) on a Deployment the worker refused to restart. The note carries the principal's key
 * id, the audit id and the queue job id (never a secret: requested_by is a credential id).
 *
 * The Event name derives from the queue job id and reason, so a retried attempt finds its own
 * Event (409) instead of writing a second one. An Event is a record, not the work: failing to
 * write it (e.g. RBAC without `create` on `events`) is logged and the job goes on.
 */
export const REPORTING_CONTROLLER = 'opsgate.io/worker';

export type EventReason = 'OpsgateRestart' | 'OpsgateRestartRefused' | 'OpsgateDeploy';

export interface OpsgateEvent {
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
}

/** The note: "<what> requested by <key id> (audit <id>, job <id>)[: detail]", at most 1 kB as the API requires. */
export function eventNote(e: Pick<OpsgateEvent, 'reason' | 'requestedBy' | 'auditId' | 'queueJobId' | 'detail'>): string {
  const what = e.reason === 'OpsgateDeploy' ? 'deploy' : e.reason === 'OpsgateRestart' ? 'rollout restart' : 'rollout restart refused';
  const note = `${what} requested by ${e.requestedBy} (audit ${e.auditId}, job ${e.queueJobId})${e.detail ? `: ${e.detail}` : ''}`;
  return note.length > 1024 ? `${note.slice(0, 1021)}...` : note;
}

/** Deterministic per queue job and reason: `<object>.opsgate-<12 hex>` (<= 253 chars). */
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
