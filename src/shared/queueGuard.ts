import { ReplyError, type Redis } from 'ioredis';
import { QueueUnavailableError, type QueueOperation } from './errors.js';
import type { Logger } from './logger.js';
import { withTimeout } from './timeout.js';

/**
 * Runs one queue operation with the API's contract for Redis trouble: refused at once while the
 * connection is down (BullMQ would otherwise wait for it to come back), bounded by `timeoutMs`,
 * and any failure answered as 503 + Retry-After (QueueUnavailableError). A reply error is Redis
 * refusing the command (nothing ran); anything else (the bound, the connection's command
 * timeout, a closed connection) leaves the operation's fate unknown: `mayHaveLanded`.
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
