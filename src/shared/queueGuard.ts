import { ReplyError, type Redis } from 'ioredis';
import { QueueUnavailableError, type QueueOperation } from './errors.js';
import type { Logger } from './logger.js';
import { withTimeout } from './timeout.js';

/**
 * One queue operation: refused at once while the connection is down (BullMQ would wait for it), bounded, any failure a 503.
 * Only a reply error means nothing ran; anything else leaves its fate unknown: `mayHaveLanded`.
 */
export type QueueGuard = <T>(operation: QueueOperation, op: () => Promise<T>) => Promise<T>;

export function createQueueGuard(connection: Redis, timeoutMs: number, logger?: Logger): QueueGuard {
  return async (operation, op) => {
    if (connection.status !== 'ready') throw new QueueUnavailableError(operation);
    try {
      return await withTimeout(op(), timeoutMs, 'queue operation');
    } catch (err) {
      if (err instanceof QueueUnavailableError) throw err;
      logger?.warn('queue operation failed', { err });
      throw new QueueUnavailableError(operation, !(err instanceof ReplyError));
    }
  };
}
