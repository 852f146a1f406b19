import { QueueEvents, type Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { QUEUE_NAME, type JobName } from './jobs.js';
import type { Logger } from './logger.js';
import type { AddRequest, Producer } from './producer.js';
import type { QueueGuard } from './queueGuard.js';
import { createRedis } from './redis.js';

/**
 * A job whose answer the API waits for, within a bound: a dry run, rehearsed by the worker with its own Kubernetes identity
 * (the API holds none of its rights). Too late: the job is taken back when no worker has started it.
 */
type ProbeResult = { state: 'completed'; value: unknown } | { state: 'failed'; reason: string } | { state: 'timeout' };

export interface Prober {
  run<N extends JobName>(req: AddRequest<N>, timeoutMs: number): Promise<ProbeResult & { jobId: string }>;
  close(): Promise<void>;
}

export function createProber(deps: { bull: Queue; url: string; producer: Producer; guard: QueueGuard; logger?: Logger }): Prober {
  let events: { qe: QueueEvents; connection: Redis } | undefined;
  let opening: Promise<QueueEvents> | undefined;
  const open = (): Promise<QueueEvents> =>
    (opening ??= (async () => {
      const connection = createRedis(deps.url, 'blocking', 'opsgate-api-events');
      const qe = new QueueEvents(QUEUE_NAME, { connection, prefix: deps.bull.opts.prefix });
      qe.on('error', (err) => deps.logger?.debug('queue events connection error', { err }));
      events = { qe, connection };
      await qe.waitUntilReady();
      return qe;
    })().catch((err: unknown) => {
      opening = undefined;
      throw err;
    }));
  return {
    async run(req, timeoutMs) {
      const qe = await deps.guard('read', open);
      const { jobId } = await deps.producer.add(req);
      const job = await deps.guard('read', () => deps.bull.getJob(jobId));
      if (job) {
        try {
          return { state: 'completed', value: await job.waitUntilFinished(qe, timeoutMs), jobId };
        } catch {
          // A failure and a timeout both reject: the job's state tells them apart.
        }
      }
      const state = await deps.guard('read', () => deps.bull.getJobState(jobId));
      if (state === 'completed' || state === 'failed') {
        const done = await deps.guard('read', () => deps.bull.getJob(jobId));
        if (state === 'completed') return { state, value: done?.returnvalue, jobId };
        return { state, reason: String(done?.failedReason ?? 'failed'), jobId };
      }
      await deps.producer.remove(jobId).catch(() => false);
      return { state: 'timeout', jobId };
    },
    async close() {
      if (!events) return;
      const { qe, connection } = events;
      events = undefined;
      opening = undefined;
      await qe.close().catch(() => undefined);
      connection.disconnect();
    },
  };
}
