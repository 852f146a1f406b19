import { spawnSync } from 'node:child_process';
import { mkdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createHash } from 'node:crypto';

/**
 * Jest globalSetup: compile the sources once per test run (hack/build.mjs: tsc -p tsconfig.build.json
 * -> dist/, with the Lua scripts) so
 * tests that spawn the real processes (test/helpers/processes.ts) run the current code.
 * - Several test runs may start at once on a shared checkout: a lock directory serialises builds.
 * - OPSGATE_SKIP_BUILD=1 skips it (e.g. `make test` already ran `make build`).
 * - A compile error is reported but does not abort the run: tests that need no process still run,
 *   and tsc still emits what it can.
 */
const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

function lockDir(): string {
  const id = createHash('sha256').update(root).digest('hex').slice(0, 12);
  return join(tmpdir(), `opsgate-build-${id}.lock`);
}

async function withLock<T>(fn: () => T): Promise<T> {
  const dir = lockDir();
  const deadline = Date.now() + 180_000;
  for (;;) {
    try {
      mkdirSync(dir);
      break;
    } catch {
      // A lock older than 3 minutes belongs to a crashed run.
      try {
        if (Date.now() - statSync(dir).mtimeMs > 180_000) rmSync(dir, { recursive: true, force: true });
      } catch {
        /* removed meanwhile */
      }
      if (Date.now() > deadline) break; // build anyway rather than hang
      await new Promise((r) => setTimeout(r, 250));
    }
  }
  try {
    return fn();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export default async function globalSetup(): Promise<void> {
  if (process.env.OPSGATE_SKIP_BUILD === '1') return;
  await withLock(() => {
    const r = spawnSync(process.execPath, [join(root, 'hack', 'build.mjs'), 'tsconfig.build.json', 'dist'], {
      cwd: root,
      encoding: 'utf8',
    });
    if (r.status !== 0) {
      const out = `${r.stdout ?? ''}${r.stderr ?? ''}`.split('\n').slice(0, 20).join('\n');
      process.stderr.write(`\n[globalSetup] hack/build.mjs reported errors (tests spawning dist/ may fail):\n${out}\n`);
    }
  });
}
