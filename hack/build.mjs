#!/usr/bin/env node
// Compiles a TypeScript project and copies the files tsc does not emit (the Lua scripts under
// src/) to the same place in its output, so the compiled modules find them beside themselves.
// Usage: node hack/build.mjs [project (tsconfig.build.json)] [output root (dist)]
// The output root mirrors the repository root: src/shared/lua/x.lua -> <root>/src/shared/lua/x.lua.
// The Dockerfile runs it too: it needs only Node and the TypeScript package.
import { spawnSync } from 'node:child_process';
import { cpSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const [project = 'tsconfig.build.json', outRoot = 'dist'] = process.argv.slice(2);
const tsc = createRequire(join(repo, 'package.json')).resolve('typescript/bin/tsc');
const r = spawnSync(process.execPath, [tsc, '-p', project], { cwd: repo, stdio: 'inherit' });

let copied = 0;
for (const entry of readdirSync(join(repo, 'src'), { recursive: true, withFileTypes: true })) {
  if (!entry.isFile() || !entry.name.endsWith('.lua')) continue;
  const from = join(entry.parentPath, entry.name);
  cpSync(from, join(repo, outRoot, relative(repo, from)));
  copied++;
}
if (copied === 0) {
  console.error('build.mjs: no .lua file under src/');
  process.exit(1);
}
process.exit(r.status ?? 1);
