import { readFileSync } from 'node:fs';

/**
 * The Lua scripts opsgate runs on Redis live as files in src/shared/lua/ (`make build` and the
 * Dockerfile copy them beside the compiled JS). Each file is a whole script: its KEYS and ARGV are
 * documented at its top, it uses nothing but them, and it is tested on its own
 * (test/integration/reliability/lua.test.ts). Read at module load, once per process; a missing
 * file fails the start, not a request.
 */
export function loadLua(name: string): string {
  return readFileSync(new URL(`./lua/${name}.lua`, import.meta.url), 'utf8');
}

/** The script's name as a command of the connection: EVALSHA, with EVAL once per connection. */
export function defineLua(redis: import('ioredis').Redis, command: string, lua: string, numberOfKeys: number): void {
  if (typeof (redis as unknown as Record<string, unknown>)[command] !== 'function') redis.defineCommand(command, { lua, numberOfKeys });
}
