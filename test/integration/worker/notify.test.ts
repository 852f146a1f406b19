import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { IDEMPOTENCY_TTL_SECONDS, JOB, QUEUE_NAME, defaultJobOptions } from '../../../src/shared/jobs.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { startWorker, type WorkerHandle } from '../../../worker/index.js';
import { notifyRecordKey } from '../../../worker/jobs/notify.js';
import {
  audit,
  collectLogs,
  metricValue,
  startReceiver,
  testMetrics,
  waitForFinal,
  workerConfig,
  type LogCollector,
  type Receiver,
} from '../../helpers/workerSupport.js';

/**
 * notify_oncall end to end: a real BullMQ queue on a real redis-server, the real worker
 * (startWorker, in-process) and a real local HTTP endpoint standing in for the chat/paging webhook.
 */
let redis: RedisServer;
let receiver: Receiver;
let queue: Queue;
let inspect: Redis;
let handle: WorkerHandle | undefined;
let seq = 0;

beforeAll(async () => {
  redis = await startRedis();
  receiver = await startReceiver();
  queue = new Queue(QUEUE_NAME, { connection: { url: redis.url }, defaultJobOptions: defaultJobOptions({ attempts: 3, backoffMs: 100 }) });
  inspect = new Redis(redis.url);
});

afterEach(async () => {
  await handle?.close(2000);
  handle = undefined;
});

afterAll(async () => {
  await queue.close();
  inspect.disconnect();
  await receiver.close();
  await redis.destroy();
});

/** A fresh secret-looking endpoint path per test: Slack-style URLs carry their token in the path. */
function endpoint(label: string): { path: string; url: string; secret: string } {
  const secret = `S3cr3tT0ken${label}${++seq}xyz`;
  const path = `/services/T0001/B0002/${secret}`;
  return { path, url: receiver.url(path), secret };
}

async function start(env: Record<string, string>, logs: LogCollector, metrics = testMetrics()) {
  handle = await startWorker(workerConfig({ REDIS_URL: redis.url, ...env }), {
    logger: logs.logger,
    metrics,
    inventory: { hosts: {}, projects: {}, remediations: [] },
  });
  return metrics;
}

describe('notify_oncall', () => {
  it('logs alertname and summary and posts a Slack-compatible message; the URL token is never logged', async () => {
    const ep = endpoint('ok');
    const logs = collectLogs();
    const metrics = await start({ NOTIFY_WEBHOOK_URLS: ep.url }, logs);
    const job = await queue.add(JOB.notifyOncall, {
      alertname: 'DiskFull',
      annotations: { summary: 'disk / is 97% full on db-1', runbook: 'https://runbooks/disk' },
      fingerprint: 'fp-1',
      ...audit,
    });

    const { state, job: done } = await waitForFinal(queue, job.id!);
    expect(state).toBe('completed');
    expect(done.returnvalue).toEqual({ delivered: 1, endpoints: 1 });

    const [req] = receiver.requests(ep.path);
    expect(receiver.requests(ep.path)).toHaveLength(1);
    expect(req!.method).toBe('POST');
    expect(req!.headers['content-type']).toBe('application/json');
    const body = JSON.parse(req!.body) as Record<string, unknown>;
    expect(body.text).toEqual(expect.stringContaining('DiskFull'));
    expect(body.text).toEqual(expect.stringContaining('disk / is 97% full on db-1'));
    expect(body.alertname).toBe('DiskFull');
    expect(body.annotations).toEqual({ summary: 'disk / is 97% full on db-1', runbook: 'https://runbooks/disk' });

    const logged = logs.find('alert notification');
    expect(logged).toHaveLength(1);
    expect(logged[0]).toMatchObject({ alertname: 'DiskFull', summary: 'disk / is 97% full on db-1', job_id: job.id });
    expect(logs.find('notification delivered')[0]).toMatchObject({ host: `127.0.0.1:${receiver.port}`, status: 200 });
    // The logger here has no redaction: the code itself must never write the URL or its token.
    expect(logs.lines.join('\n')).not.toContain(ep.secret);
    expect(await metricValue(metrics, 'opsgate_jobs_processed_total', { name: JOB.notifyOncall, outcome: 'completed' })).toBe(1);
    expect(await metricValue(metrics, 'opsgate_job_duration_seconds', { name: JOB.notifyOncall, outcome: 'completed' })).toBe(1);
  });

  it('completes with log-only delivery when no endpoint is configured', async () => {
    const logs = collectLogs();
    await start({}, logs);
    const job = await queue.add(JOB.notifyOncall, { alertname: 'NoSummary', annotations: {}, ...audit });
    const { state, job: done } = await waitForFinal(queue, job.id!);
    expect(state).toBe('completed');
    expect(done.returnvalue).toEqual({ delivered: 0, endpoints: 0 });
    expect(logs.find('alert notification')[0]).toMatchObject({ alertname: 'NoSummary', summary: null });
  });

  it('retries after a 5xx answer and then succeeds (one retry counted)', async () => {
    const ep = endpoint('retry');
    receiver.script(ep.path, [{ status: 500 }, { status: 200 }]);
    const logs = collectLogs();
    const metrics = await start({ NOTIFY_WEBHOOK_URLS: ep.url }, logs);
    const job = await queue.add(JOB.notifyOncall, { alertname: 'Flaky', annotations: { summary: 's' }, ...audit });

    const { state, job: done } = await waitForFinal(queue, job.id!);
    expect(state).toBe('completed');
    expect(done.attemptsMade).toBe(2);
    expect(receiver.requests(ep.path)).toHaveLength(2);
    expect(logs.find('job attempt failed; will retry')[0]).toMatchObject({ job_id: job.id, attempt: 1 });
    expect(await metricValue(metrics, 'opsgate_job_retries_total', { name: JOB.notifyOncall })).toBe(1);
    expect(await metricValue(metrics, 'opsgate_jobs_processed_total', { name: JOB.notifyOncall, outcome: 'completed' })).toBe(1);
    expect(logs.lines.join('\n')).not.toContain(ep.secret);
  });

  it('dead-letters at once on a 4xx answer, with the reason and without the URL token', async () => {
    const ep = endpoint('reject');
    receiver.script(ep.path, [{ status: 400 }]);
    const logs = collectLogs();
    const metrics = await start({ NOTIFY_WEBHOOK_URLS: ep.url }, logs);
    const job = await queue.add(JOB.notifyOncall, { alertname: 'Bad', annotations: {}, ...audit });

    const { state, job: failed } = await waitForFinal(queue, job.id!);
    expect(state).toBe('failed');
    expect(failed.attemptsMade).toBe(1); // 3 allowed, none retried
    expect(failed.failedReason).toBe(`notification rejected by 1 of 1 endpoint(s): 127.0.0.1:${receiver.port} (HTTP 400)`);
    expect(failed.failedReason).not.toContain(ep.secret);
    expect(receiver.requests(ep.path)).toHaveLength(1);
    expect((await queue.getFailed()).map((j) => j.id)).toContain(job.id);
    expect(logs.find('job dead-lettered')[0]).toMatchObject({ job_id: job.id, reason: failed.failedReason });
    expect(await metricValue(metrics, 'opsgate_jobs_processed_total', { name: JOB.notifyOncall, outcome: 'dead_lettered' })).toBe(1);
    expect(await metricValue(metrics, 'opsgate_job_retries_total', { name: JOB.notifyOncall })).toBe(0);
    expect(logs.lines.join('\n')).not.toContain(ep.secret);
  });

  it('after a partial failure, the retry posts only to the endpoint that failed', async () => {
    const good = endpoint('good');
    const flaky = endpoint('flaky');
    receiver.script(good.path, [{ status: 200 }]);
    receiver.script(flaky.path, [{ status: 502 }, { status: 200 }]);
    const logs = collectLogs();
    await start({ NOTIFY_WEBHOOK_URLS: `${good.url},${flaky.url}` }, logs);
    const job = await queue.add(JOB.notifyOncall, { alertname: 'Partial', annotations: { summary: 'x' }, ...audit });

    const { state, job: done } = await waitForFinal(queue, job.id!);
    expect(state).toBe('completed');
    expect(done.attemptsMade).toBe(2);
    expect(receiver.requests(good.path)).toHaveLength(1); // not paged twice
    expect(receiver.requests(flaky.path)).toHaveLength(2);
    expect(await inspect.get(notifyRecordKey(job.id!, good.url))).toBe('sent');
    expect(await inspect.get(notifyRecordKey(job.id!, flaky.url))).toBe('sent');
    // Kept as long as the completed job, not longer (IDEMPOTENCY_TTL_SECONDS).
    const ttl = await inspect.ttl(notifyRecordKey(job.id!, good.url));
    expect(ttl).toBeGreaterThan(IDEMPOTENCY_TTL_SECONDS - 60);
    expect(ttl).toBeLessThanOrEqual(IDEMPOTENCY_TTL_SECONDS);
    expect(defaultJobOptions({ attempts: 1, backoffMs: 0 }).removeOnComplete.age).toBe(IDEMPOTENCY_TTL_SECONDS);
    expect(logs.find('notification endpoint already handled by an earlier attempt; not posting again')).toHaveLength(1);
  });

  it('keeps retrying the failed endpoint while a rejecting one stays rejected, then dead-letters with both reasons', async () => {
    const rejecting = endpoint('rej2');
    const down = endpoint('down2');
    receiver.script(rejecting.path, [{ status: 404 }]);
    receiver.script(down.path, [{ status: 503 }]);
    const logs = collectLogs();
    await start({ NOTIFY_WEBHOOK_URLS: `${rejecting.url},${down.url}` }, logs);
    const job = await queue.add(JOB.notifyOncall, { alertname: 'Mixed', annotations: {}, ...audit });

    const { state, job: failed } = await waitForFinal(queue, job.id!);
    expect(state).toBe('failed');
    expect(failed.attemptsMade).toBe(3);
    expect(receiver.requests(rejecting.path)).toHaveLength(1);
    expect(receiver.requests(down.path)).toHaveLength(3);
    expect(failed.failedReason).toBe(
      `notification not delivered to 1 of 2 endpoint(s): 127.0.0.1:${receiver.port} (HTTP 503); rejected by 127.0.0.1:${receiver.port} (HTTP 404)`,
    );
  });
});

describe('retries, dead-letter and timeout', () => {
  it('exhausted retries: the job stays in the failed set with its reason, every attempt was made', async () => {
    const ep = endpoint('down');
    receiver.script(ep.path, [{ status: 503 }]);
    const logs = collectLogs();
    const metrics = await start({ NOTIFY_WEBHOOK_URLS: ep.url }, logs);
    const job = await queue.add(JOB.notifyOncall, { alertname: 'Down', annotations: {}, ...audit });

    const { state, job: failed } = await waitForFinal(queue, job.id!);
    expect(state).toBe('failed');
    expect(failed.attemptsMade).toBe(3);
    expect(failed.failedReason).toBe(`notification not delivered to 1 of 1 endpoint(s): 127.0.0.1:${receiver.port} (HTTP 503)`);
    expect(receiver.requests(ep.path)).toHaveLength(3);
    // Nothing dropped: still in the failed set, data intact, retryable.
    const inFailed = (await queue.getFailed()).find((j) => j.id === job.id);
    expect(inFailed?.data).toMatchObject({ alertname: 'Down' });
    expect(logs.find('job dead-lettered')).toHaveLength(1);
    expect(logs.find('job attempt failed; will retry')).toHaveLength(2);
    expect(await metricValue(metrics, 'opsgate_jobs_processed_total', { name: JOB.notifyOncall, outcome: 'dead_lettered' })).toBe(1);
    expect(await metricValue(metrics, 'opsgate_jobs_processed_total', { name: JOB.notifyOncall, outcome: 'retried' })).toBe(2);
    expect(await metricValue(metrics, 'opsgate_job_retries_total', { name: JOB.notifyOncall })).toBe(2);

    // A dead-lettered job can be retried (what Bull Board's "retry" does) and then succeeds.
    receiver.script(ep.path, [{ status: 200 }]);
    await inFailed!.retry('failed');
    const again = await waitForFinal(queue, job.id!);
    expect(again.state).toBe('completed');
  });

  it('enforces JOB_TIMEOUT_SECONDS: a handler outliving it fails the attempt ("timed out after 1s"), is aborted, and is retried', async () => {
    const ep = endpoint('slow');
    receiver.script(ep.path, [{ status: 200, delayMs: 8000 }]);
    const logs = collectLogs();
    const metrics = await start({ NOTIFY_WEBHOOK_URLS: ep.url, JOB_TIMEOUT_SECONDS: '1', NOTIFY_TIMEOUT_MS: '30000' }, logs);
    const startedAt = Date.now();
    const job = await queue.add(
      JOB.notifyOncall,
      { alertname: 'Slow', annotations: {}, ...audit },
      { attempts: 2, backoff: { type: 'fixed', delay: 50 } },
    );

    const { state, job: failed } = await waitForFinal(queue, job.id!);
    expect(state).toBe('failed');
    expect(failed.failedReason).toBe('timed out after 1s');
    expect(failed.attemptsMade).toBe(2); // the timeout is an ordinary failure: retried per policy
    // Both attempts were cut at ~1 s each, well before the receiver's 8 s answer.
    expect(Date.now() - startedAt).toBeLessThan(7500);
    const reqs = await receiver.waitForRequests(ep.path, 2);
    // The handler's AbortSignal reached the HTTP request: the worker hung up on the slow endpoint.
    await new Promise((r) => setTimeout(r, 200));
    expect(reqs.every((r) => r.aborted)).toBe(true);
    expect(await metricValue(metrics, 'opsgate_job_retries_total', { name: JOB.notifyOncall })).toBe(1);
  });

  it('dead-letters at once a job with invalid data or an unknown name (no retries)', async () => {
    const logs = collectLogs();
    const metrics = await start({}, logs);
    const bad = await queue.add(JOB.notifyOncall, { alertname: 42, annotations: 'nope', ...audit });
    const unknown = await queue.add('ops_worker.rm_rf', { path: '/' });
    const noAudit = await queue.add(JOB.notifyOncall, { alertname: 'x', annotations: {} });

    const a = await waitForFinal(queue, bad.id!);
    expect(a.state).toBe('failed');
    expect(a.job.attemptsMade).toBe(1);
    expect(a.job.failedReason).toMatch(/^invalid job data at alertname: /);

    const b = await waitForFinal(queue, unknown.id!);
    expect(b.state).toBe('failed');
    expect(b.job.attemptsMade).toBe(1);
    expect(b.job.failedReason).toBe('unknown job name "ops_worker.rm_rf"');

    const c = await waitForFinal(queue, noAudit.id!);
    expect(c.state).toBe('failed');
    expect(c.job.failedReason).toMatch(/^invalid job data at audit_id: /);

    expect(await metricValue(metrics, 'opsgate_jobs_processed_total', { outcome: 'dead_lettered' })).toBe(3);
    expect(await metricValue(metrics, 'opsgate_job_retries_total', {})).toBe(0);
  });

  it('job names outside the catalogue are counted as name="unknown", never as their own label', async () => {
    const logs = collectLogs();
    const metrics = await start({}, logs);
    const ids: string[] = [];
    for (const name of ['x2', '', 'ops_worker.notify_oncall ', '{evil="1"}'])
      ids.push((await queue.add(name, { alertname: 'x', annotations: {}, ...audit })).id!);
    for (const id of ids) expect((await waitForFinal(queue, id)).state).toBe('failed');
    expect(await metricValue(metrics, 'opsgate_jobs_processed_total', { name: 'unknown', outcome: 'dead_lettered' })).toBe(4);
    const text = await metrics.registry.metrics();
    const names = new Set([...text.matchAll(/name="([^"]*)"/g)].map((m) => m[1]));
    expect([...names].sort()).toEqual(['unknown']);
  });

  it('escapes &, < and > in every text sent to the chat endpoint: no <!channel> ping, no disguised link', async () => {
    const ep = endpoint('escape');
    const logs = collectLogs();
    await start({ NOTIFY_WEBHOOK_URLS: ep.url }, logs);
    const job = await queue.add(JOB.notifyOncall, {
      alertname: '<!channel> DiskFull & more',
      annotations: { summary: '<https://evil.example|Click to ack>', description: 'x > y <@U024BE7LH>', nested: { list: ['<!here>'] } },
      fingerprint: 'fp<&>',
      ...audit,
    });
    expect((await waitForFinal(queue, job.id!)).state).toBe('completed');
    const [req] = receiver.requests(ep.path);
    // Nothing Slack would interpret as a control sequence anywhere in what was posted.
    expect(req!.body).not.toMatch(/[<>]/);
    expect(req!.body).not.toMatch(/&(?!amp;|lt;|gt;)/);
    const body = JSON.parse(req!.body) as { text: string; alertname: string; annotations: Record<string, unknown>; fingerprint: string };
    expect(body.text).toBe(
      ':rotating_light: Alert firing: &lt;!channel&gt; DiskFull &amp; more - &lt;https://evil.example|Click to ack&gt;',
    );
    expect(body.alertname).toBe('&lt;!channel&gt; DiskFull &amp; more');
    expect(body.annotations).toEqual({
      summary: '&lt;https://evil.example|Click to ack&gt;',
      description: 'x &gt; y &lt;@U024BE7LH&gt;',
      nested: { list: ['&lt;!here&gt;'] },
    });
    expect(body.fingerprint).toBe('fp&lt;&amp;&gt;');
    // The log keeps the alert as received (it is not chat markup).
    expect(logs.find('alert notification')[0]).toMatchObject({
      alertname: '<!channel> DiskFull & more',
      summary: '<https://evil.example|Click to ack>',
    });
  });
});
