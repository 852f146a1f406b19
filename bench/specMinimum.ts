/**
 * The spec-minimum control of `make bench`: what the spec's rules need and nothing
 * else, built from the same libraries as the API: Express 5 + express.json(), `SET NX EX` of the
 * event (24 h) / each fingerprint (300 s) with ioredis, and BullMQ `Queue.add` of the job when
 * the record was new; on a failed add the record is deleted, so the sender's retry is delivered
 * again. No auth, rate limit, metrics, audit log, request id, validation or crash-safety.
 * Listens on 127.0.0.1:$PORT, Redis at $REDIS_URL.
 */
import express from 'express';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';

const redis = new Redis(process.env.REDIS_URL!);
const queue = new Queue('ops', { connection: new Redis(process.env.REDIS_URL!, { maxRetriesPerRequest: null }) });

async function seenThenAdd(key: string, ttl: number, name: string, data: Record<string, unknown>): Promise<boolean> {
  if ((await redis.set(key, '1', 'EX', ttl, 'NX')) !== 'OK') return false;
  try {
    await queue.add(name, data);
  } catch (err) {
    await redis.del(key);
    throw err;
  }
  return true;
}

const app = express();
app.disable('x-powered-by');
const json = express.json({ limit: '2mb' });
app.post('/webhook/scm', json, async (req, res) => {
  const b = req.body as { ref: string; checkout_sha: string; project?: { path_with_namespace?: string } };
  const project = b.project?.path_with_namespace ?? 'unknown';
  const eventId = `scm:${project}:${b.ref}:${b.checkout_sha}`;
  const accepted = await seenThenAdd(`seen:${eventId}`, 86400, 'ops_worker.run_deploy_pipeline', { project, ref: b.ref });
  res.status(202).json({ accepted, duplicate: !accepted, project, event_id: eventId });
});
app.post('/webhook/alerts', json, async (req, res) => {
  const alerts = ((req.body as { alerts?: unknown[] }).alerts ?? []) as Array<{
    status?: string;
    fingerprint?: string;
    labels?: { alertname?: string };
    annotations?: object;
  }>;
  let firing = 0;
  for (const a of alerts) {
    if (a.status !== 'firing') continue;
    firing++;
    if (!a.fingerprint) continue;
    await seenThenAdd(`seen:alert:${a.fingerprint}`, 300, 'ops_worker.notify_oncall', {
      alertname: a.labels?.alertname ?? 'unknown',
      annotations: a.annotations ?? {},
    });
  }
  res.status(202).json({ received: alerts.length, firing });
});
const port = Number(process.env.PORT ?? 0);
const server = app.listen(port, '127.0.0.1', () => {
  process.stdout.write(`spec-minimum listening on ${JSON.stringify(server.address())}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
