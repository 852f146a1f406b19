import { readFileSync } from 'node:fs';

/**
 * The Lua scripts opsgate runs on Redis live as files in src/shared/lua/ (`make build` and the
 * Dockerfile copy them beside the compiled JS). A script is one file, or pieces joined in order:
 * a piece can leave locals or a function for the next (rate-hit.lua's rl_n and rl_ttl,
 * intake-events.lua's intake_events). A piece given as `{ lua }` is Lua built in code (BullMQ's
 * own add script as a function, src/shared/queue.ts). Read at module load, once per process; a
 * missing file fails the start, not a request.
 */
export function loadLua(...pieces: Array<string | { lua: string }>): string {
  return pieces
    .map((piece) => (typeof piece === 'string' ? readFileSync(new URL(`./lua/${piece}.lua`, import.meta.url), 'utf8') : piece.lua))
    .join('\n');
}
