import { readFileSync } from 'node:fs';

let cached: string | undefined;

/**
 * opsgate's version from its package.json (OPSGATE_VERSION overrides it in both processes). The
 * file sits two levels up from this module in the source tree (src/shared/) and three in the
 * build (dist/src/shared/); the name check skips any other package.json on the way.
 */
export function packageVersion(): string {
  if (cached !== undefined) return cached;
  cached = '0.0.0';
  for (const rel of ['../../package.json', '../../../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(rel, import.meta.url), 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'opsgate' && pkg.version) {
        cached = pkg.version;
        break;
      }
    } catch {
      // not there: try the next location
    }
  }
  return cached;
}
