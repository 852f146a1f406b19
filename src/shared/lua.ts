import { readFileSync } from 'node:fs';

/**
 * The Lua scripts opsgate runs on Redis live as files in src/shared/lua/ (`make build` and the
 * Dockerfile copy them beside the compiled JS). A script is one file, or pieces joined in order:
 * a piece can leave locals or a function for the next (rate-hit.lua's rl_n and rl_ttl, claim-events.lua's
 * claim_events). Read at module load, once per process; a missing file fails the start, not a request.
 */
export function loadLua(...pieces: string[]): string {
  return pieces.map((name) => readFileSync(new URL(`./lua/${name}.lua`, import.meta.url), 'utf8')).join('\n');
}
