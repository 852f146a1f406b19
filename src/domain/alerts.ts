import type { Redis } from 'ioredis';
import type { DeferredRateHit } from '../shared/rateLimit.js';
import { PayloadTooLargeError, UnprocessableError } from '../shared/errors.js';
import { JOB, notifyOncallData, type NotifyOncallData } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import type { OpsQueue } from '../shared/queue.js';
import { claimAndEnqueueMany } from './claim.js';
import { alertSeenKey } from '../shared/keys.js';

/**
 * /webhook/alerts rules 1-4 (Alertmanager payload). Plain values in, counts out.
 *
 * One payload costs one script call per 250 fingerprints, each claiming its alerts and adding
 * their jobs in one step (src/domain/claim.ts): one Redis round trip, two when the payload needs
 * more than one call (the first carries the request's rate-limit hit and is answered first).
 *
 * Failure handling (the spec is silent): an alert is recorded together with its job or not at
 * all; when a call fails the failure propagates (503 + Retry-After), so Alertmanager retries the
 * whole batch: alerts already queued are then duplicates (not queued twice), the others are
 * queued. No accepted alert is lost.
 *
 * Size: more than `maxAlerts` alerts in one payload -> 413, nothing recorded or queued
 * (ALERTS_MAX_PER_REQUEST; Alertmanager's receiver option `max_alerts` keeps it below).
 */
export const SEEN_ALERT_TTL_SECONDS = 300;
export const DEFAULT_MAX_ALERTS = 1000;
const MAX_ALERTNAME = 1024;

export interface AlertsDeps {
  redis: Redis;
  queue: Pick<OpsQueue, 'intake'>;
  logger: Logger;
}

export interface AlertsOutcome {
  received: number;
  firing: number;
  queued: number;
  duplicates: number;
  /** The ids of the jobs this payload queued (new ones only), in payload order. */
  jobIds: string[];
  /** The seen keys and job of each alert queued by this call (REDIS_MIN_REPLICAS_ACK takes them back). */
  claims: Array<{ jobId: string; keys: string[] }>;
}

export interface AlertsOptions {
  /** ALERTS_MAX_PER_REQUEST. */
  maxAlerts?: number;
  rateHit?: DeferredRateHit;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

interface Planned {
  fingerprint: string;
  data: NotifyOncallData;
}

/** Rules 1-2 and the job data of every firing alert with a fingerprint (validated before anything is recorded). */
export function planAlerts(
  payload: unknown,
  auditId: string,
  requestedBy: string,
  maxAlerts = DEFAULT_MAX_ALERTS,
): { received: number; firing: number; planned: Planned[] } {
  if (!isObject(payload)) throw new UnprocessableError('payload must be a JSON object with an "alerts" array');
  const alerts = payload.alerts;
  if (!Array.isArray(alerts)) throw new UnprocessableError('"alerts" must be an array');
  if (alerts.length > maxAlerts) {
    throw new PayloadTooLargeError(
      `payload has ${alerts.length} alerts; at most ${maxAlerts} are accepted per request (ALERTS_MAX_PER_REQUEST; set max_alerts in the Alertmanager receiver)`,
    );
  }
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

/** Rule 3: per planned alert, SET NX EX 300 on its fingerprint; when recorded, enqueue notify_oncall (in the same step). */
export async function submitAlerts(
  deps: AlertsDeps,
  payload: unknown,
  auditId: string,
  requestedBy: string,
  opts: AlertsOptions = {},
): Promise<AlertsOutcome> {
  const plan = planAlerts(payload, auditId, requestedBy, opts.maxAlerts);
  if (plan.planned.length === 0) return { received: plan.received, firing: plan.firing, queued: 0, duplicates: 0, jobIds: [], claims: [] };
  const outs = await claimAndEnqueueMany(
    deps,
    plan.planned.map((p) => ({
      key: alertSeenKey(p.fingerprint),
      ttlSeconds: SEEN_ALERT_TTL_SECONDS,
      name: JOB.notifyOncall,
      data: p.data,
      what: `alert:${p.fingerprint}`,
    })),
    { rateHit: opts.rateHit },
  );
  const claims = outs.filter((o) => o.accepted && o.jobId).map((o) => ({ jobId: o.jobId!, keys: o.keys ?? [] }));
  const jobIds = claims.map((c) => c.jobId);
  return { received: plan.received, firing: plan.firing, queued: jobIds.length, duplicates: outs.length - jobIds.length, jobIds, claims };
}
