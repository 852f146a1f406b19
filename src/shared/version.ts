import { readFileSync } from 'node:fs';

let cached: string | undefined;

/** opsgate's version from its package.json: two levels up in the source tree, three in dist/ (the name check skips others). */
export function packageVersion(): string {
  if (cached !== undefined) return cached;
  cached = '0.0.0';
  for (const rel of ['../../package.json', '../../../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(rel, import.meta.url), 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'opsgate' && pkg.version) return (cached = pkg.version);
    } catch {
      // not there: try the next location
    }
  }
  return cached;
}
