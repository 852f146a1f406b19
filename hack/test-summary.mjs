#!/usr/bin/env node
// One closing line for jest runs (their --json result files):
// "<label>: N passed, M failed" (", K skipped" when any; label "tests" unless --label).
// --slowest N first lists the N slowest suites of all the files, so a tier that grows slow says where.
// Every failed test is named with the first lines of its message, so a log cut to its tail (as CI
// keeps it) still says what failed.
// Exits non-zero if a run failed or if no test ran at all.
//
//   node hack/test-summary.mjs [--label NAME] [--slowest N] result.json...
import { existsSync, readFileSync } from 'node:fs';
import { relative } from 'node:path';

const args = process.argv.slice(2);
let label = 'tests';
let slowest = 0;
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--label') label = args[++i];
  else if (args[i] === '--slowest') slowest = Number(args[++i]);
  else files.push(args[i]);
}

let passed = 0,
  failed = 0,
  skipped = 0,
  ok = true;
const suites = [];
const failures = [];
for (const file of files) {
  if (!existsSync(file)) {
    // the suite did not run to its end (e.g. the test node did not start): that is a failure
    console.error(`test-summary: no result file ${file}`);
    failed += 1;
    ok = false;
    continue;
  }
  const r = JSON.parse(readFileSync(file, 'utf8'));
  passed += r.numPassedTests;
  failed += r.numFailedTests + (r.numRuntimeErrorTestSuites ?? 0);
  skipped += r.numPendingTests + (r.numTodoTests ?? 0);
  ok &&= r.success === true;
  for (const t of r.testResults ?? []) {
    const name = relative(process.cwd(), t.name);
    if (t.endTime > 0 && t.startTime > 0) suites.push({ name, ms: t.endTime - t.startTime });
    const failedTests = (t.assertionResults ?? []).filter((a) => a.status === 'failed');
    for (const a of failedTests) failures.push({ name, title: a.fullName, message: (a.failureMessages ?? []).join('\n') });
    // a suite that failed outside any test (its file did not load, a hook threw) has only its own message
    if (t.status === 'failed' && failedTests.length === 0) failures.push({ name, title: '(suite)', message: t.message ?? '' });
  }
}
if (slowest > 0 && suites.length > 0) {
  console.log(`${label}: slowest ${Math.min(slowest, suites.length)} of ${suites.length} suites`);
  for (const s of suites.sort((a, b) => b.ms - a.ms).slice(0, slowest)) {
    console.log(`  ${(s.ms / 1000).toFixed(1).padStart(7)} s  ${s.name}`);
  }
}
for (const f of failures) {
  console.log(`${label}: FAILED ${f.name} > ${f.title}`);
  const lines = f.message
    // jest's messages carry terminal colours; a log file wants the text
    .replace(/\u001b\[[0-9;]*m/g, '')
    .split('\n')
    .map((l) => l.trimEnd())
    .filter((l) => l.trim() !== '')
    // frames inside jest and Node say nothing about the test
    .filter((l) => !/^\s*at .*(node_modules|node:internal|<anonymous>)/.test(l));
  for (const l of lines.slice(0, 12)) console.log(`    ${l.slice(0, 300)}`);
}
console.log(`${label}: ${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`);
process.exit(ok && failed === 0 && passed > 0 ? 0 : 1);
