import type { Redis } from 'ioredis';
import type { Writable } from 'node:stream';

/**
 * Commands sent together in one socket write (one Redis round trip) without an ioredis
 * Pipeline. A Pipeline's constructor copies every script defined on its connection onto the new
 * object: on BullMQ's connection (64 scripts) that costs about 40 us of CPU per pipeline, more
 * than the rest of the add (`make bench-profile`, docs/performance.md). Here the commands are called on the connection itself, as
 * usual (each keeps its own reply promise, ioredis's NOSCRIPT fallback and command timeout), and
 * the connection's socket is corked while they are issued, so Node hands them to the kernel in
 * one writev. Redis answers them in order, as a pipeline's.
 *
 * On a Redis Cluster each command goes to the node of its keys (there is no single socket to
 * cork): still sent in the same tick, so still one round trip of waiting.
 */
export function corked<T>(redis: Redis, issue: () => T): T {
  const stream = redis.isCluster ? undefined : (redis as unknown as { stream?: Writable }).stream;
  if (!stream || redis.status !== 'ready' || typeof stream.cork !== 'function') return issue();
  stream.cork();
  try {
    return issue();
  } finally {
    stream.uncork();
  }
}

type Scripted = Record<string, ((...args: Array<string | number>) => Promise<unknown>) | undefined>;

/** Defines a Lua script as a command of the connection (EVALSHA, EVAL once per connection), once. */
export function defineScript(redis: Redis, name: string, lua: string): void {
  if (typeof (redis as unknown as Scripted)[name] !== 'function') redis.defineCommand(name, { lua });
}

/** Calls a script defined by defineScript: KEYS then ARGV. */
export function callScript(redis: Redis, name: string, keys: readonly string[], args: ReadonlyArray<string | number>): Promise<unknown> {
  return (redis as unknown as Scripted)[name]!(keys.length, ...keys, ...args);
}

/** A command's settled outcome in the [error, reply] form of a pipeline's exec(). */
export type Reply = [Error | null, unknown];

/** Settles every promise into [error, reply] (never rejects). */
export function settle(promises: ReadonlyArray<Promise<unknown>>): Promise<Reply[]> {
  return Promise.all(
    promises.map((p) =>
      p.then(
        (v): Reply => [null, v],
        (e: unknown): Reply => [e instanceof Error ? e : new Error(String(e)), undefined],
      ),
    ),
  );
}
