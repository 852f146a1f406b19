import { Queue } from 'bullmq';
import { QUEUE_NAME } from '../src/shared/jobs.js';
import { queueCountsSource, redisMemoryReader, type Metrics } from '../src/shared/metrics.js';
import { queuePrefix } from '../src/shared/keys.js';
import { createRedis } from '../src/shared/redis.js';

/** The queue depth metrics' source in the worker: a read-only Queue on a fail-fast `request`-profile connection. */
export function exportQueueDepth(
  metrics: Pick<Metrics, 'setQueueDepthSources'> & Partial<Pick<Metrics, 'setRedisMemorySource'>>,
  redisUrl: string,
): { close(): Promise<void> } {
  const connection = createRedis(redisUrl, 'request', 'opsgate-queue-depth');
  const queue = new Queue(QUEUE_NAME, { connection, prefix: queuePrefix(redisUrl) });
  queue.on('error', () => {}); // a failed read is counted by opsgate_queue_scrape_errors_total
  metrics.setQueueDepthSources([queueCountsSource(queue)]);
  metrics.setRedisMemorySource?.(redisMemoryReader(connection));
  return {
    async close() {
      metrics.setQueueDepthSources([]);
      metrics.setRedisMemorySource?.(undefined);
      await queue.close().catch(() => {});
      connection.disconnect();
    },
  };
}
