import type { Redis } from 'ioredis';
import { UnprocessableError } from '../shared/errors.js';
import { JOB, notifyOncallData, type NotifyOncallData } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import type { OpsQueue } from '../shared/queue.js';
import { claimAndEnqueue } from './claim.js';
import { seenKey } from './redisOps.js';

/**
 * /webhook/alerts rules 1-4 (Alertmanager payload). Plain values in, counts out.
 *
 * Failure handling (the spec is silent): alerts are processed in order; when enqueueing one
 * fails, its fingerprint's seen record is removed and the failure propagates (503 + Retry-After),
 * so Alertmanager retries the whole batch: alerts already queued are then duplicates (not queued
 * twice), the failed one and the rest are queued. No accepted alert is lost.
 */
export const SEEN_ALERT_TTL_SECONDS = 300;
const MAX_ALERTNAME = 1024;

export interface AlertsDeps {
  redis: Redis;
  queue: Pick<OpsQueue, 'enqueue'>;
  logger: Logger;
}

export interface AlertsOutcome {
  received: number;
  firing: number;
  queued: number;
  duplicates: number;
  /** The seen record and job of each alert queued by this call (REDIS_MIN_REPLICAS_ACK takes them back). */
  claims: Array<{ seenKey: string; jobId: string }>;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

interface Planned {
  fingerprint: string;
  data: NotifyOncallData;
}

/** Rules 1-2 and the job data of every firing alert with a fingerprint (validated before anything is recorded). */
export function planAlerts(payload: unknown, auditId: string, requestedBy: string): { received: number; firing: number; planned: Planned[] } {
  if (!isObject(payload)) throw new UnprocessableError('payload must be a JSON object with an "alerts" array');
  const alerts = payload.alerts;
  if (!Array.isArray(alerts)) throw new UnprocessableError('"alerts" must be an array');
  let firing = 0;
  const planned: Planned[] = [];
  alerts.forEach((a, i) => {
    if (!isObject(a) || a.status !== 'firing') return;
    firing++;
    const fp = a.fingerprint;
    if (typeof fp !== 'string' || fp === '') return; // counted, not queued (spec 2)
    if (fp.length > 256) throw new UnprocessableError(`alerts[${i}].fingerprint is longer than 256 characters`);
    const labels = isObject(a.labels) ? a.labels : {};
    let alertname = typeof labels.alertname === 'string' && labels.alertname !== '' ? labels.alertname : 'unknown';
    if (alertname.length > MAX_ALERTNAME) alertname = alertname.slice(0, MAX_ALERTNAME);
    const annotations = isObject(a.annotations) ? a.annotations : {};
    const data = notifyOncallData.parse({ alertname, annotations, fingerprint: fp, audit_id: auditId, requested_by: requestedBy });
    planned.push({ fingerprint: fp, data });
  });
  return { received: alerts.length, firing, planned };
}

/** Rule 3: per planned alert, SET NX EX 300 on its fingerprint; when recorded, enqueue notify_oncall. */
export async function submitAlerts(deps: AlertsDeps, payload: unknown, auditId: string, requestedBy: string): Promise<AlertsOutcome> {
  const plan = planAlerts(payload, auditId, requestedBy);
  let queued = 0;
  let duplicates = 0;
  const claims: AlertsOutcome['claims'] = [];
  for (const p of plan.planned) {
    let out;
    const key = seenKey(`alert:${p.fingerprint}`);
    try {
      // SET NX + enqueue without a crash window (src/domain/claim.ts); rule 9 is kept there.
      out = await claimAndEnqueue(deps, {
        key,
        ttlSeconds: SEEN_ALERT_TTL_SECONDS,
        name: JOB.notifyOncall,
        data: p.data,
        what: `alert:${p.fingerprint}`,
      });
    } catch (err) {
      deps.logger.warn('alert batch interrupted by a failed enqueue; the sender will retry', {
        queued_before_failure: queued,
        fingerprint: p.fingerprint,
      });
      throw err;
    }
    if (out.accepted) queued++;
    else duplicates++;
    if (out.accepted && out.jobId) claims.push({ seenKey: key, jobId: out.jobId });
  }
  return { received: plan.received, firing: plan.firing, queued, duplicates, claims };
}
