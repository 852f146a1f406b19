import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, expect, test } from '@jest/globals';
import { Queue } from 'bullmq';
import { JOB, QUEUE_NAME, defaultJobOptions } from '../../../src/shared/jobs.js';
import { startWorkerProcess, type OpsProcess } from '../../helpers/processes.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { workerEnv } from '../../helpers/reliability.js';

/**
 * notify_oncall is at-least-once, so every post names its delivery for the receiver to drop a
 * repeat: the real worker process, a real redis-server and a real HTTP receiver on 127.0.0.1 that
 * answers the first post 500 (the attempt fails and is retried) and the second 200. Both posts
 * carry the same X-Opsgate-Delivery header, and the body carries the job id.
 */
let redis: RedisServer;
let worker: OpsProcess;
let receiver: Server;
let queue: Queue;
const posts: Array<{ headers: IncomingHttpHeaders; body: Record<string, unknown> }> = [];

beforeAll(async () => {
  redis = await startRedis();
  receiver = createServer((req, res) => {
    let text = '';
    req.on('data', (c: Buffer) => (text += c.toString()));
    req.on('end', () => {
      posts.push({ headers: req.headers, body: JSON.parse(text) as Record<string, unknown> });
      res.writeHead(posts.length === 1 ? 500 : 200, { 'Content-Type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', () => r()));
  const url = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hooks/oncall`;
  worker = await startWorkerProcess({ env: await workerEnv(redis.url, { NOTIFY_WEBHOOK_URLS: url }) });
  queue = new Queue(QUEUE_NAME, { connection: { url: redis.url }, defaultJobOptions: defaultJobOptions({ attempts: 3, backoffMs: 100 }) });
}, 60_000);

afterAll(async () => {
  await queue?.close();
  await worker?.stop();
  await new Promise((r) => receiver?.close(r));
  await redis?.destroy();
});

test('a retried notification carries the same X-Opsgate-Delivery header, and the job id in its body', async () => {
  const job = await queue.add(JOB.notifyOncall, {
    alertname: 'DiskFull',
    annotations: { summary: 'disk full' },
    fingerprint: 'fp-1',
    audit_id: 'req-1',
    requested_by: 'webhook:alerts',
  });
  const deadline = Date.now() + 30_000;
  while ((await job.getState()) !== 'completed' && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  expect(await job.getState()).toBe('completed');
  expect(posts).toHaveLength(2);
  const [first, second] = posts as [(typeof posts)[0], (typeof posts)[0]];
  expect(first.headers['x-opsgate-delivery']).toBe(String(job.id));
  expect(second.headers['x-opsgate-delivery']).toBe(first.headers['x-opsgate-delivery']);
  expect(first.body.job_id).toBe(String(job.id));
  expect(second.body).toEqual(first.body);
  expect(first.body).toMatchObject({ alertname: 'DiskFull', fingerprint: 'fp-1', audit_id: 'req-1' });
});
