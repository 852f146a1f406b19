import type { Redis } from 'ioredis';
import { createDeliveryLog } from '../../domain/deliveries.js';
import type { Outcome, RunDeployPipelineData } from '../../shared/jobs.js';
import type { Logger } from '../../shared/logger.js';
import { isPushSender } from '../../sources/index.js';

/**
 * A pushed deploy's end when superseded or cancelled, appended to its sender's deliveries log (append-only: the push's
 * own entry stays as it was answered). Only a deploy carrying a sender (`source`) has a log. `record` never throws
 * nor waits: the entry is sent in the background (`flush` at shutdown).
 */
export type DeployEndLog = ReturnType<typeof createDeployEndLog>;

export function createDeployEndLog(deps: {
  redis: Redis;
  logger: Logger;
  /** DELIVERIES_KEPT and DELIVERIES_UNVERIFIED_KEPT: the caps the API trims the same streams to. */
  keep: number;
  keepUnverified: number;
}) {
  const log = createDeliveryLog(deps);
  return {
    record(d: Partial<RunDeployPipelineData>, jobId: string, outcome: Outcome): void {
      const result = outcome.result;
      if (!d.source || !(result === 'superseded' || result === 'cancelled') || !isPushSender(d.source)) return;
      log.record({
        source: d.source,
        verdict: result,
        // What the push was answered when its deploy was queued.
        status: 202,
        ...(outcome.reason ? { detail: outcome.reason } : {}),
        jobId,
        ...(d.delivery_id ? { deliveryId: d.delivery_id } : {}),
        ...(d.project && d.ref && d.sha && d.event_id ? { push: { project: d.project, ref: d.ref, sha: d.sha, eventId: d.event_id } } : {}),
        // The request that pushed it: its audit id, the API's request id.
        ...(d.audit_id ? { requestId: d.audit_id } : {}),
      });
    },
    flush: (): Promise<void> => log.flush(),
  };
}
