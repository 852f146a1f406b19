import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository's root. */
export const REPO_ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** Every TypeScript file of both processes (src/ and worker/), by its path from the root, with its text. */
export function processSources(): Array<{ path: string; text: string }> {
  const out: Array<{ path: string; text: string }> = [];
  for (const dir of ['src', 'worker']) {
    for (const f of readdirSync(join(REPO_ROOT, dir), { recursive: true, encoding: 'utf8' })) {
      if (!f.endsWith('.ts')) continue;
      const path = relative(REPO_ROOT, join(REPO_ROOT, dir, f));
      out.push({ path, text: readFileSync(join(REPO_ROOT, path), 'utf8') });
    }
  }
  return out;
}
