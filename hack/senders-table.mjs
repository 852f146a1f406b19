#!/usr/bin/env node
// Writes the tables of webhook senders from the registry (src/sources, compiled to dist/ by
// `make build`), each between its markers: docs/senders.md's and the chart README's.
// Usage: node hack/senders-table.mjs
import { readFileSync, writeFileSync } from 'node:fs';
import { SOURCES } from '../dist/src/sources/index.js';
import { CHART_TABLE_BEGIN, CHART_TABLE_END, TABLE_BEGIN, TABLE_END, chartSendersTable, sendersTable } from '../dist/src/sources/table.js';

const tables = [
  { file: 'docs/senders.md', begin: TABLE_BEGIN, end: TABLE_END, render: sendersTable },
  { file: 'charts/opsgate/README.md', begin: CHART_TABLE_BEGIN, end: CHART_TABLE_END, render: chartSendersTable },
];

let failed = false;
for (const { file, begin, end, render } of tables) {
  const text = readFileSync(file, 'utf8');
  const start = text.indexOf(begin);
  const stop = text.indexOf(end);
  if (start < 0 || stop < start) {
    console.error(`${file}: no senders table markers (${begin} … ${end})`);
    failed = true;
    continue;
  }
  writeFileSync(file, text.slice(0, start) + render(SOURCES) + text.slice(stop + end.length));
  console.log(`${file}: senders table written (${SOURCES.length} senders)`);
}
process.exit(failed ? 1 : 0);
