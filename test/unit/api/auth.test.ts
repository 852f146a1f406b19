import { describe, expect, it } from '@jest/globals';
import express, { type RequestHandler } from 'express';
import request from 'supertest';
import {
  BASIC_CHALLENGE,
  refuseCrossSiteWrites,
  requireApiKey,
  requireBearer,
  requireBearerOrOperatorKey,
  requireOperatorKeyOrBasic,
  verifySender,
} from '../../../src/middleware/auth.js';
import { errorHandler } from '../../../src/middleware/errors.js';
import { parseApiKeyRoles, parseApiKeysFile } from '../../../src/api/apiKeys.js';
import { credentialId } from '../../../src/shared/crypto.js';
import { createHash, createHmac } from 'node:crypto';
import { silentLogger } from '../../../src/shared/logger.js';
import { createMetrics } from '../../../src/shared/metrics.js';

/** Each auth middleware alone: API keys, bearer token, Bull Board's operator check, webhook senders (in-process Express app, no Redis). */
function appWith(...guards: RequestHandler[]) {
  const metrics = createMetrics('api', 'test', { defaults: false });
  const app = express();
  app.post('/x', ...guards, (_req, res) => {
    res.json({ principal: res.locals.principal ?? null, role: res.locals.role ?? null });
  });
  app.use(errorHandler(silentLogger));
  return { app, metrics };
}

const keys = parseApiKeyRoles('ro:1:readonly,op-1:operator,op-2:operator');

describe('requireApiKey', () => {
  it('readonly endpoint: any configured key; principal is key:<id>', async () => {
    const metrics = createMetrics('api', 'test', { defaults: false });
    const { app } = appWith(requireApiKey(keys, metrics));
    for (const k of ['ro:1', 'op-1', 'op-2']) {
      const res = await request(app).post('/x').set('X-API-Key', k);
      expect(res.status).toBe(200);
      expect(res.body.principal).toBe(`key:${createHash('sha256').update(k).digest('hex').slice(0, 12)}`);
    }
  });
  it('operator endpoint: readonly key 403, operator keys 200, unknown 401', async () => {
    const metrics = createMetrics('api', 'test', { defaults: false });
    const { app } = appWith(requireApiKey(keys, metrics, 'operator'));
    expect((await request(app).post('/x').set('X-API-Key', 'ro:1')).status).toBe(403);
    expect((await request(app).post('/x').set('X-API-Key', 'op-2')).body.role).toBe('operator');
    expect((await request(app).post('/x').set('X-API-Key', 'ro')).status).toBe(401);
    const text = await metrics.registry.getSingleMetricAsString('opsgate_auth_failures_total');
    expect(text).toMatch(/scheme="api_key",reason="forbidden_role"} 1/);
    expect(text).toMatch(/scheme="api_key",reason="invalid"} 1/);
  });
  it('the header name is case-insensitive, the key is not', async () => {
    const metrics = createMetrics('api', 'test', { defaults: false });
    const guarded = appWith(requireApiKey(keys, metrics));
    expect((await request(guarded.app).post('/x').set('x-api-key', 'op-1')).status).toBe(200);
    expect((await request(guarded.app).post('/x').set('X-API-Key', 'OP-1')).status).toBe(401);
  });
});

describe('requireOperatorKeyOrBasic (Bull Board)', () => {
  const basic = (user: string, pass: string) => 'Basic ' + Buffer.from(`${user}:${pass}`).toString('base64');
  it('an operator key as X-API-Key or as the Basic password (any user name) -> 200', async () => {
    const metrics = createMetrics('api', 'test', { defaults: false });
    const { app } = appWith(requireOperatorKeyOrBasic(keys, metrics));
    for (const h of [{ 'X-API-Key': 'op-1' }, { Authorization: basic('anyone', 'op-2') }, { Authorization: basic('', 'op-1') }]) {
      const res = await request(app).post('/x').set(h);
      expect(res.status).toBe(200);
      expect(res.body.role).toBe('operator');
    }
  });
  it.each([
    ['nothing', {}, 'missing', 'basic'],
    ['a Bearer token', { Authorization: 'Bearer op-1' }, 'malformed', 'basic'],
    ['Basic without a colon', { Authorization: 'Basic ' + Buffer.from('op-1').toString('base64') }, 'malformed', 'basic'],
    ['Basic with an empty password', { Authorization: basic('op-1', '') }, 'invalid', 'basic'],
    ['Basic with an unknown key', { Authorization: basic('u', 'nope') }, 'invalid', 'basic'],
    ['an unknown X-API-Key', { 'X-API-Key': 'nope' }, 'invalid', 'api_key'],
  ])('%s -> 401 {detail, code} with the Basic challenge, counted', async (_name, h, reason, scheme) => {
    const metrics = createMetrics('api', 'test', { defaults: false });
    const { app } = appWith(requireOperatorKeyOrBasic(keys, metrics));
    const res = await request(app).post('/x').set(h);
    expect(res.status).toBe(401);
    expect(res.headers['www-authenticate']).toBe(BASIC_CHALLENGE);
    expect(Object.keys(res.body)).toEqual(['detail', 'code']);
    expect(res.body.code).toBe(
      { missing: 'missing_credentials', malformed: 'malformed_credentials', invalid: 'invalid_credentials' }[reason],
    );
    expect(res.text).not.toContain('op-1');
    const text = await metrics.registry.getSingleMetricAsString('opsgate_auth_failures_total');
    expect(text).toContain(`scheme="${scheme}",reason="${reason}"} 1`);
  });
  it('a readonly key -> 403 {detail: "operator role required", code: "operator_role_required"}', async () => {
    const metrics = createMetrics('api', 'test', { defaults: false });
    const { app } = appWith(requireOperatorKeyOrBasic(keys, metrics));
    for (const h of [{ 'X-API-Key': 'ro:1' }, { Authorization: basic('u', 'ro:1') }]) {
      const res = await request(app).post('/x').set(h);
      expect(res.status).toBe(403);
      expect(res.body).toEqual({ detail: 'operator role required', code: 'operator_role_required' });
    }
  });
  it('refuseCrossSiteWrites: a write from another site -> 403; same origin and scripts pass', async () => {
    const metrics = createMetrics('api', 'test', { defaults: false });
    const { app } = appWith(refuseCrossSiteWrites(metrics));
    for (const h of [
      { 'Sec-Fetch-Site': 'cross-site' },
      { 'Sec-Fetch-Site': 'same-site' },
      { Origin: 'https://evil.example' },
      { Origin: 'null' },
    ]) {
      const res = await request(app).post('/x').set(h);
      expect(res.status).toBe(403);
      expect(res.body).toEqual({ detail: 'cross-site request refused', code: 'cross_site_request' });
    }
    expect((await request(app).post('/x')).status).toBe(200);
    expect((await request(app).post('/x').set({ 'Sec-Fetch-Site': 'same-origin' })).status).toBe(200);
  });
});

describe('requireBearer', () => {
  const metrics = createMetrics('api', 'test', { defaults: false });
  const { app } = appWith(requireBearer('s3cr3t-token', metrics));
  it.each([['Bearer s3cr3t-token'], ['bearer s3cr3t-token'], ['BEARER    s3cr3t-token'], ['Bearer\ts3cr3t-token']])(
    '%j -> 200',
    async (h) => {
      expect((await request(app).post('/x').set('Authorization', h)).status).toBe(200);
    },
  );
  it.each([
    ['Token s3cr3t-token', 'scheme'],
    ['Bearers s3cr3t-token', 'scheme'],
    ['s3cr3t-token', 'scheme'],
    ['Bearer', 'missing'],
    ['Bearer s3cr3t', 'invalid'],
    ['Bearer s3cr3t-token2', 'invalid'],
  ])('%j -> 401 (%s) with WWW-Authenticate', async (h, reason) => {
    const res = await request(app).post('/x').set('Authorization', h);
    expect(res.status).toBe(401);
    expect(res.headers['www-authenticate']).toMatch(/^Bearer realm="opsgate"/);
    const text = await metrics.registry.getSingleMetricAsString('opsgate_auth_failures_total');
    expect(text).toContain(`scheme="bearer",reason="${reason}"`);
  });
  it('unset token: everything 401 not_configured', async () => {
    const m = createMetrics('api', 'test', { defaults: false });
    const unset = appWith(requireBearer(undefined, m));
    const res = await request(unset.app).post('/x').set('Authorization', 'Bearer anything');
    expect(res.status).toBe(401);
    expect(await m.registry.getSingleMetricAsString('opsgate_auth_failures_total')).toContain('reason="not_configured"');
  });
});

const tokenSource = { name: 'scm', title: 'Source control', verification: { kind: 'token', header: 'X-Scm-Token' } } as const;
const hmacSource = (prefix: string) =>
  ({ name: 'test', title: 'Test', verification: { kind: 'hmac', header: 'x-sig', algorithm: 'sha256', prefix, encoding: 'hex' } }) as const;

describe('verifySender: token', () => {
  it('missing/mismatch/unset -> 403; match -> principal webhook:scm', async () => {
    const m = createMetrics('api', 'test', { defaults: false });
    const check = verifySender({ source: tokenSource, secret: 'scm-s', metrics: m });
    const { app } = appWith(check.before, check.after);
    expect((await request(app).post('/x')).status).toBe(403);
    expect((await request(app).post('/x').set('X-Scm-Token', 'scm-S')).status).toBe(403);
    expect((await request(app).post('/x').set('X-Scm-Token', 'scm-s')).body.principal).toBe('webhook:scm');
    const unset = verifySender({ source: tokenSource, secret: undefined, metrics: m });
    expect((await request(appWith(unset.before).app).post('/x').set('X-Scm-Token', '')).status).toBe(403);
    const text = await m.registry.getSingleMetricAsString('opsgate_auth_failures_total');
    for (const r of ['missing', 'invalid', 'not_configured']) expect(text).toContain(`scheme="scm_token",reason="${r}"`);
  });
});

describe('verifySender: HMAC of the body', () => {
  it('with a sha256= prefix: presence and prefix checked before the body, the digest after it', async () => {
    const m = createMetrics('api', 'test', { defaults: false });
    const sig = verifySender({ source: hmacSource('sha256='), secret: 'k', metrics: m });
    const { app } = appWith(sig.before, express.raw({ type: () => true }), sig.after);
    const body = '{"a":1}';
    const good = 'sha256=' + createHmac('sha256', 'k').update(body).digest('hex');
    expect((await request(app).post('/x').set('x-sig', good).send(body)).body.principal).toBe('webhook:test');
    expect((await request(app).post('/x').set('x-sig', good.toUpperCase().replace('SHA256=', 'sha256=')).send(body)).status).toBe(200);
    expect((await request(app).post('/x').send(body)).status).toBe(403);
    expect((await request(app).post('/x').set('x-sig', good.slice(7)).send(body)).status).toBe(403);
    expect(
      (
        await request(app)
          .post('/x')
          .set('x-sig', good)
          .send(body + ' ')
      ).status,
    ).toBe(403);
    const text = await m.registry.getSingleMetricAsString('opsgate_auth_failures_total');
    for (const r of ['missing', 'malformed', 'mismatch']) expect(text).toContain(`scheme="signature",reason="${r}"`);
  });

  it("GitHub's documented test vector verifies", async () => {
    const m = createMetrics('api', 'test', { defaults: false });
    const sig = verifySender({ source: hmacSource('sha256='), secret: "It's a Secret to Everybody", metrics: m });
    const { app } = appWith(sig.before, express.raw({ type: () => true }), sig.after);
    const vector = 'sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17';
    expect((await request(app).post('/x').set('x-sig', vector).send('Hello, World!')).status).toBe(200);
  });

  it('without a prefix (Gitea): the bare hex digest', async () => {
    const m = createMetrics('api', 'test', { defaults: false });
    const sig = verifySender({ source: hmacSource(''), secret: 'k', metrics: m });
    const { app } = appWith(sig.before, express.raw({ type: () => true }), sig.after);
    const body = '{"b":2}';
    const hex = createHmac('sha256', 'k').update(body).digest('hex');
    expect((await request(app).post('/x').set('x-sig', hex).send(body)).status).toBe(200);
    expect(
      (
        await request(app)
          .post('/x')
          .set('x-sig', 'sha256=' + hex)
          .send(body)
      ).status,
    ).toBe(403);
  });
});

describe('verifySender: timestamped HMAC', () => {
  const source = {
    name: 'generic',
    title: 'Generic',
    verification: { kind: 'timestamped-hmac', header: 'x-sig', toleranceSeconds: 300 },
  } as const;
  const sign = (t: number, body: string) => `t=${t},v1=${createHmac('sha256', 'k').update(`${t}.${body}`).digest('hex')}`;
  it('signs "<t>.<body>"; a timestamp outside the window or a malformed header is 403 before the body is read', async () => {
    const m = createMetrics('api', 'test', { defaults: false });
    const now = 1_800_000_000_000;
    const sig = verifySender({ source, secret: 'k', metrics: m, now: () => now });
    const { app } = appWith(sig.before, express.raw({ type: () => true }), sig.after);
    const body = '{"sha":"1"}';
    const t = now / 1000;
    expect(
      (
        await request(app)
          .post('/x')
          .set('x-sig', sign(t - 299, body))
          .send(body)
      ).status,
    ).toBe(200);
    expect(
      (
        await request(app)
          .post('/x')
          .set('x-sig', sign(t - 301, body))
          .send(body)
      ).status,
    ).toBe(403);
    expect(
      (
        await request(app)
          .post('/x')
          .set('x-sig', sign(t + 301, body))
          .send(body)
      ).status,
    ).toBe(403);
    expect(
      (
        await request(app)
          .post('/x')
          .set('x-sig', sign(t, body).replace(`t=${t}`, `t=${t - 1}`))
          .send(body)
      ).status,
    ).toBe(403);
    expect((await request(app).post('/x').set('x-sig', 'v1=abc').send(body)).status).toBe(403);
    const text = await m.registry.getSingleMetricAsString('opsgate_auth_failures_total');
    for (const r of ['stale', 'malformed', 'mismatch']) expect(text).toContain(`scheme="signature",reason="${r}"`);
  });
});

describe('a secret in rotation: the current value and the previous one', () => {
  /** A guard's verdict and which value it noted for the audit line. */
  function appNoting(...guards: RequestHandler[]) {
    const app = express();
    app.post('/x', ...guards, (_req, res) => {
      res.json({ principal: res.locals.principal ?? null, matched: res.locals.matchedSecret ?? null });
    });
    app.use(errorHandler(silentLogger));
    return app;
  }
  let values: readonly string[] = ['new-secret-2', 'old-secret-1'];
  const live = () => values;
  const hmacHex = (secret: string, body: string) => createHmac('sha256', secret).update(body).digest('hex');

  it('token: either value is accepted and named (current, previous); a third is refused; a change applies to the next request', async () => {
    values = ['new-secret-2', 'old-secret-1'];
    const m = createMetrics('api', 'test', { defaults: false });
    const check = verifySender({ source: tokenSource, secret: live, metrics: m });
    const app = appNoting(check.before, check.after);
    expect((await request(app).post('/x').set('X-Scm-Token', 'new-secret-2')).body).toEqual({
      principal: 'webhook:scm',
      matched: 'current',
    });
    expect((await request(app).post('/x').set('X-Scm-Token', 'old-secret-1')).body).toEqual({
      principal: 'webhook:scm',
      matched: 'previous',
    });
    expect((await request(app).post('/x').set('X-Scm-Token', 'other')).status).toBe(403);
    values = ['new-secret-2'];
    expect((await request(app).post('/x').set('X-Scm-Token', 'old-secret-1')).status).toBe(403);
    expect((await request(app).post('/x').set('X-Scm-Token', 'new-secret-2')).body.matched).toBe('current');
  });

  it('HMAC of the body: a signature by either value verifies and is named; one by neither is a mismatch', async () => {
    values = ['new-secret-2', 'old-secret-1'];
    const m = createMetrics('api', 'test', { defaults: false });
    const sig = verifySender({ source: hmacSource('sha256='), secret: live, metrics: m });
    const app = appNoting(sig.before, express.raw({ type: () => true }), sig.after);
    const body = '{"rotation":true}';
    for (const [secret, matched] of [
      ['new-secret-2', 'current'],
      ['old-secret-1', 'previous'],
    ] as const) {
      const res = await request(app)
        .post('/x')
        .set('x-sig', `sha256=${hmacHex(secret, body)}`)
        .send(body);
      expect([secret, res.status, res.body.matched]).toEqual([secret, 200, matched]);
    }
    expect(
      (
        await request(app)
          .post('/x')
          .set('x-sig', `sha256=${hmacHex('third', body)}`)
          .send(body)
      ).status,
    ).toBe(403);
  });

  it('timestamped HMAC and bearer: either value, named', async () => {
    values = ['new-secret-2', 'old-secret-1'];
    const m = createMetrics('api', 'test', { defaults: false });
    const now = 1_800_000_000_000;
    const source = {
      name: 'generic',
      title: 'Generic',
      verification: { kind: 'timestamped-hmac', header: 'x-sig', toleranceSeconds: 300 },
    } as const;
    const sig = verifySender({ source, secret: live, metrics: m, now: () => now });
    const app = appNoting(sig.before, express.raw({ type: () => true }), sig.after);
    const t = now / 1000;
    const body = '{"sha":"2"}';
    const res = await request(app)
      .post('/x')
      .set('x-sig', `t=${t},v1=${hmacHex('old-secret-1', `${t}.${body}`)}`)
      .send(body);
    expect([res.status, res.body.matched]).toEqual([200, 'previous']);

    const alerts = { name: 'alerts', title: 'Alertmanager', verification: { kind: 'bearer', optional: true } } as const;
    const bearer = verifySender({ source: alerts, secret: live, metrics: m });
    const bapp = appNoting(bearer.before, bearer.after);
    expect((await request(bapp).post('/x').set('Authorization', 'Bearer new-secret-2')).body.matched).toBe('current');
    expect((await request(bapp).post('/x').set('Authorization', 'Bearer old-secret-1')).body.matched).toBe('previous');
    expect((await request(bapp).post('/x').set('Authorization', 'Bearer neither')).status).toBe(401);
  });

  it('a fixed secret (OPS_BEARER_TOKEN) notes no match: only senders say which value matched', async () => {
    const m = createMetrics('api', 'test', { defaults: false });
    const app = appNoting(requireBearer('fixed-token-123', m));
    expect((await request(app).post('/x').set('Authorization', 'Bearer fixed-token-123')).body.matched).toBeNull();
  });
});

describe('who holds the credential: res.locals.owner and ownerKnown', () => {
  /** What the auth checks leave for the routes: the identity and the credential id. */
  function appWho(...guards: RequestHandler[]) {
    const app = express();
    app.post('/x', ...guards, (_req, res) => {
      const { principal, owner, ownerKnown, credential } = res.locals;
      res.json({ principal, owner, ownerKnown, credential });
    });
    app.use(errorHandler(silentLogger));
    return app;
  }
  const fileKeys = parseApiKeysFile(
    '- { id: alice-laptop, role: operator, key: alice-key-0001, owner: alice@example.com }\n- { id: ci, role: operator, key: ci-key-0001 }\n',
    keys,
  );
  const all = [...keys, ...fileKeys];
  const basic = (pass: string) => 'Basic ' + Buffer.from(`u:${pass}`).toString('base64');

  it('an API key: key:<id> with its owner (a keys-file owner, else its id; env:<id> for OPS_API_KEY_ROLES), known', async () => {
    const m = createMetrics('api', 'test', { defaults: false });
    for (const app of [appWho(requireApiKey(all, m)), appWho(requireOperatorKeyOrBasic(all, m))]) {
      expect((await request(app).post('/x').set('X-API-Key', 'alice-key-0001')).body).toEqual({
        principal: 'key:alice-laptop',
        owner: 'alice@example.com',
        ownerKnown: true,
        credential: credentialId('alice-key-0001'),
      });
      expect((await request(app).post('/x').set('X-API-Key', 'ci-key-0001')).body).toMatchObject({ owner: 'ci', ownerKnown: true });
      expect((await request(app).post('/x').set('X-API-Key', 'op-1')).body).toEqual({
        principal: `key:${credentialId('op-1')}`,
        owner: `env:${credentialId('op-1')}`,
        ownerKnown: true,
        credential: credentialId('op-1'),
      });
    }
    const viaBasic = await request(appWho(requireOperatorKeyOrBasic(all, m)))
      .post('/x')
      .set('Authorization', basic('alice-key-0001'));
    expect(viaBasic.body).toMatchObject({ principal: 'key:alice-laptop', owner: 'alice@example.com', ownerKnown: true });
  });

  it('the bearer token: OPS_BEARER_TOKEN_OWNER names it, else bearer:<credential id>; no known person either way', async () => {
    const m = createMetrics('api', 'test', { defaults: false });
    const id = credentialId('bearer-token-0001');
    const owned = appWho(requireBearerOrOperatorKey(all, 'bearer-token-0001', m, {}, 'ci:deploy-bot'));
    const unowned = appWho(requireBearerOrOperatorKey(all, 'bearer-token-0001', m));
    const bearer = { Authorization: 'Bearer bearer-token-0001' };
    expect((await request(owned).post('/x').set(bearer)).body).toEqual({
      principal: `bearer:${id}`,
      owner: 'ci:deploy-bot',
      ownerKnown: false,
      credential: id,
    });
    expect((await request(unowned).post('/x').set(bearer)).body).toEqual({
      principal: `bearer:${id}`,
      owner: `bearer:${id}`,
      ownerKnown: false,
      credential: id,
    });
    expect(
      (
        await request(appWho(requireBearer('bearer-token-0001', m)))
          .post('/x')
          .set(bearer)
      ).body.ownerKnown,
    ).toBe(false);
    // An operator's own key on the same route is that key's owner, whatever the bearer token's is.
    expect((await request(owned).post('/x').set('X-API-Key', 'alice-key-0001')).body).toMatchObject({
      owner: 'alice@example.com',
      ownerKnown: true,
    });
  });

  it('a webhook sender is webhook:<sender>, its own owner: known once its proof is checked, unknown while /webhook/alerts runs open', async () => {
    const m = createMetrics('api', 'test', { defaults: false });
    const token = verifySender({ source: tokenSource, secret: 'scm-s', metrics: m });
    expect((await request(appWho(token.before, token.after)).post('/x').set('X-Scm-Token', 'scm-s')).body).toEqual({
      principal: 'webhook:scm',
      owner: 'webhook:scm',
      ownerKnown: true,
    });
    const alerts = { name: 'alerts', title: 'Alertmanager', verification: { kind: 'bearer', optional: true } } as const;
    const withToken = verifySender({ source: alerts, secret: 'alerts-token-0001', metrics: m });
    expect(
      (await request(appWho(withToken.before, withToken.after)).post('/x').set('Authorization', 'Bearer alerts-token-0001')).body,
    ).toEqual({ principal: 'webhook:alerts', owner: 'webhook:alerts', ownerKnown: true, credential: credentialId('alerts-token-0001') });
    const open = verifySender({ source: alerts, secret: undefined, metrics: m });
    expect((await request(appWho(open.before, open.after)).post('/x')).body).toEqual({
      principal: 'webhook:alerts',
      owner: 'webhook:alerts',
      ownerKnown: false,
    });
  });
});
