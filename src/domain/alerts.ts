import { PayloadTooLargeError, UnprocessableError } from '../shared/errors.js';
import { JOB, parseJobData, type NotifyOncallData } from '../shared/jobs.js';
import type { Intake } from './intake.js';

/**
 * The Alertmanager payload: firing alerts with a fingerprint become notify_oncall jobs, each
 * fingerprint at most once per 300 s, in one addBulk. An alert is recorded with its job or not at
 * all; a failure is a 503, and Alertmanager's retry of the batch queues only what is missing.
 */
const DEFAULT_MAX_ALERTS = 1000;
const MAX_ALERTNAME = 1024;

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

interface Planned {
  fingerprint: string;
  data: NotifyOncallData;
}

/** The payload's firing alerts, and the job data of each with a fingerprint, validated before anything is recorded. */
export function planAlerts(payload: unknown, auditId: string, requestedBy: string, maxAlerts = DEFAULT_MAX_ALERTS) {
  if (!isObject(payload)) throw new UnprocessableError('payload must be a JSON object with an "alerts" array', 'invalid_alerts');
  const alerts = payload.alerts;
  if (!Array.isArray(alerts)) throw new UnprocessableError('"alerts" must be an array', 'invalid_alerts');
  if (alerts.length > maxAlerts) {
    throw new PayloadTooLargeError(
      `payload has ${alerts.length} alerts; at most ${maxAlerts} are accepted per request (ALERTS_MAX_PER_REQUEST; set max_alerts in the Alertmanager receiver)`,
      'too_many_alerts',
    );
  }
  let firing = 0;
  const planned: Planned[] = [];
  alerts.forEach((a, i) => {
    if (!isObject(a) || a.status !== 'firing') return;
    firing++;
    const fp = a.fingerprint;
    if (typeof fp !== 'string' || fp === '') return; // a firing alert without a fingerprint: counted, not queued
    if (fp.length > 256) throw new UnprocessableError(`alerts[${i}].fingerprint is longer than 256 characters`, 'invalid_payload');
    const labels = isObject(a.labels) ? a.labels : {};
    let alertname = typeof labels.alertname === 'string' && labels.alertname !== '' ? labels.alertname : 'unknown';
    if (alertname.length > MAX_ALERTNAME) alertname = alertname.slice(0, MAX_ALERTNAME);
    const annotations = isObject(a.annotations) ? a.annotations : {};
    const parsed = parseJobData(JOB.notifyOncall, {
      alertname,
      annotations,
      fingerprint: fp,
      audit_id: auditId,
      requested_by: requestedBy,
    });
    if (!parsed.success) throw parsed.error;
    planned.push({ fingerprint: fp, data: parsed.data });
  });
  return { received: alerts.length, firing, planned };
}

/** `maxAlerts`: ALERTS_MAX_PER_REQUEST (more: 413, nothing queued; Alertmanager's `max_alerts` keeps below it). */
export async function submitAlerts(
  intake: Pick<Intake, 'alerts'>,
  payload: unknown,
  auditId: string,
  requestedBy: string,
  opts: { maxAlerts?: number } = {},
) {
  const plan = planAlerts(payload, auditId, requestedBy, opts.maxAlerts);
  const outs = await intake.alerts(plan.planned);
  // What this call wrote (REDIS_MIN_REPLICAS_ACK takes it back), and its new jobs in payload order.
  const written = outs.flatMap((o) => (o.written ? [o.written] : []));
  const jobIds = written.map((w) => w.jobId);
  return { received: plan.received, firing: plan.firing, queued: jobIds.length, duplicates: outs.length - jobIds.length, jobIds, written };
}
