import { afterAll, beforeEach, describe, expect, it } from '@jest/globals';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import request from 'supertest';
import { credentialId } from '../../../src/shared/crypto.js';
import { API_KEY_LAST_USED_KEY } from '../../../src/shared/keys.js';
import { createHarness, OP_KEY, OP_KEY_2, RO_KEY, useHarness, type Harness } from '../../helpers/apiHarness.js';

/**
 * Keys with a lifetime, on a real Redis through real HTTP, with the app's clock in the test's hand:
 * OPS_API_KEYS_FILE beside OPS_API_KEY_ROLES; Deprecation and Sunset on every answer to a key close
 * to its expiry, a warning in the audit line; 401 naming the key past it; last use shared through
 * Redis and written at most once a minute per key and process; the metrics; GET /ops/keys.
 */
const DAY = 86_400_000;
const T0 = Date.parse('2026-03-01T00:00:00Z');
let clock = T0;
const now = () => clock;

const SOON = 'soon-operator-key-0123456789'; // 10 days from expiry at T0
const LATER = 'later-readonly-key-0123456789'; // 90 days, configured by its hash
const GONE = 'gone-operator-key-0123456789'; // expires 1 hour after T0
const FOREVER = 'forever-readonly-key-0123456789'; // no expiry, by its hash
const sha = (s: string) => createHash('sha256').update(s).digest('hex');
const SOON_EXPIRES = '2026-03-11T00:00:00Z';
const LATER_EXPIRES = '2026-05-30T00:00:00Z';
const GONE_EXPIRES = '2026-03-01T01:00:00Z';

const dir = mkdtempSync(join(tmpdir(), 'opsgate-keylife-'));
const keysFile = join(dir, 'api-keys.yaml');
writeFileSync(
  keysFile,
  `- { id: soon, role: operator, key: ${SOON}, expires: ${SOON_EXPIRES} }
- { id: later, role: readonly, sha256: ${sha(LATER)}, expires: ${LATER_EXPIRES} }
- { id: gone, role: operator, key: ${GONE}, expires: ${GONE_EXPIRES} }
- { id: forever, role: readonly, sha256: ${sha(FOREVER)} }
`,
);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const ENV = { OPS_API_KEYS_FILE: keysFile, ADMIN_UI_ENABLED: 'true' };
const ctx = useHarness({ env: ENV, now });
beforeEach(() => {
  clock = T0;
});

const get = (path: string, key?: string) => {
  const r = request(ctx.h.app).get(path);
  return key === undefined ? r : r.set('X-API-Key', key);
};
const secs = (iso: string) => Date.parse(iso) / 1000;
/** The last-use score, read on the app's own connection (after its writes, in order). */
const lastUse = async (h: Harness, id: string) => {
  const s = await h.redis.zscore(API_KEY_LAST_USED_KEY, id);
  return s === null ? null : Number(s);
};
/**
 * A fresh app on the file's Redis (emptied before each test): a process remembers which key it
 * wrote in the last minute, so tests of last use start with a process that wrote none.
 */
async function withApp(fn: (h: Harness) => Promise<void>, at: () => number = now): Promise<void> {
  const h = await createHarness(ctx.srv.url, { env: ENV, now: at });
  try {
    await fn(h);
  } finally {
    await h.close();
  }
}

describe('a key close to its expiry', () => {
  it('a key 10 days from expiry works, and every answer carries Deprecation (@seconds) and Sunset (HTTP-date)', async () => {
    for (const [path, status] of [
      ['/ops/hosts', 200],
      ['/ops/hosts/nope', 404],
      ['/ops/jobs?state=nope', 422],
    ] as const) {
      const res = await get(path, SOON);
      expect([path, res.status]).toEqual([path, status]);
      expect(res.headers.deprecation).toBe(`@${secs(SOON_EXPIRES)}`);
      expect(res.headers.sunset).toBe('Wed, 11 Mar 2026 00:00:00 GMT');
    }
  });

  it('a readonly key in its window gets the headers on a 403 too', async () => {
    clock = Date.parse(LATER_EXPIRES) - 14 * DAY; // exactly API_KEY_EXPIRY_WARNING_DAYS (14) before
    const res = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', LATER);
    expect(res.status).toBe(403);
    expect(res.headers.sunset).toBe('Sat, 30 May 2026 00:00:00 GMT');
  });

  it('keys outside the window, without an expiry, or from OPS_API_KEY_ROLES get neither header', async () => {
    clock = Date.parse(LATER_EXPIRES) - 14 * DAY - 1000;
    for (const key of [LATER, FOREVER, RO_KEY, OP_KEY]) {
      const res = await get('/ops/hosts', key);
      expect(res.status).toBe(200);
      expect(res.headers.deprecation).toBeUndefined();
      expect(res.headers.sunset).toBeUndefined();
    }
  });

  it('the audit line of a state-changing call names the key and its expiry in a warning', async () => {
    const res = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', SOON);
    expect(res.status).toBe(200);
    const line = ctx.h.audits().find((a) => a.request_id === res.headers['x-request-id'])!;
    expect(line).toMatchObject({ who: 'key:soon', role: 'operator', status: 200, warning: `API key soon expires at ${SOON_EXPIRES}` });
    const quiet = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', OP_KEY);
    expect(ctx.h.audits().find((a) => a.request_id === quiet.headers['x-request-id'])!.warning).toBeUndefined();
  });

  it('API_KEY_EXPIRY_WARNING_DAYS sets the window', async () => {
    const h = await createHarness(ctx.srv.url, { env: { ...ENV, API_KEY_EXPIRY_WARNING_DAYS: '7' }, now });
    try {
      expect((await request(h.app).get('/ops/hosts').set('X-API-Key', SOON)).headers.sunset).toBeUndefined();
      clock = Date.parse(SOON_EXPIRES) - 7 * DAY;
      expect((await request(h.app).get('/ops/hosts').set('X-API-Key', SOON)).headers.sunset).toBe('Wed, 11 Mar 2026 00:00:00 GMT');
    } finally {
      await h.close();
    }
  });
});

describe('a key past its expiry', () => {
  it('works until its expiry, then gets 401 naming the key and the time, counted as expired', async () => {
    clock = Date.parse(GONE_EXPIRES) - 1;
    expect((await get('/ops/hosts', GONE)).status).toBe(200);
    clock = Date.parse(GONE_EXPIRES);
    const before = await ctx.h.metrics.registry.getSingleMetricAsString('opsgate_auth_failures_total');
    const res = await get('/ops/hosts', GONE);
    expect(res.status).toBe(401);
    expect(res.body).toEqual({ detail: `API key gone expired at ${GONE_EXPIRES}`, code: 'api_key_expired' });
    expect(res.headers.sunset).toBeUndefined();
    const count = (t: string) => Number(/scheme="api_key",reason="expired"} (\d+)/.exec(t)?.[1] ?? 0);
    expect(count(await ctx.h.metrics.registry.getSingleMetricAsString('opsgate_auth_failures_total'))).toBe(count(before) + 1);
  });

  it('its audit line names the refused key by id, never the key', async () => {
    clock = T0 + DAY;
    const res = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', GONE);
    expect(res.status).toBe(401);
    const line = ctx.h.audits().find((a) => a.request_id === res.headers['x-request-id'])!;
    expect(line).toMatchObject({ who: 'anonymous', presented_credential: 'key:gone', status: 401 });
    expect(ctx.h.lines.join('\n')).not.toContain(GONE);
  });

  it('Bull Board refuses it like an unknown key', async () => {
    // Bull Board judges by the process clock, and this key's expiry is in the past of any clock running this test.
    expect(Date.now()).toBeGreaterThan(Date.parse(GONE_EXPIRES));
    expect((await get('/admin/queues', GONE)).status).toBe(401);
    expect((await get('/admin/queues', OP_KEY)).status).toBe(200);
  });
});

describe('keys by hash', () => {
  it('the key of a sha256 entry works; its hash, presented as a key, does not', async () => {
    expect((await get('/ops/hosts', FOREVER)).status).toBe(200);
    expect((await get('/ops/hosts', sha(FOREVER))).status).toBe(401);
    expect((await get('/ops/hosts', FOREVER.toUpperCase())).status).toBe(401);
  });
});

describe('last use', () => {
  it('is written to Redis at most once per key per minute per process', () =>
    withApp(async (h) => {
      const use = () => request(h.app).get('/ops/hosts').set('X-API-Key', FOREVER);
      await h.redis.config('RESETSTAT');
      for (let i = 0; i < 20; i++) expect((await use()).status).toBe(200);
      const zadds = (info: string) => Number(/^cmdstat_zadd:calls=(\d+)/m.exec(info)?.[1] ?? 0);
      expect(zadds(await h.redis.info('commandstats'))).toBe(1);
      expect(await lastUse(h, 'forever')).toBe(T0 / 1000);
      clock = T0 + 59_000;
      await use();
      expect(await lastUse(h, 'forever')).toBe(T0 / 1000);
      clock = T0 + 60_000;
      await use();
      expect(await lastUse(h, 'forever')).toBe(T0 / 1000 + 60);
    }));

  it('is shared by replicas, and a replica whose clock is behind never moves it back', () =>
    withApp(async (ahead) => {
      clock = T0 + 10 * 60_000;
      expect((await request(ahead.app).get('/ops/hosts').set('X-API-Key', RO_KEY)).status).toBe(200);
      await withApp(
        async (behind) => {
          expect((await request(behind.app).get('/ops/hosts').set('X-API-Key', RO_KEY)).status).toBe(200);
          const id = credentialId(RO_KEY);
          expect(await lastUse(behind, id)).toBe((T0 + 10 * 60_000) / 1000);
          // What one replica recorded, the other lists and exports.
          expect((await request(behind.app).get('/ops/keys').set('X-API-Key', OP_KEY)).body.keys).toEqual(
            expect.arrayContaining([expect.objectContaining({ id, last_used: '2026-03-01T00:10:00Z' })]),
          );
          const text = await behind.metrics.registry.getSingleMetricAsString('opsgate_api_key_last_used_timestamp_seconds');
          expect(text).toContain(`opsgate_api_key_last_used_timestamp_seconds{key_id="${id}"} ${(T0 + 10 * 60_000) / 1000}`);
        },
        () => T0 + 5 * 60_000,
      );
    }));
});

describe('metrics', () => {
  it('expiry of the keys that have one, last use of configured keys only', () =>
    withApp(async (h) => {
      await request(h.app).get('/ops/hosts').set('X-API-Key', SOON);
      await h.inspect.zadd(API_KEY_LAST_USED_KEY, T0 / 1000, 'a-removed-key');
      const text = await h.metrics.registry.metrics();
      const series = (name: string) => text.split('\n').filter((l) => l.startsWith(`${name}{`));
      expect(series('opsgate_api_key_expiry_timestamp_seconds').sort()).toEqual(
        [
          `opsgate_api_key_expiry_timestamp_seconds{key_id="gone"} ${secs(GONE_EXPIRES)}`,
          `opsgate_api_key_expiry_timestamp_seconds{key_id="later"} ${secs(LATER_EXPIRES)}`,
          `opsgate_api_key_expiry_timestamp_seconds{key_id="soon"} ${secs(SOON_EXPIRES)}`,
        ].sort(),
      );
      expect(series('opsgate_api_key_last_used_timestamp_seconds')).toEqual([
        `opsgate_api_key_last_used_timestamp_seconds{key_id="soon"} ${T0 / 1000}`,
      ]);
    }));
});

describe('GET /ops/keys (operator)', () => {
  it('lists id, owner, role, source, expiry, status and last use; never a key or a hash', () =>
    withApp(async (h) => {
      clock = T0 + 30 * 60_000;
      await request(h.app).get('/ops/hosts').set('X-API-Key', LATER);
      const res = await request(h.app).get('/ops/keys').set('X-API-Key', SOON);
      expect(res.status).toBe(200);
      expect(res.headers.sunset).toBeDefined(); // the caller's own key is close to its expiry
      const used = '2026-03-01T00:30:00Z';
      expect(res.body).toEqual({
        keys: [
          {
            id: credentialId(RO_KEY),
            owner: `env:${credentialId(RO_KEY)}`,
            role: 'readonly',
            source: 'env',
            expires: null,
            status: 'active',
            last_used: null,
            scope: null,
          },
          {
            id: credentialId(OP_KEY),
            owner: `env:${credentialId(OP_KEY)}`,
            role: 'operator',
            source: 'env',
            expires: null,
            status: 'active',
            last_used: null,
            scope: null,
          },
          {
            id: credentialId(OP_KEY_2),
            owner: `env:${credentialId(OP_KEY_2)}`,
            role: 'operator',
            source: 'env',
            expires: null,
            status: 'active',
            last_used: null,
            scope: null,
          },
          {
            id: 'soon',
            owner: 'soon',
            role: 'operator',
            source: 'file',
            expires: SOON_EXPIRES,
            status: 'expiring',
            last_used: used,
            scope: null,
          },
          {
            id: 'later',
            owner: 'later',
            role: 'readonly',
            source: 'file',
            expires: LATER_EXPIRES,
            status: 'active',
            last_used: used,
            scope: null,
          },
          {
            id: 'gone',
            owner: 'gone',
            role: 'operator',
            source: 'file',
            expires: GONE_EXPIRES,
            status: 'expiring',
            last_used: null,
            scope: null,
          },
          {
            id: 'forever',
            owner: 'forever',
            role: 'readonly',
            source: 'file',
            expires: null,
            status: 'active',
            last_used: null,
            scope: null,
          },
        ],
        oidc_issuers: [],
        next_cursor: null,
      });
      // paged in the order of the configuration
      const first = await request(h.app).get('/ops/keys?limit=4').set('X-API-Key', SOON);
      expect(first.body.keys.map((k: { id: string }) => k.id)).toEqual(res.body.keys.slice(0, 4).map((k: { id: string }) => k.id));
      const rest = await request(h.app)
        .get(`/ops/keys?limit=4&cursor=${encodeURIComponent(first.body.next_cursor)}`)
        .set('X-API-Key', SOON);
      expect(rest.body).toEqual({ keys: res.body.keys.slice(4), oidc_issuers: [], next_cursor: null });
      clock = T0 + DAY;
      expect((await request(h.app).get('/ops/keys').set('X-API-Key', SOON)).body.keys[5]).toMatchObject({ id: 'gone', status: 'expired' });
      for (const secret of [RO_KEY, OP_KEY, OP_KEY_2, SOON, LATER, GONE, FOREVER]) {
        expect(res.text).not.toContain(secret);
        expect(res.text).not.toContain(sha(secret));
      }
    }));

  it('a readonly key 403, no key 401, an expired operator key 401', async () => {
    expect((await get('/ops/keys', RO_KEY)).status).toBe(403);
    expect((await get('/ops/keys')).status).toBe(401);
    clock = T0 + DAY;
    expect((await get('/ops/keys', GONE)).status).toBe(401);
  });
});
