/**
 * The import layers (.dependency-cruiser.cjs, `make lint-layers`): the real tree passes, and each
 * upward arrow the rule forbids is caught in a scratch tree laid out like this one.
 */
import { describe, expect, it } from '@jest/globals';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const depcruise = join(root, 'node_modules', 'dependency-cruiser', 'bin', 'dependency-cruiser.mjs');
const config = join(root, '.dependency-cruiser.cjs');

function cruise(cwd: string): { status: number | null; out: string } {
  const r = spawnSync(process.execPath, [depcruise, '--config', config, 'src', 'worker'], { cwd, encoding: 'utf8', timeout: 120_000 });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

describe('import layers', () => {
  it('the source tree has no upward import and no cycle', () => {
    const r = cruise(root);
    expect(r.out).toContain('no dependency violations found');
    expect(r.status).toBe(0);
  }, 120_000);

  it('names every forbidden arrow in a tree that has them', () => {
    const dir = mkdtempSync(join(tmpdir(), 'opsgate-layers-'));
    try {
      const files: Record<string, string> = {
        'tsconfig.json': JSON.stringify({ compilerOptions: { module: 'nodenext', moduleResolution: 'nodenext' } }),
        'src/shared/a.ts': "import { b } from './b.js';\nexport const a = () => b;\n",
        'src/shared/b.ts': "import { a } from './a.js';\nexport const b = () => a;\n",
        'src/shared/up.ts': "import { d } from '../domain/d.js';\nexport const up = d;\n",
        'src/domain/d.ts': "import { m } from '../middleware/m.js';\nexport const d = m;\n",
        'src/middleware/m.ts': "import { s } from '../domain/s.js';\nexport const m = s;\n",
        'src/domain/s.ts': 'export const s = 1;\n',
        'src/routes/r.ts': "import { o } from '../openapi/o.js';\nexport const r = o;\n",
        'src/openapi/o.ts': 'export const o = 1;\n',
        'worker/w.ts': "import { r } from '../src/routes/r.js';\nexport const w = r;\n",
        'src/remediation/e.ts': "import { r } from '../routes/r.js';\nexport const e = r;\n",
        'src/changes/c.ts': "import { e } from '../remediation/e.js';\nexport const c = e;\n",
        'src/sources/k.ts': "import { w } from '../../worker/w.js';\nexport const k = w;\n",
        'src/api/q.ts': 'export const q = 1;\n',
        'worker/index.ts': "import { a } from '../src/shared/a.js';\nimport { q } from '../src/api/q.js';\nexport const i = [a, q];\n",
      };
      for (const [path, text] of Object.entries(files)) {
        mkdirSync(dirname(join(dir, path)), { recursive: true });
        writeFileSync(join(dir, path), text);
      }
      const r = cruise(dir);
      expect(r.status).not.toBe(0);
      for (const rule of [
        'no-circular',
        'shared-is-the-floor: src/shared/up.ts → src/domain/d.ts',
        'domain-folders-below-http: src/domain/d.ts → src/middleware/m.ts',
        'middleware-below-routes: src/middleware/m.ts → src/domain/s.ts',
        'routes-do-not-import-their-description: src/routes/r.ts → src/openapi/o.ts',
        'worker-uses-shared-and-the-pipeline: worker/w.ts → src/routes/r.ts',
        'domain-folders-below-http: src/remediation/e.ts → src/routes/r.ts',
        'nothing-in-src-imports-the-worker: src/sources/k.ts → worker/w.ts',
        'shared-is-used-by-both: src/shared/up.ts',
        'api-is-not-the-worker: worker/index.ts → src/api/q.ts',
        'changes-do-not-remediate: src/changes/c.ts → src/remediation/e.ts',
      ]) {
        expect(r.out).toContain(rule);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);
});
