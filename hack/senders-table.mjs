#!/usr/bin/env node
// Writes the README's table of webhook senders from the registry (src/sources, compiled to dist/ by
// `make build`), between its markers. Usage: node hack/senders-table.mjs [README.md]
import { readFileSync, writeFileSync } from 'node:fs';
import { SOURCES } from '../dist/src/sources/index.js';
import { TABLE_BEGIN, TABLE_END, sendersTable } from '../dist/src/sources/table.js';

const file = process.argv[2] ?? 'README.md';
const text = readFileSync(file, 'utf8');
const start = text.indexOf(TABLE_BEGIN);
const end = text.indexOf(TABLE_END);
if (start < 0 || end < start) {
  console.error(`${file}: no senders table markers (${TABLE_BEGIN} … ${TABLE_END})`);
  process.exit(1);
}
writeFileSync(file, text.slice(0, start) + sendersTable(SOURCES) + text.slice(end + TABLE_END.length));
console.log(`${file}: senders table written (${SOURCES.length} senders)`);
