import { expect, test } from '@jest/globals';
import request from 'supertest';
import { queryOf } from '../../../src/middleware/observe.js';
import { BEARER, OP_KEY, useHarness } from '../../helpers/apiHarness.js';

/**
 * A credential sent in the query, in any percent-encoding, is redacted in the audit line: the
 * query is logged in one canonical encoding and the logger's redaction knows that form too
 * (real app, real Redis, the app's own logger with its configured secrets).
 */
const ctx = useHarness();

/** Every character percent-encoded, upper or lower case hex alternating: an encoding no redaction could list. */
const encodeAll = (s: string) =>
  [...Buffer.from(s)].map((b, i) => '%' + (i % 2 ? b.toString(16) : b.toString(16).toUpperCase()).padStart(2, '0')).join('');

test.each([
  ['every byte encoded', encodeAll(OP_KEY)],
  ['one byte encoded', '%' + OP_KEY.charCodeAt(0).toString(16) + OP_KEY.slice(1)],
  ['as encodeURIComponent', encodeURIComponent(OP_KEY)],
])('a secret in the query (%s) is redacted in the audit line', async (_name, encoded) => {
  const res = await request(ctx.h.app).post(`/ops/restart?host=${encoded}&service=web`).set('Authorization', `Bearer ${BEARER}`);
  expect(res.status).toBe(404);
  const audit = ctx.h.audits().filter((l) => l.path === '/ops/restart');
  expect(audit.at(-1)).toMatchObject({ query: 'host=[REDACTED]&service=web', status: 404 });
  const raw = ctx.h.lines.join('\n');
  for (const form of [OP_KEY, encoded, encodeURIComponent(OP_KEY), OP_KEY.slice(1)]) expect(raw).not.toContain(form);
});

test('the canonical query keeps ordinary queries as they are and undecodable ones as sent', () => {
  expect(queryOf('/ops/jobs?state=failed&offset=0&limit=20')).toBe('state=failed&offset=0&limit=20');
  expect(queryOf('/x?a=%6f%6B&b=c+d&e')).toBe('a=ok&b=c%20d&e');
  expect(queryOf('/x?a=%zz&b=%E0%A4%A')).toBe('a=%zz&b=%E0%A4%A');
  expect(queryOf('/x')).toBeUndefined();
});
