import { readFileSync } from 'node:fs';

/** A Lua script of src/shared/lua/ by name, or anywhere by URL; read at module load, so a missing file fails the start. */
export function loadLua(name: string | URL): string {
  return readFileSync(typeof name === 'string' ? new URL(`./lua/${name}.lua`, import.meta.url) : name, 'utf8');
}

/** The script as a command of the connection (EVALSHA); `numberOfKeys` undefined: passed first at each call. */
export function defineLua(redis: import('ioredis').Redis, command: string, lua: string, numberOfKeys: number | undefined): void {
  if (typeof (redis as unknown as Record<string, unknown>)[command] !== 'function')
    redis.defineCommand(command, numberOfKeys === undefined ? { lua } : { lua, numberOfKeys });
}
