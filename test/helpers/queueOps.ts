import type { OpsQueue } from '../../src/api/queue.js';
import type { JobDataByName, JobName } from '../../src/shared/jobs.js';

/** Adds one job through the API's producer (validated as the API adds it); answers its id. */
export async function enqueue<N extends JobName>(
  queue: Pick<OpsQueue, 'producer'>,
  name: N,
  data: JobDataByName[N],
  opts: { jobId?: string; deduplication?: { id: string; ttlMs?: number } } = {},
): Promise<string> {
  return (await queue.producer.add({ name, data, ...opts })).jobId;
}

/**
 * The Redis key of a BullMQ deduplication record, for assertions on its lifetime (the contract's
 * 24 h and 300 s) that BullMQ's API does not expose; the product never writes or reads it.
 */
export const dedupKey = (queue: Pick<OpsQueue, 'bull'>, id: string): string => `${queue.bull.toKey('de')}:${id}`;

/** Every key but the deliveries log's (which records refused deliveries too): what a delivery left of the intake's state. */
export async function stateKeys(inspect: { keys(pattern: string): Promise<string[]> }): Promise<string[]> {
  return (await inspect.keys('*')).filter((k) => !k.startsWith('opsgate:deliveries:')).sort();
}
