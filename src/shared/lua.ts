import { readFileSync } from 'node:fs';

/**
 * The Lua scripts opsgate runs on Redis live as `.lua` files beside the module that runs them (the
 * floor's in src/shared/lua/, a concept's in its own folder, e.g. src/changes/approvals/); `make
 * build` and the Dockerfile copy them beside the compiled JS. Each file is a whole script: its KEYS
 * and ARGV are documented at its top, it uses nothing but them, and it is tested on its own
 * (test/integration/reliability/lua.test.ts). Read at module load, once per process; a missing
 * file fails the start, not a request.
 *
 * `name` is a script of src/shared/lua/; a URL names a script anywhere (`new URL('./x.lua', import.meta.url)`).
 */
export function loadLua(name: string | URL): string {
  return readFileSync(typeof name === 'string' ? new URL(`./lua/${name}.lua`, import.meta.url) : name, 'utf8');
}

/**
 * The script's name as a command of the connection: EVALSHA, with EVAL once per connection.
 * `numberOfKeys` undefined: a script of any number of keys, called with that number first.
 */
export function defineLua(redis: import('ioredis').Redis, command: string, lua: string, numberOfKeys: number | undefined): void {
  if (typeof (redis as unknown as Record<string, unknown>)[command] !== 'function')
    redis.defineCommand(command, numberOfKeys === undefined ? { lua } : { lua, numberOfKeys });
}
