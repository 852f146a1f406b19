import type { Redis } from 'ioredis';
import { HOLDS_KEY } from '../shared/keys.js';
import type { GateReason } from './gate.js';
import { storedJson } from '../shared/redis.js';

/**
 * Why a held deploy (a delayed job, due when its gate should open) is held. Written before the job
 * is added or delayed, dropped when it runs; a record whose job is gone is ignored by every reader.
 */
export interface Hold {
  job_id: string;
  project: string;
  namespace: string;
  ref: string;
  reasons: GateReason[];
  /** When the gate is expected to open (ms): the job's delay. */
  until: number;
  held_at: number;
  /** Who held it: the API when it queued it, the worker when it woke and found the gate closed. */
  by: 'api' | 'worker';
  requested_by: string;
}

const parse = storedJson<Hold>;

export function createHoldStore(redis: Redis) {
  return {
    async set(h: Hold) {
      await redis.hset(HOLDS_KEY, h.job_id, JSON.stringify(h));
    },
    async get(jobId: string) {
      return parse(await redis.hget(HOLDS_KEY, jobId));
    },
    async remove(jobId: string) {
      await redis.hdel(HOLDS_KEY, jobId);
    },
    async all() {
      return Object.values(await redis.hgetall(HOLDS_KEY))
        .map(parse)
        .filter((h): h is Hold => h !== undefined)
        .sort((a, b) => a.until - b.until);
    },
  };
}
