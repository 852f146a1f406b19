import type { Redis } from 'ioredis';
import { RedisUnavailableError } from '../shared/errors.js';

/** Runs one Redis operation; any Redis failure (down, timeout) becomes 503 + Retry-After. */
export async function redisCall<T>(op: (r: Redis) => Promise<T>, redis: Redis): Promise<T> {
  try {
    return await op(redis);
  } catch {
    throw new RedisUnavailableError();
  }
}
