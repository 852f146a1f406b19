import type { Redis } from 'ioredis';
import { createDeliveryLog, type DeliveryLog } from '../../domain/deliveries.js';
import type { Outcome, RunDeployPipelineData } from '../../shared/jobs.js';
import type { Logger } from '../../shared/logger.js';
import { isPushSender } from '../../sources/index.js';

/**
 * The end of a pushed deploy that never ran (`superseded`) or was cancelled (`cancelled`), in its
 * sender's deliveries log (src/domain/deliveries.ts), written by the worker: an entry appended
 * after the push's own, so GET /ops/deliveries shows the push and how its deploy ended together.
 * The log is append-only: the push's `queued` entry stays as the push was answered.
 *
 * A deploy of a sender's push, or of its replay, carries the sender in its data (`source`); a
 * deploy from anywhere else (a CI job, an operator) has no deliveries log and gets no entry.
 * Recording never fails the job: it is sent in the background, a Redis error logged.
 */
export interface DeployEndLog {
  /** Appends the deploy's end when it is a pushed deploy's `superseded` or `cancelled`; never throws, never waits. */
  record(data: Partial<RunDeployPipelineData>, jobId: string, outcome: Outcome): void;
  /** Sends what was recorded (at shutdown). */
  flush(): Promise<void>;
}

export function createDeployEndLog(deps: {
  redis: Redis;
  logger: Logger;
  /** DELIVERIES_KEPT and DELIVERIES_UNVERIFIED_KEPT: the caps the API trims the same streams to. */
  keep: number;
  keepUnverified: number;
}): DeployEndLog {
  const log: DeliveryLog = createDeliveryLog(deps);
  return {
    record(d, jobId, outcome) {
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
    flush: () => log.flush(),
  };
}
