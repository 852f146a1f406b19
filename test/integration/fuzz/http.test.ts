/**
 * Hostile input against the real API process (dist/src/server.js: Node's HTTP parser, Express,
 * every route) on a real redis-server, through a raw TCP client so any byte can be sent.
 *
 * Invariants checked on every response (checkInvariants):
 * - never a 5xx (the only 5xx allowed is 503 from GET /ops/hosts/{host}: no Kubernetes
 *   configured in this test, which is that endpoint's documented answer);
 * - every error (>= 400) body is JSON with exactly two fields: detail, a non-empty string, and
 *   code, a code of the error catalog (src/shared/errors.ts) whose status is the answer's;
 * - no configured secret (API keys, bearer token, webhook secrets) anywhere in the response,
 *   unless the caller sent that very secret itself (X-Request-Id is echoed);
 * - no stack trace or source path in the response.
 * And on the queue: at the end, the jobs in the real "ops" queue are exactly those the 202
 * answers announced (scm/github accepted events, distinct firing alert fingerprints), nothing else.
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { createHmac } from 'node:crypto';
import { startApi, type OpsProcess } from '../../helpers/processes.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { apiEnv, inspectQueue, makeSecrets, secretValues } from '../../helpers/reliability.js';
import { buildRequest, rawRequest, type RawRequest, type RawResponse } from '../../helpers/rawHttp.js';
import { ERROR_CODES, type ErrorCode } from '../../../src/shared/errors.js';

const secrets = makeSecrets('fuzz');
// The configured ones (ALERTS_WEBHOOK_TOKEN stays unset here so /webhook/alerts payloads can be fuzzed).
const SECRETS = secretValues(secrets).filter((v) => v !== secrets.alerts);
let redis: RedisServer;
let api: OpsProcess & { baseUrl: string };
let port: number;

/** What the 202 answers announced: the queue must hold exactly this at the end. */
const announcedDeploys = new Set<string>();
const announcedAlerts = new Set<string>();
let checked = 0;
/** The codes the error answers carried. */
const codesSeen = new Set<ErrorCode>();

const STACK = /\n\s+at |node_modules|\/work\/|\.ts:\d+|\.js:\d+|(Type|Reference|Range|Syntax)Error\b/;

function checkInvariants(req: RawRequest, r: RawResponse): void {
  checked++;
  const where = `${req.method} ${req.path.slice(0, 80)} -> ${r.status} ${r.body.slice(0, 200)}`;
  expect({ where, status5xx: r.status >= 500 && !(r.status === 503 && /^\/ops\/hosts\/[^/?]+/.test(req.path)) }).toEqual({
    where,
    status5xx: false,
  });
  expect(Number.isInteger(r.status)).toBe(true);
  // A leak is a secret the caller did not send itself (an echoed X-Request-Id is the caller's own bytes).
  const sent = buildRequest(req).toString('utf8');
  for (const s of SECRETS) expect({ where, leaked: r.raw.includes(s) && !sent.includes(s) }).toEqual({ where, leaked: false });
  expect({ where, stack: STACK.test(r.body) }).toEqual({ where, stack: false });
  if (r.status >= 400 && req.method !== 'HEAD') {
    let body: unknown;
    try {
      body = JSON.parse(r.body);
    } catch {
      body = `not JSON: ${r.body.slice(0, 100)}`;
    }
    expect({ where, keys: body && typeof body === 'object' ? Object.keys(body) : body }).toEqual({ where, keys: ['detail', 'code'] });
    const { detail, code } = body as { detail: unknown; code: unknown };
    expect(typeof detail === 'string' && detail.length > 0).toBe(true);
    expect({ where, code, status: ERROR_CODES[code as ErrorCode]?.status }).toEqual({ where, code, status: r.status });
    codesSeen.add(code as ErrorCode);
    expect(r.headers['content-type'] ?? '').toMatch(/application\/json/);
  }
}

async function send(req: RawRequest): Promise<RawResponse> {
  const r = await rawRequest(port, req);
  checkInvariants(req, r);
  return r;
}

// ------------------------------------------------------------------ generators

const PATHS = [
  '/health',
  '/ready',
  '/version',
  '/ops/hosts',
  '/ops/hosts/web-01',
  '/ops/hosts/nope',
  '/ops/restart',
  '/ops/restart?host=web-01&service=web',
  '/ops/restart?host=nope&service=web',
  '/ops/cache',
  '/ops/jobs/1',
  '/ops/jobs/does-not-exist',
  '/webhook/scm',
  '/webhook/github',
  '/webhook/alerts',
  '/webhook/unknown',
  '/admin/queues',
  '/admin/queues/api/queues',
  '/metrics',
  '/',
  '/ops',
  '/webhook',
];
const METHODS = ['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'HEAD', 'TRACE', 'FOO', 'get', 'CONNECT'];

/** Strings with everything in them: unicode, control characters, lone surrogates, colons. */
const nasty = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 64 }),
  fc.string({ unit: 'grapheme', maxLength: 32 }),
  fc.constantFrom(
    '',
    ' ',
    '\t',
    ':',
    '::',
    'null',
    'undefined',
    '__proto__',
    'constructor',
    'Bearer',
    'bearer ',
    'sha256=',
    '%00',
    '\u0000',
    '\u202e',
    '\ud800',
    'é',
    '🔑',
  ),
);

/** A secret, mutated: truncated, extended, case-flipped, padded, split at a colon, unicode-twinned. */
function mutated(secret: string) {
  return fc.oneof(
    fc.constant(secret.slice(0, -1)),
    fc.constant(secret + 'x'),
    fc.constant(secret.toUpperCase()),
    fc.constant(secret.slice(1)),
    fc.constant(secret.replace(/-/g, '\u2010')),
    fc.constant(`${secret}:operator`),
    fc.constant(secret.split(':')[0] ?? ''),
    fc.constant(secret.split('').reverse().join('')),
    fc
      .nat({ max: Math.max(0, secret.length - 1) })
      .map((i) => secret.slice(0, i) + String.fromCharCode(secret.charCodeAt(i) ^ 1) + secret.slice(i + 1)),
  );
}

/** Header values as raw bytes: some valid, many not (control characters, latin-1, CR/LF injection). */
const headerValue = fc.oneof(
  nasty.map((s) => Buffer.from(s.replace(/[\r\n]/g, ''), 'utf8')),
  fc.uint8Array({ maxLength: 48 }).map((a) => Buffer.from(a.filter((b) => b !== 10 && b !== 13))),
  fc
    .constantFrom(...SECRETS)
    .chain(mutated)
    .map((s) => Buffer.from(s, 'utf8')),
  fc.constantFrom(...SECRETS).map((s) => Buffer.from(s, 'utf8')),
  fc.constant(Buffer.from('a'.repeat(20_000))), // over Node's 16 KiB header limit
  fc.constant(Buffer.from('x\r\nX-Injected: yes')),
);

const headerName = fc.constantFrom(
  'X-API-Key',
  'x-api-key',
  'Authorization',
  'X-Scm-Token',
  'X-Scm-Event',
  'X-Hub-Signature-256',
  'X-GitHub-Event',
  'Content-Type',
  'X-Forwarded-For',
  'X-Request-Id',
  'Transfer-Encoding',
  'Cookie',
  '__proto__',
  'constructor',
);

function deepJson(depth: number, kind: 'array' | 'object'): string {
  return kind === 'array' ? '['.repeat(depth) + ']'.repeat(depth) : '{"a":'.repeat(depth) + '1' + '}'.repeat(depth);
}

const body = fc.oneof(
  fc.jsonValue({ maxDepth: 4 }).map((v) => JSON.stringify(v)),
  fc.string({ unit: 'binary', maxLength: 200 }),
  fc.constantFrom('', '{', '{"a":', 'null', '[]', '"str"', '1e999', '{"__proto__":{"polluted":1}}', '\u0000', '\ufeff{}'),
  fc.integer({ min: 1000, max: 200_000 }).chain((d) => fc.constantFrom(deepJson(d, 'array'), deepJson(d, 'object'))),
);

const pathArb = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom(...PATHS) },
  {
    weight: 2,
    arbitrary: fc
      .tuple(fc.constantFrom(...PATHS), nasty)
      .map(([p, s]) => p + (p.includes('?') ? '&' : '?') + 'q=' + encodeURIComponent(s.replace(/[\ud800-\udfff]/g, ''))),
  },
  {
    weight: 2,
    arbitrary: fc.tuple(fc.constantFrom(...PATHS), nasty).map(([p, s]) => p + '/' + encodeURIComponent(s.replace(/[\ud800-\udfff]/g, ''))),
  },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      '/ops/jobs/%ff',
      '/ops/hosts/%',
      '/%2e%2e/%2e%2e/etc/passwd',
      '//health',
      '/health/',
      '/ops/hosts/__proto__',
      '/ops/jobs/__proto__',
      '/ops/restart?host=__proto__&service=constructor',
      '/ops/restart?host[]=a&service=b',
      '/ops/restart?host=web-01&host=web-02&service=web',
      '*',
      '/' + 'a'.repeat(9000),
    ),
  },
);

// ------------------------------------------------------------------ setup

beforeAll(async () => {
  redis = await startRedis();
  const env = await apiEnv(redis.url, secrets, { ALERTS_WEBHOOK_TOKEN: undefined, BODY_LIMIT: '256kb', ADMIN_UI_ENABLED: 'true' });
  api = await startApi({ env });
  port = Number(env.PORT);
}, 60_000);

afterAll(async () => {
  await api?.stop();
  await redis?.destroy();
});

// ------------------------------------------------------------------ properties

describe('fuzz: any method, path, header bytes and body', () => {
  it('keeps every invariant', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...METHODS),
        pathArb,
        fc.array(fc.tuple(headerName, headerValue), { maxLength: 4 }),
        fc.option(body, { nil: undefined }),
        async (method, path, headers, b) => {
          // (requests that the fuzz makes valid by chance are tracked below: scm/github/alerts)
          const r = await send({ method, path, headers, body: b });
          track(method, path, headers, b, r);
        },
      ),
      { numRuns: 400 },
    );
  }, 300_000);
});

/** Records what a 202 announced, whatever request produced it. */
function track(method: string, path: string, _headers: Array<[string, string | Buffer]>, b: string | undefined, r: RawResponse): void {
  if (r.status !== 202 || method !== 'POST') return;
  const json = JSON.parse(r.body) as Record<string, unknown>;
  if (path.startsWith('/webhook/scm') || path.startsWith('/webhook/github')) {
    if (json.accepted === true) announcedDeploys.add(String(json.event_id));
  } else if (path.startsWith('/webhook/alerts') && b !== undefined) {
    const payload = JSON.parse(b) as { alerts: Array<Record<string, unknown>> };
    for (const a of payload.alerts) {
      if (a && typeof a === 'object' && a.status === 'firing' && typeof a.fingerprint === 'string' && a.fingerprint !== '')
        announcedAlerts.add(a.fingerprint);
    }
  }
}

describe('fuzz: credentials', () => {
  it('X-API-Key: only an exact configured key passes; keys with colons work whole, never in pieces', async () => {
    const valid = new Set([secrets.operatorKey, secrets.readonlyKey, secrets.colonKey]);
    await fc.assert(
      fc.asyncProperty(
        fc.oneof(
          headerValue,
          fc.constantFrom(...valid).map((s) => Buffer.from(s)),
        ),
        async (v) => {
          const r = await send({ method: 'GET', path: '/ops/hosts', headers: [['X-API-Key', v]] });
          // Node trims optional whitespace around header values; nothing else is forgiven.
          const presented = v.toString('latin1').replace(/^[ \t]+|[ \t]+$/g, '');
          if (r.status === 200) expect(valid.has(presented)).toBe(true);
          else if (valid.has(presented)) throw new Error(`valid key refused: ${r.status}`);
          else expect([400, 401, 431]).toContain(r.status);
        },
      ),
      { numRuns: 250 },
    );
    // Roles: the colon key is an operator, the readonly key is not; pieces of the colon key are nothing.
    expect((await send({ method: 'DELETE', path: '/ops/cache', headers: [['X-API-Key', secrets.colonKey]] })).status).toBe(200);
    expect((await send({ method: 'DELETE', path: '/ops/cache', headers: [['X-API-Key', secrets.readonlyKey]] })).status).toBe(403);
    for (const piece of [
      secrets.colonKey.split(':')[0]!,
      secrets.colonKey.slice(0, secrets.colonKey.lastIndexOf(':')),
      `${secrets.colonKey}:operator`,
      `${secrets.readonlyKey}:operator`,
    ]) {
      expect((await send({ method: 'DELETE', path: '/ops/cache', headers: [['X-API-Key', piece]] })).status).toBe(401);
    }
  }, 120_000);

  it('Authorization: Bearer variants (scheme case-insensitive, token exact)', async () => {
    const schemes = fc.oneof(
      fc.constantFrom('Bearer', 'bearer', 'BEARER', 'bEaReR'),
      fc.constantFrom('Basic', 'Token', 'Bearer:', 'Bearerx', '', 'B', 'Digest', 'Bearer\u00a0'),
    );
    const tokens = fc.oneof(fc.constant(secrets.bearer), mutated(secrets.bearer), nasty, fc.constant(''));
    const seps = fc.constantFrom(' ', '  ', '\t', '', ' \t ');
    await fc.assert(
      fc.asyncProperty(schemes, seps, tokens, async (scheme, sep, token) => {
        const header = Buffer.from(`${scheme}${sep}${token}`.replace(/[\r\n]/g, ''), 'utf8');
        // host=nope: an authorised call is answered 404 (not in the inventory): nothing is enqueued.
        const r = await send({ method: 'POST', path: '/ops/restart?host=nope&service=web', headers: [['Authorization', header]] });
        const exact = /^bearer$/i.test(scheme) && sep === ' ' && token === secrets.bearer;
        if (exact) expect(r.status).toBe(404);
        if (r.status === 404) expect(/^bearer$/i.test(scheme) && token === secrets.bearer).toBe(true);
        else if (!exact) expect([400, 401]).toContain(r.status);
      }),
      { numRuns: 250 },
    );
  }, 120_000);

  it('X-Scm-Token and X-Hub-Signature-256: prefixes, lengths, cases; only the exact secret / HMAC passes', async () => {
    const payload = JSON.stringify({ ref: 'refs/heads/feature', project: { path_with_namespace: 'g/p' }, checkout_sha: 'abc' });
    const goodSig = 'sha256=' + createHmac('sha256', secrets.github).update(payload).digest('hex');
    const sigs = fc.oneof(
      fc.constant(goodSig),
      fc.constant(goodSig.toUpperCase()),
      fc.constant(goodSig.slice(0, -1)),
      fc.constant(goodSig + '0'),
      fc.constant(goodSig.replace('sha256=', 'sha1=')),
      fc.constant(goodSig.replace('sha256=', 'SHA256=')),
      fc.constant(goodSig.slice(7)),
      fc.constant('sha256='),
      fc.constant('sha256=' + 'g'.repeat(64)),
      fc.stringMatching(/^sha256=[0-9a-f]{0,130}$/),
      nasty,
    );
    await fc.assert(
      fc.asyncProperty(sigs, fc.oneof(fc.constant(secrets.scm), mutated(secrets.scm), nasty), async (sig, token) => {
        const g = await send({
          method: 'POST',
          path: '/webhook/github',
          headers: [
            ['X-Hub-Signature-256', Buffer.from(sig.replace(/[\r\n]/g, ''))],
            ['X-GitHub-Event', 'push'],
            ['Content-Type', 'application/json'],
          ],
          body: payload,
        });
        const sigOk = sig.replace(/^[ \t]+|[ \t]+$/g, '').toLowerCase() === goodSig && sig.startsWith('sha256=');
        if (g.status === 202) expect(sigOk).toBe(true);
        else expect([400, 403]).toContain(g.status);
        const s = await send({
          method: 'POST',
          path: '/webhook/scm',
          headers: [
            ['X-Scm-Token', Buffer.from(token.replace(/[\r\n]/g, ''))],
            ['X-Scm-Event', 'Push Hook'],
            ['Content-Type', 'application/json'],
          ],
          body: payload,
        });
        if (s.status === 202) expect(token.replace(/^[ \t]+|[ \t]+$/g, '')).toBe(secrets.scm);
        else expect([400, 403]).toContain(s.status);
      }),
      { numRuns: 200 },
    );
  }, 120_000);
});

describe('fuzz: payloads behind valid credentials', () => {
  const scmHeaders = (event = 'Push Hook'): Array<[string, string]> => [
    ['X-Scm-Token', secrets.scm],
    ['X-Scm-Event', event],
    ['Content-Type', 'application/json'],
  ];

  it('scm: arbitrary JSON / non-JSON bodies and content types give 202/400/413/415/422; every accepted event has exactly its job', async () => {
    const field = fc.oneof(
      fc.string({ maxLength: 40 }),
      fc.constant(undefined),
      fc.constant(null),
      fc.integer(),
      fc.constant({}),
      fc.constant([]),
      fc.constant('refs/heads/main'),
      fc.constant('__proto__'),
    );
    const payload = fc.oneof(
      fc
        .record(
          {
            ref: fc.oneof(fc.constant('refs/heads/main'), field),
            project: fc.oneof(fc.record({ path_with_namespace: field }), field),
            checkout_sha: fc.oneof(fc.stringMatching(/^[0-9a-f]{1,40}$/), field),
          },
          { requiredKeys: [] },
        )
        .map((o) => JSON.stringify(o)),
      fc.constantFrom(
        '{"ref":"refs/heads/main","checkout_sha":"p1","__proto__":{"accepted":true}}',
        '{"ref":"refs/heads/main","checkout_sha":"p2","project":{"__proto__":{"path_with_namespace":"evil"}}}',
        '{"ref":"refs/heads/main","checkout_sha":"p3","constructor":{"prototype":{"polluted":"yes"}}}',
        '{"ref":"refs/heads/main","checkout_sha":"p4","project":{"path_with_namespace":"g/\u0000\u202e\ud83d\ude00:colon"}}',
      ),
      body,
    );
    const contentType = fc.constantFrom(
      'application/json',
      'text/plain',
      'application/x-www-form-urlencoded',
      'multipart/form-data; boundary=x',
      'application/json; charset=latin1',
      '',
    );
    await fc.assert(
      fc.asyncProperty(payload, contentType, fc.constantFrom('Push Hook', 'push hook', 'Tag Push Hook', ''), async (p, ct, event) => {
        const headers = scmHeaders(event).filter(([k]) => k !== 'Content-Type');
        if (ct) headers.push(['Content-Type', ct]);
        const r = await send({ method: 'POST', path: '/webhook/scm', headers, body: p });
        expect([202, 400, 413, 415, 422]).toContain(r.status);
        if (r.status === 202) {
          const json = JSON.parse(r.body) as Record<string, unknown>;
          if ('ignored' in json) expect(Object.keys(json).sort()).toEqual(['ignored', 'reason']);
          else {
            expect(Object.keys(json).sort()).toEqual(['accepted', 'duplicate', 'event_id', 'job_id', 'project']);
            expect(json.duplicate).toBe(!json.accepted);
            expect(event).toBe('Push Hook');
            const sent = JSON.parse(p) as { checkout_sha: string };
            expect(String(json.event_id)).toBe(`scm:${String(json.project)}:refs/heads/main:${sent.checkout_sha}`);
            if (json.accepted === true) announcedDeploys.add(String(json.event_id));
          }
        }
      }),
      { numRuns: 300 },
    );
  }, 300_000);

  it('alerts: arbitrary alert lists (nested annotations, odd fingerprints) give 202 with the right counts, or 400/413/422', async () => {
    const annotations = fc.oneof(
      fc.dictionary(
        fc.oneof(fc.string({ maxLength: 10 }), fc.constantFrom('__proto__', 'constructor', 'summary')),
        fc.jsonValue({ maxDepth: 3 }),
      ),
      fc.integer({ min: 50, max: 3000 }).map((d) => JSON.parse(deepJson(d, 'object')) as unknown), // (deeper: see the 422 test below)
      fc.constant(null),
      fc.string(),
    );
    const alert = fc.record(
      {
        status: fc.oneof(fc.constantFrom('firing', 'resolved', 'FIRING', ''), fc.integer()),
        fingerprint: fc.oneof(fc.string({ minLength: 0, maxLength: 300 }), fc.integer(), fc.constant(null)),
        labels: fc.oneof(
          fc.record({ alertname: fc.oneof(fc.string({ maxLength: 2000 }), fc.integer()) }, { requiredKeys: [] }),
          fc.constant('x'),
        ),
        annotations,
      },
      { requiredKeys: [] },
    );
    await fc.assert(
      fc.asyncProperty(fc.array(fc.oneof(alert, fc.jsonValue({ maxDepth: 2 })), { maxLength: 8 }), async (alerts) => {
        const text = JSON.stringify({ alerts });
        const r = await send({ method: 'POST', path: '/webhook/alerts', headers: [['Content-Type', 'application/json']], body: text });
        expect([202, 400, 413, 422]).toContain(r.status);
        if (r.status === 202) {
          const objs = alerts.filter((a): a is Record<string, unknown> => typeof a === 'object' && a !== null && !Array.isArray(a));
          const firing = objs.filter((a) => a.status === 'firing');
          expect(JSON.parse(r.body)).toEqual({ received: alerts.length, firing: firing.length, job_ids: expect.any(Array) });
          for (const a of firing) if (typeof a.fingerprint === 'string' && a.fingerprint !== '') announcedAlerts.add(a.fingerprint);
        }
      }),
      { numRuns: 250 },
    );
  }, 300_000);

  it('deeply nested payloads are 422, never a 5xx (they used to blow the stack at enqueue: 503)', async () => {
    for (const d of [65, 5000, 30_000]) {
      const ann = deepJson(d, 'object');
      const r = await send({
        method: 'POST',
        path: '/webhook/alerts',
        headers: [['Content-Type', 'application/json']],
        body: `{"alerts":[{"status":"firing","fingerprint":"deep-${d}","labels":{"alertname":"Deep"},"annotations":${ann}}]}`,
      });
      expect(r.status).toBe(422);
      const s = await send({
        method: 'POST',
        path: '/webhook/scm',
        headers: scmHeaders(),
        body: `{"ref":"refs/heads/main","checkout_sha":"deep${d}","x":${ann}}`,
      });
      expect(s.status).toBe(422);
    }
  }, 60_000);

  it('bodies over BODY_LIMIT are 413 {detail}, whether or not they are JSON', async () => {
    const big = '{"a":"' + 'x'.repeat(300 * 1024) + '"}';
    expect((await send({ method: 'POST', path: '/webhook/scm', headers: scmHeaders(), body: big })).status).toBe(413);
    expect(
      (await send({ method: 'POST', path: '/webhook/alerts', headers: [['Content-Type', 'application/json']], body: big })).status,
    ).toBe(413);
    // Unauthenticated senders are refused before their body is read.
    expect((await send({ method: 'POST', path: '/webhook/scm', headers: [['X-Scm-Token', 'nope']], body: big })).status).toBe(403);
  }, 60_000);
});

describe('the queue after all of the above', () => {
  it('holds exactly the jobs the 202 answers announced, nothing else', async () => {
    expect(checked).toBeGreaterThan(1000);
    // the error answers named their conditions (each checked against its status above), among them
    // those the deterministic cases above always meet
    expect([...codesSeen]).toEqual(
      expect.arrayContaining(['payload_too_deep', 'payload_too_large', 'invalid_webhook_token', 'invalid_api_key']),
    );
    const q = inspectQueue(redis.url);
    try {
      const jobs = await q.all();
      const deploys = jobs.filter((j) => j.name === 'ops_worker.run_deploy_pipeline').map((j) => String(j.data.event_id));
      const notifies = jobs.filter((j) => j.name === 'ops_worker.notify_oncall').map((j) => String(j.data.fingerprint));
      expect(jobs.length).toBe(deploys.length + notifies.length);
      expect(deploys.length).toBe(new Set(deploys).size);
      expect(new Set(deploys)).toEqual(announcedDeploys);
      expect(notifies.length).toBe(new Set(notifies).size);
      expect(new Set(notifies)).toEqual(announcedAlerts);
    } finally {
      await q.close();
    }
    // And nothing the fuzz sent made the API log an unexpected error or exit.
    expect(api.exited).toBe(false);
    expect(api.logs().filter((l) => l.level === 'error')).toEqual([]);
    for (const line of api.lines)
      for (const s of SECRETS)
        expect({ line: line.slice(0, 400), leaked: line.includes(s) }).toEqual({ line: line.slice(0, 400), leaked: false });
  }, 60_000);
});
