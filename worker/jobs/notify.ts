import { UnrecoverableError } from 'bullmq';
import { sha256Hex } from '../../src/shared/crypto.js';
import { IDEMPOTENCY_TTL_SECONDS, type NotifyOncallData } from '../../src/shared/jobs.js';
import { notifyDeliveryKey } from '../../src/shared/keys.js';
import type { JobContext } from '../context.js';
import { abortReason } from '../k8s.js';

/**
 * notify_oncall(alertname, annotations): logs the alert and posts a Slack-compatible JSON message
 * to every NOTIFY_WEBHOOK_URLS endpoint. Per endpoint: 2xx delivered; 408, 429, 5xx, no answer:
 * retried; any other status: rejected for good. Each endpoint's answer is recorded under the job id,
 * so a retry posts only to the others. That is at least once (an answer not recorded is posted
 * again), so every post of a job carries one delivery id (X-Opsgate-Delivery, and `job_id`) for the
 * receiver to drop a repeat. Endpoint URLs often hold a secret in their path: only the host is logged.
 */

type EndpointAnswer = { kind: 'sent' } | { kind: 'rejected'; status: number };

/** host[:port] of an endpoint: the only part of a webhook URL that may be logged. */
function endpointHost(url: string): string {
  try {
    return new URL(url).host;
  } catch {
    return 'invalid-url';
  }
}

export function notifyRecordKey(jobId: string, url: string): string {
  // The URL is hashed: the key must not reveal the secret either (Redis keys show up in tools).
  return notifyDeliveryKey(jobId, sha256Hex(url).slice(0, 32));
}

function summaryOf(annotations: Record<string, unknown>): string | undefined {
  const s = annotations.summary;
  if (s === undefined || s === null) return undefined;
  return typeof s === 'string' ? s : JSON.stringify(s);
}

/**
 * Slack's control characters escaped (https://api.slack.com/reference/surfaces/formatting#escaping),
 * `&` first, so alert text can never ping (`<!channel>`) or render a disguised link (`<https://evil.example|Ack>`).
 */
export function escapeSlack(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

/** Every string inside a JSON value escaped with escapeSlack (keys too); other values as they are. */
function escapeDeep(v: unknown, depth = 0): unknown {
  if (typeof v === 'string') return escapeSlack(v);
  if (depth > 64 || v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map((x) => escapeDeep(x, depth + 1));
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [escapeSlack(k), escapeDeep(x, depth + 1)]));
}

/** The Slack-compatible message; all alert text escaped, the copies a receiver may render too. */
function notificationBody(data: NotifyOncallData, jobId: string): Record<string, unknown> {
  const summary = summaryOf(data.annotations);
  const text = `:rotating_light: Alert firing: ${escapeSlack(data.alertname || 'unknown')}${summary ? ` - ${escapeSlack(summary)}` : ''}`;
  return {
    text,
    alertname: escapeSlack(data.alertname),
    annotations: escapeDeep(data.annotations),
    ...(data.fingerprint ? { fingerprint: escapeSlack(data.fingerprint) } : {}),
    audit_id: data.audit_id,
    job_id: jobId,
  };
}

/** Header naming the delivery: the job id, the same on every attempt and every retry of that job. */
const DELIVERY_HEADER = 'X-Opsgate-Delivery';

function parseOutcome(raw: string | null): EndpointAnswer | undefined {
  if (raw === 'sent') return { kind: 'sent' };
  if (raw?.startsWith('rejected:')) return { kind: 'rejected', status: Number(raw.slice(9)) };
  return undefined;
}

async function postOnce(url: string, body: string, deliveryId: string, timeoutMs: number, jobSignal: AbortSignal): Promise<number> {
  const timeout = AbortSignal.timeout(timeoutMs);
  const signal = AbortSignal.any([jobSignal, timeout]);
  try {
    const res = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'user-agent': 'opsgate-worker', [DELIVERY_HEADER]: deliveryId },
      body,
      redirect: 'manual',
      signal,
    });
    // Drain the body so the connection can be reused; its content is not needed (and not logged).
    await res.arrayBuffer().catch(() => undefined);
    return res.status;
  } catch (err) {
    if (jobSignal.aborted) throw abortReason(jobSignal);
    // The caught error may carry the endpoint's URL, a secret: only a code or an error name goes on.
    // eslint-disable-next-line preserve-caught-error
    if (timeout.aborted) throw new Error(`no answer within ${timeoutMs} ms`);
    const cause = (err as { cause?: { code?: unknown } }).cause;
    // eslint-disable-next-line preserve-caught-error
    throw new Error(typeof cause?.code === 'string' ? cause.code : (err as Error).name);
  }
}

export async function notifyOncall(data: NotifyOncallData, ctx: JobContext): Promise<{ delivered: number; endpoints: number }> {
  const summary = summaryOf(data.annotations);
  ctx.logger.info('alert notification', { alertname: data.alertname, summary: summary ?? null });
  if (ctx.config.NOTIFY_WEBHOOK_URLS.length === 0) {
    ctx.logger.info('no NOTIFY_WEBHOOK_URLS configured; alert logged only', { alertname: data.alertname });
    return { delivered: 0, endpoints: 0 };
  }
  return deliver(notificationBody(data, String(ctx.job.id)), ctx);
}

/** Posts one JSON message to every NOTIFY_WEBHOOK_URLS endpoint with the rules above (report_change's news too). */
export async function deliver(message: Record<string, unknown>, ctx: JobContext): Promise<{ delivered: number; endpoints: number }> {
  const { config, logger, redis, signal } = ctx;
  const urls = config.NOTIFY_WEBHOOK_URLS;
  if (urls.length === 0) return { delivered: 0, endpoints: 0 };
  const jobId = String(ctx.job.id);
  const body = JSON.stringify(message);
  const results = await Promise.all(
    urls.map(async (url) => {
      const host = endpointHost(url);
      const key = notifyRecordKey(jobId, url);
      const earlier = parseOutcome(await redis.get(key));
      if (earlier) {
        logger.info('notification endpoint already handled by an earlier attempt; not posting again', { host, outcome: earlier.kind });
        return { host, outcome: earlier };
      }
      let status: number;
      try {
        status = await postOnce(url, body, jobId, config.NOTIFY_TIMEOUT_MS, signal);
      } catch (err) {
        if (signal.aborted) throw err;
        logger.warn('notification endpoint failed; will retry', { host, reason: (err as Error).message });
        return { host, outcome: undefined, reason: (err as Error).message };
      }
      if (status >= 200 && status < 300) {
        await redis.set(key, 'sent', 'EX', IDEMPOTENCY_TTL_SECONDS);
        logger.info('notification delivered', { host, status });
        return { host, outcome: { kind: 'sent' } as EndpointAnswer };
      }
      if (status === 408 || status === 429 || status >= 500) {
        logger.warn('notification endpoint failed; will retry', { host, status });
        return { host, outcome: undefined, reason: `HTTP ${status}` };
      }
      await redis.set(key, `rejected:${status}`, 'EX', IDEMPOTENCY_TTL_SECONDS);
      logger.error('notification rejected by endpoint; not retried', { host, status });
      return { host, outcome: { kind: 'rejected', status } as EndpointAnswer };
    }),
  );

  const rejected = results.filter((r) => r.outcome?.kind === 'rejected');
  const rejectedList = rejected.map((r) => `${r.host} (HTTP ${r.outcome?.kind === 'rejected' ? r.outcome.status : '?'})`).join(', ');
  const pending = results.filter((r) => r.outcome === undefined);
  // Dead-lettering now (a rejection, or the last attempt)? Forget the rejections so that a retry
  // from Bull Board, once the endpoint is fixed, posts to it again; delivered ones stay recorded.
  const lastAttempt = ctx.job.attemptsMade + 1 >= (ctx.job.opts.attempts ?? 1);
  if (rejected.length > 0 && (pending.length === 0 || lastAttempt)) {
    await Promise.all(urls.filter((_, i) => results[i]?.outcome?.kind === 'rejected').map((u) => redis.del(notifyRecordKey(jobId, u))));
  }
  if (pending.length > 0) {
    // Retryable: the attempt fails and BullMQ retries it; only these endpoints are posted to again.
    const list = pending.map((r) => `${r.host} (${'reason' in r ? r.reason : 'failed'})`).join(', ');
    const also = rejected.length > 0 ? `; rejected by ${rejectedList}` : '';
    throw new Error(`notification not delivered to ${pending.length} of ${urls.length} endpoint(s): ${list}${also}`);
  }
  if (rejected.length > 0) {
    throw new UnrecoverableError(`notification rejected by ${rejected.length} of ${urls.length} endpoint(s): ${rejectedList}`);
  }
  return { delivered: results.length, endpoints: urls.length };
}
