/**
 * The public-API floor of `make bench`: the cheapest intake that keeps the intake's rules with
 * BullMQ's public, documented API and nothing else. Express 5 + express.json(), then
 * - /webhook/scm: one `Queue#add` of the push's job under a new UUID job id, deduplicated by the
 *   event id `scm:<project>:<ref>:<checkout_sha>` for 24 h; accepted when BullMQ answers the job id
 *   it was given (a duplicate answers the job that holds the record);
 * - /webhook/alerts: one `Queue#addBulk` of the firing alerts' jobs, each deduplicated by its
 *   fingerprint for 300 s.
 * The jobs carry the API's job options (src/shared/jobs.ts, the config's default policy), so the
 * floor writes what the API writes. No sender auth, audit line, metrics, rate limit, validation or
 * delivery record. Listens on 127.0.0.1:$PORT, Redis at $REDIS_URL.
 */
import { randomUUID } from 'node:crypto';
import express from 'express';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { JOB, QUEUE_NAME, defaultJobOptions } from '../src/shared/jobs.js';

const PUSH_TTL_MS = 86_400_000;
const ALERT_TTL_MS = 300_000;

const queue = new Queue(QUEUE_NAME, {
  connection: new Redis(process.env.REDIS_URL!, { maxRetriesPerRequest: null }),
  defaultJobOptions: defaultJobOptions({ attempts: 5, backoffMs: 10000 }),
});

const app = express();
app.disable('x-powered-by');
const json = express.json({ limit: '2mb' });
app.post('/webhook/scm', json, async (req, res) => {
  const b = req.body as { ref: string; checkout_sha: string; project?: { path_with_namespace?: string } };
  const project = b.project?.path_with_namespace ?? 'unknown';
  const eventId = `scm:${project}:${b.ref}:${b.checkout_sha}`;
  const jobId = randomUUID();
  const job = await queue.add(
    JOB.runDeployPipeline,
    { project, ref: b.ref, sha: b.checkout_sha, event_id: eventId },
    { jobId, deduplication: { id: eventId, ttl: PUSH_TTL_MS } },
  );
  const accepted = job.id === jobId;
  res.status(202).json({ accepted, duplicate: !accepted, job_id: job.id, event_id: eventId });
});
app.post('/webhook/alerts', json, async (req, res) => {
  const alerts = ((req.body as { alerts?: unknown[] }).alerts ?? []) as Array<{
    status?: string;
    fingerprint?: string;
    labels?: { alertname?: string };
    annotations?: Record<string, string>;
  }>;
  const firing = alerts.filter((a) => a.status === 'firing');
  const jobs = firing
    .filter((a) => a.fingerprint)
    .map((a) => ({
      name: JOB.notifyOncall,
      data: { alertname: a.labels?.alertname ?? 'unknown', annotations: a.annotations ?? {}, fingerprint: a.fingerprint },
      opts: { jobId: randomUUID(), deduplication: { id: `alert:${a.fingerprint}`, ttl: ALERT_TTL_MS } },
    }));
  const added = jobs.length ? await queue.addBulk(jobs) : [];
  const queued = added.filter((j, i) => j.id === jobs[i]!.opts.jobId).length;
  res.status(202).json({ received: alerts.length, firing: firing.length, queued });
});
const port = Number(process.env.PORT ?? 0);
const server = app.listen(port, '127.0.0.1', () => {
  process.stdout.write(`public floor listening on ${JSON.stringify(server.address())}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
