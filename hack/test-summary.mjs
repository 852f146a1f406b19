#!/usr/bin/env node
// One closing line for all jest runs of `make test` (their --json result files):
// "tests: N passed, M failed" (", K skipped" when any). Exits non-zero if a run failed or
// if no test ran at all.
import { existsSync, readFileSync } from 'node:fs';

let passed = 0, failed = 0, skipped = 0, ok = true;
for (const file of process.argv.slice(2)) {
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
}
console.log(`tests: ${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`);
process.exit(ok && failed === 0 && passed > 0 ? 0 : 1);
