#!/usr/bin/env node
// One closing line for all jest runs of `make test` (their --json result files):
// "tests: N passed, M failed" (", K skipped" when any). Exits non-zero if a run failed or
// if no test ran at all.
import { readFileSync } from 'node:fs';

let passed = 0, failed = 0, skipped = 0, ok = true;
for (const file of process.argv.slice(2)) {
  const r = JSON.parse(readFileSync(file, 'utf8'));
  passed += r.numPassedTests;
  failed += r.numFailedTests + (r.numRuntimeErrorTestSuites ?? 0);
  skipped += r.numPendingTests + (r.numTodoTests ?? 0);
  ok &&= r.success === true;
}
console.log(`tests: ${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`);
process.exit(ok && failed === 0 && passed > 0 ? 0 : 1);
