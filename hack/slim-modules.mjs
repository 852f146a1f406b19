#!/usr/bin/env node
// Shrinks a production node_modules tree to what Node executes, for the runtime image.
// Usage: node hack/slim-modules.mjs <node_modules dir>
//
// 1. Deletes files Node never loads: type declarations, source maps, TypeScript and Flow sources,
//    Markdown, native sources and Bare-runtime prebuilds (*.bare), and the packages' own test,
//    example and docs directories. Licence and notice files always stay.
// 2. Rewrites every .js/.cjs/.mjs file without comments and whitespace (swc's minifier with
//    compress and mangle off: names, statements and strings are unchanged, only the layout goes);
//    licence comments (/*! ... */, @license, @preserve) stay. A file swc cannot parse is kept as is.
// The generated Kubernetes client alone is ~25 MB of mostly JSDoc; without this step the image does
// not fit its size budget. Package names and versions (package.json) are untouched, so the SBOM and
// scanners that read node_modules see the same packages.
// Runs in the Dockerfile's build stage, where the devDependencies (swc) are installed.
import { readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = process.argv[2];
if (!root || !statSync(root, { throwIfNoEntry: false })?.isDirectory()) {
  console.error('usage: slim-modules.mjs <node_modules dir>');
  process.exit(2);
}
const repo = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const swc = createRequire(join(repo, 'package.json'))('@swc/core');

const KEEP = /^(licen[cs]e|copying|notice|authors)(\.|$)/i;
const DROP_FILE = /\.(d\.[cm]?ts|map|[cm]?ts|tsx|flow|md|markdown|tsbuildinfo|bare|c|cc|h|gyp|gypi)$|^CMakeLists\.txt$/i;
const DROP_DIR = new Set(['test', 'tests', '__tests__', 'example', 'examples', 'docs', 'benchmark', 'benchmarks', '.github']);
const SCRIPT = /\.(js|cjs|mjs)$/;

let removed = 0;
let before = 0;
let after = 0;
let kept = 0;

function walk(dir, inPackage) {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) {
      // node_modules/<pkg>/test is a package's own tests; node_modules/test would be a package named "test".
      if (inPackage && DROP_DIR.has(e.name)) {
        rmSync(p, { recursive: true });
        removed++;
      } else {
        walk(p, e.name !== 'node_modules' && !(e.name.startsWith('@') && dir.endsWith('node_modules')));
      }
      continue;
    }
    if (!e.isFile() || KEEP.test(e.name)) continue;
    if (DROP_FILE.test(e.name)) {
      rmSync(p);
      removed++;
      continue;
    }
    if (!SCRIPT.test(e.name)) continue;
    const src = readFileSync(p, 'utf8');
    before += src.length;
    try {
      const { code } = swc.minifySync(src, {
        compress: false,
        mangle: false,
        module: e.name.endsWith('.mjs') ? true : e.name.endsWith('.cjs') ? false : 'unknown',
        format: { comments: 'some' },
      });
      writeFileSync(p, code);
      after += code.length;
    } catch {
      kept++;
      after += src.length;
    }
  }
}

walk(resolve(root), false);
console.log(
  `slim-modules: ${removed} files/directories removed; scripts ${(before / 1e6).toFixed(1)} -> ${(after / 1e6).toFixed(1)} MB` +
    (kept ? ` (${kept} kept as they are: swc could not parse them)` : ''),
);
