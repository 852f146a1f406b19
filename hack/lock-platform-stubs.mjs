#!/usr/bin/env node
// The npm registry reachable here serves only the linux-x64 builds of packages that ship
// per-platform binaries (@swc/core-*, msgpackr-extract-*, resolver bindings). `npm install`
// then leaves the other platforms' optional packages out of package-lock.json, and `npm ci`
// refuses the lock as "out of sync". This adds an optional entry (name + version only) for
// each missing platform package so `npm ci` accepts the lock; npm skips optional packages it
// cannot install. Run it after every `npm install` that changes the lock:
//   node hack/lock-platform-stubs.mjs
import { readFileSync, writeFileSync } from 'node:fs';

const file = new URL('../package-lock.json', import.meta.url);
const lock = JSON.parse(readFileSync(file, 'utf8'));
const pkgs = lock.packages;
let added = 0;
for (const [path, meta] of Object.entries(pkgs)) {
  for (const [name, spec] of Object.entries(meta.optionalDependencies ?? {})) {
    // Resolution as node does it: nested under the parent first, then hoisted.
    const nested = `${path ? path + '/' : ''}node_modules/${name}`;
    const hoisted = `node_modules/${name}`;
    if (pkgs[nested] || pkgs[hoisted]) continue;
    pkgs[hoisted] = { version: spec.replace(/^[\^~=]/, ''), optional: true, ...(meta.dev ? { dev: true } : {}) };
    added++;
  }
}
lock.packages = Object.fromEntries(Object.entries(pkgs).sort(([a], [b]) => (a === '' ? -1 : b === '' ? 1 : a < b ? -1 : a > b ? 1 : 0)));
writeFileSync(file, JSON.stringify(lock, null, 2) + '\n');
console.log(`lock-platform-stubs: added ${added} optional platform entries`);
