import { markClosing, reconnectWhenEnded } from '../shared/redisConnection.js';
import { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { createDeadLetters, type ChangeRetry } from './deadLetters.js';
import { createJobReads } from '../shared/jobReads.js';
import { QUEUE_NAME, defaultJobOptions, type JobPolicy } from '../shared/jobs.js';
import { queuePrefix } from '../shared/keys.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import { createProber } from '../shared/probe.js';
import { createProducer } from '../shared/producer.js';
import { createQueueGuard } from '../shared/queueGuard.js';
import { createRedis } from '../shared/redis.js';

/**
 * The API's side of the "ops" queue: one BullMQ Queue on one connection of the `request` profile (no offline queue, one retry,
 * command timeout). Every operation is bounded by `timeoutMs` (default 3000) and fails fast while Redis is down, as a 503 with
 * Retry-After (src/shared/queueGuard.ts).
 */
interface OpsQueueOptions {
  url: string;
  policy: JobPolicy;
  logger?: Logger;
  metrics?: Pick<Metrics, 'jobsEnqueued'>;
  timeoutMs?: number;
}

export type OpsQueue = ReturnType<typeof createOpsQueue>;

export function createOpsQueue(opts: OpsQueueOptions) {
  const connection: Redis = createRedis(opts.url, 'request', 'opsgate-api-queue');
  reconnectWhenEnded(connection, { url: opts.url, ...(opts.logger ? { logger: opts.logger } : {}) });
  const bull = new Queue(QUEUE_NAME, {
    connection,
    prefix: queuePrefix(opts.url),
    defaultJobOptions: defaultJobOptions(opts.policy),
  });
  // Without a listener an 'error' event would crash the process; connection errors surface as 503s.
  bull.on('error', (err) => opts.logger?.debug('queue connection error', { err }));
  const guard = createQueueGuard(connection, opts.timeoutMs ?? 3000, opts.logger);
  const producer = createProducer({ bull, connection, guard, metrics: opts.metrics });
  const probe = createProber({ bull, url: opts.url, producer, guard, ...(opts.logger ? { logger: opts.logger } : {}) });
  return {
    bull,
    producer,
    probe,
    jobs: createJobReads(bull, guard),
    deadLetters: (changeRetry?: ChangeRetry) => createDeadLetters(bull, connection, guard, changeRetry),
    isReady: () => connection.status === 'ready',
    async close(): Promise<void> {
      markClosing(connection);
      await probe.close();
      if (connection.status !== 'ready') {
        // Not connected: nothing is pending, and BullMQ's close would wait for a connection that may never come back.
        connection.disconnect();
        void bull.close().catch(() => undefined);
        return;
      }
      try {
        await bull.close();
      } finally {
        connection.disconnect();
      }
    },
  };
}
