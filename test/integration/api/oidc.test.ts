import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SignJWT } from 'jose';
import request from 'supertest';
import { createOidcVerifier } from '../../../src/middleware/oidc.js';
import { loadApiConfig } from '../../../src/api/config.js';
import { watchCredentials } from '../../../src/api/credentialReload.js';
import { createSenderSecrets } from '../../../src/shared/liveSecrets.js';
import { createLogger } from '../../../src/shared/logger.js';
import { JOB } from '../../../src/shared/jobs.js';
import { createDeployHistory } from '../../../src/changes/deployOrder/history.js';
import { parseOidcFile } from '../../../src/api/oidcConfig.js';
import { BEARER, OP_KEY, RO_KEY, SCM_SECRET, baseEnv, createHarness, type Harness } from '../../helpers/apiHarness.js';
import { makeCa, makeLeaf, type Pem } from '../../helpers/certs.js';
import { githubClaims, gitlabClaims, kubernetesClaims, startIssuer, type LocalIssuer } from '../../helpers/oidcIssuer.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { waitFor } from '../../helpers/waitFor.js';

/**
 * Keyless callers on real parts: issuers served over HTTPS on 127.0.0.1 by this test (discovery
 * and JWKS, keys made with jose, a certificate of a CA the test made, trusted through ca_file),
 * tokens shaped like GitHub's and GitLab's documented claims, a real Redis and the real app.
 */
const dir = mkdtempSync(join(tmpdir(), 'opsgate-oidc-'));
let ca: Pem;
let gh: LocalIssuer; // kind github, RS256
let gl: LocalIssuer; // kind gitlab, ES256
let down: LocalIssuer; // listed, stopped before the tests: unreachable
let srv: RedisServer;
let h: Harness; // OPS_BEARER_TOKEN set
let keyless: Harness; // OPS_BEARER_TOKEN unset
const caFile = join(dir, 'ca.pem');
const oidcFile = join(dir, 'oidc.yaml');
const keysFile = join(dir, 'keys.yaml');
const SAME_OWNER_KEY = 'same-owner-key-0101-abcdef';
const SCOPED_KEY = 'scoped-key-0102-abcdef';
const ALICE_KEY = 'alice-key-0103-abcdef';
const SHA = 'e1c5b7a0f9d3c2b1a0e9d8c7b6a5f4e3d2c1b0a9';
const OTHER_SHA = '0000000000000000000000000000000000000001';

const INVENTORY = `
hosts:
  web-1: {namespace: shop, deployments: [frontend, checkout]}
  db-1: {namespace: data, deployments: [postgres-exporter]}
  pay-1:
    namespace: pay
    deployments: [api]
    policy: {approval: {required: 1, ttl: 1h}}
projects:
  acme/storefront: {namespace: deploys, serviceAccountName: deployer, image: alpine:3.20, deploy_from: ci}
  acme/shop: {namespace: deploys, serviceAccountName: deployer, image: alpine:3.20, deploy_from: both}
  acme/legacy: {namespace: deploys, serviceAccountName: deployer, image: alpine:3.20}
  acme/guarded:
    {namespace: deploys, serviceAccountName: deployer, image: alpine:3.20, deploy_from: ci, policy: {approval: {required: 1, ttl: 1h}}}
`;

const oidcYaml = () => `
issuers:
  - issuer: ${gh.url}
    kind: github
    audience: opsgate
    ca_file: ${caFile}
    jwks_cooldown_seconds: 1
    rules:
      - name: storefront-main
        match: {repository: acme/storefront, ref: refs/heads/main}
        owner: "github:{repository}"
        person: "{actor}"
        role: operator
        scope: {projects: [acme/storefront, acme/legacy], hosts: [web-1, pay-1]}
      - name: storefront-hotfix
        match: {repository: acme/storefront, ref: refs/heads/hotfix}
        owner: "github:{repository}"
        person: "{actor}"
        may_override: true
        role: operator
        scope: {hosts: [web-1]}
      - name: storefront-readonly
        match: {repository: acme/storefront, ref: "glob:refs/heads/release/*"}
        owner: "github:{repository}"
        role: readonly
  - issuer: ${gl.url}
    kind: gitlab
    audience: opsgate
    ca_file: ${caFile}
    max_token_age: 60
    rules:
      - name: shop-protected
        match: {project_path: "glob:acme/*", ref_protected: "true", ref: "re:refs/heads/(main|hotfix-.+)"}
        owner: "gitlab:{project_path}"
        role: operator
        scope: {projects: ["{project_path}"]}
  - issuer: ${down.url}
    kind: generic
    audience: opsgate
    ca_file: ${caFile}
    rules:
      - {match: {sub: ci-bot}, owner_claim: sub, owner: ci-bot, role: operator}
`;

beforeAll(async () => {
  ca = makeCa(dir, 'oidc-test-ca');
  const leaf = makeLeaf(dir, ca, 'issuer');
  writeFileSync(caFile, ca.cert);
  gh = await startIssuer(leaf, 'RS256');
  gl = await startIssuer(leaf, 'ES256');
  down = await startIssuer(leaf, 'RS256');
  await down.stop();
  writeFileSync(oidcFile, oidcYaml());
  writeFileSync(
    keysFile,
    `- {id: same-owner, role: operator, key: ${SAME_OWNER_KEY}, owner: "github:acme/storefront"}\n` +
      `- {id: scoped, role: operator, key: ${SCOPED_KEY}, scope: {hosts: [web-1], projects: [acme/shop]}}\n` +
      `- {id: alice-laptop, role: operator, key: ${ALICE_KEY}, owner: alice}\n`,
  );
  srv = await startRedis();
  const env = { OPS_OIDC_FILE: oidcFile, OPS_API_KEYS_FILE: keysFile, ADMIN_UI_ENABLED: 'true' };
  h = await createHarness(srv.url, { env, inventoryYaml: INVENTORY });
  keyless = await createHarness(srv.url, { env: { ...env, OPS_BEARER_TOKEN: '', OPS_BEARER_TOKEN_OWNER: '' }, inventoryYaml: INVENTORY });
});
afterAll(async () => {
  await h?.close();
  await keyless?.close();
  await gh?.stop();
  await gl?.stop();
  await srv?.destroy();
  rmSync(dir, { recursive: true, force: true });
});
beforeEach(async () => {
  await h.inspect.flushall();
  await h.freezesFlushed();
  await keyless.freezesFlushed();
});

const restart = (app: Harness['app'], query: string, token: string) =>
  request(app).post(`/ops/restart?${query}`).set('Authorization', `Bearer ${token}`);
const deploy = (token: string, body?: Record<string, unknown>, headers: Record<string, string> = {}) => {
  const r = request(h.app).post('/ops/deploys').set('Authorization', `Bearer ${token}`).set(headers);
  return body === undefined ? r : r.set('Content-Type', 'application/json').send(JSON.stringify(body));
};
const verifications = async (issuer: string, result: string): Promise<number> => {
  const m = await h.metrics.oidcVerifications.get();
  return m.values.find((v) => v.labels.issuer === issuer && v.labels.result === result)?.value ?? 0;
};
const lastAudit = (hh: Harness, path: string) =>
  hh
    .audits()
    .filter((a) => a.path === path)
    .at(-1)!;

describe('POST /ops/restart with an OIDC token', () => {
  it('a GitHub token its rule admits restarts a host of its scope; the owner and the audit line come from the claims', async () => {
    const before = await verifications(gh.url, 'accepted');
    const claims = githubClaims();
    const res = await restart(h.app, 'host=web-1&service=frontend', await gh.sign(claims));
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ host: 'web-1', service: 'frontend', status: 'submitted' });
    const job = await h.queue.bull.getJob(res.body.job_id);
    expect(job?.data).toMatchObject({
      requested_owner: 'github:acme/storefront',
      requested_by: `oidc:${new URL(gh.url).host}:${String(claims.sub)}`,
    });
    const audit = lastAudit(h, '/ops/restart');
    expect(audit).toMatchObject({
      status: 200,
      owner: 'github:acme/storefront',
      oidc: { issuer: gh.url, subject: claims.sub, rule: 'storefront-main', jti: claims.jti },
    });
    expect(JSON.stringify(h.logs())).not.toContain((await gh.sign(claims)).split('.')[2]);
    expect(await verifications(gh.url, 'accepted')).toBe(before + 1);
  });

  it('is accepted without OPS_BEARER_TOKEN, where any other bearer call keeps the contract: 401 not configured', async () => {
    const ok = await restart(keyless.app, 'host=web-1&service=checkout', await gh.sign(githubClaims()));
    expect(ok.status).toBe(200);
    const shared = await restart(keyless.app, 'host=web-1&service=checkout', BEARER);
    expect([shared.status, shared.body.code]).toEqual([401, 'bearer_not_configured']);
  });

  it('the shared bearer token is compared first and still works beside OIDC', async () => {
    const res = await restart(h.app, 'host=db-1&service=postgres-exporter', BEARER);
    expect(res.status).toBe(200);
    expect(lastAudit(h, '/ops/restart').oidc).toBeUndefined();
  });

  it('a GitLab token (ES256): its bare ref is read as refs/heads/<branch> by the rules', async () => {
    // The rule's scope names its own project only: a restart is outside it.
    const res = await restart(h.app, 'host=web-1&service=frontend', await gl.sign(gitlabClaims()));
    expect([res.status, res.body.code]).toEqual([403, 'out_of_scope']);
    expect(lastAudit(h, '/ops/restart').oidc).toMatchObject({ issuer: gl.url, rule: 'shop-protected' });
    const feature = await restart(h.app, 'host=web-1&service=frontend', await gl.sign(gitlabClaims({ ref: 'feature-x' })));
    expect([feature.status, feature.body.code]).toEqual([403, 'oidc_no_matching_rule']);
  });

  it.each([
    [
      'expired',
      () =>
        gh.sign(
          githubClaims({
            iat: Math.floor(Date.now() / 1000) - 900,
            nbf: Math.floor(Date.now() / 1000) - 900,
            exp: Math.floor(Date.now() / 1000) - 300,
          }),
        ),
      'expired',
    ],
    ['for another audience', () => gh.sign(githubClaims({ aud: 'https://vault.example.com' })), 'audience'],
    ['not yet valid', () => gh.sign(githubClaims({ nbf: Math.floor(Date.now() / 1000) + 600 })), 'claims'],
    ['issued in the future', () => gh.sign(githubClaims({ iat: Math.floor(Date.now() / 1000) + 600 })), 'claims'],
    [
      'signed by a key the issuer does not hold under a kid it publishes',
      async () => {
        const stranger = await gh.newKey('RS256', false);
        return gh.sign(githubClaims(), { ...stranger, kid: gh.keys[0]!.kid });
      },
      'signature',
    ],
    [
      'alg none',
      async () => {
        const enc = (o: unknown) => Buffer.from(JSON.stringify(o)).toString('base64url');
        return `${enc({ alg: 'none', typ: 'JWT' })}.${enc({ iss: gh.url, ...githubClaims() })}.`;
      },
      'algorithm',
    ],
    [
      'HS256 signed with the public key',
      async () =>
        new SignJWT({ iss: gh.url, ...githubClaims() })
          .setProtectedHeader({ alg: 'HS256', kid: gh.keys[0]!.kid })
          .sign(new TextEncoder().encode(gh.keys[0]!.spki)),
      'algorithm',
    ],
  ])('a token %s: 401 invalid_oidc_token, counted', async (_name, make, result) => {
    const before = await verifications(gh.url, result);
    const res = await restart(h.app, 'host=web-1&service=frontend', await make());
    expect([res.status, res.body.code]).toEqual([401, 'invalid_oidc_token']);
    expect(res.headers['www-authenticate']).toMatch(/^Bearer /);
    expect(await verifications(gh.url, result)).toBe(before + 1);
    expect(await h.queue.bull.getJobCounts('waiting')).toEqual({ waiting: 0 });
  });

  it('a token of an issuer not on the list is no OIDC token: the contract answers it (401 invalid bearer token)', async () => {
    const outsider = await startIssuer(makeLeaf(dir, ca, 'outsider'), 'RS256');
    try {
      const res = await restart(h.app, 'host=web-1&service=frontend', await outsider.sign(githubClaims()));
      expect([res.status, res.body.code]).toEqual([401, 'invalid_bearer_token']);
      expect(outsider.hits).toEqual({});
      expect(await verifications('unlisted', 'unknown_issuer')).toBeGreaterThan(0);
    } finally {
      await outsider.stop();
    }
  });

  it('an unknown kid is refused until the issuer publishes it, then accepted (JWKS fetched again after the cooldown)', async () => {
    // The JWKS is cached from the tests above.
    expect(await restart(h.app, 'host=web-1&service=frontend', await gh.sign(githubClaims()))).toHaveProperty('status', 200);
    const next = await gh.newKey('ES256', false);
    const before = await restart(h.app, 'host=web-1&service=frontend', await gh.sign(githubClaims(), next));
    expect([before.status, before.body.code]).toEqual([401, 'invalid_oidc_token']);
    expect(before.body.detail).toMatch(/key/);
    gh.publish(next);
    const fetched = gh.hits['/keys'] ?? 0;
    await waitFor(
      'the rotated key accepted',
      async () => (await restart(h.app, 'host=web-1&service=frontend', await gh.sign(githubClaims(), next))).status === 200,
      10_000,
      250,
    );
    expect(gh.hits['/keys']).toBeGreaterThan(fetched);
  });

  it('an issuer that cannot be reached fails closed: 503 with Retry-After, never an accept', async () => {
    const token = await new SignJWT({ iss: down.url, sub: 'ci-bot', aud: 'opsgate' })
      .setProtectedHeader({ alg: 'RS256', kid: down.keys[0]!.kid })
      .setIssuedAt()
      .setExpirationTime('5m')
      .sign(down.keys[0]!.privateKey);
    const res = await restart(h.app, 'host=web-1&service=frontend', token);
    expect([res.status, res.body.code]).toEqual([503, 'oidc_issuer_unavailable']);
    expect(Number(res.headers['retry-after'])).toBeGreaterThan(0);
    expect(await verifications(down.url, 'issuer_unavailable')).toBeGreaterThan(0);
    expect(await h.queue.bull.getJobCounts('waiting')).toEqual({ waiting: 0 });
  });

  it('without ca_file the keys are fetched with the system CAs only: an issuer of a private CA is not trusted (503)', async () => {
    const [entry] = parseOidcFile(oidcYaml().replace(`    ca_file: ${caFile}\n`, ''));
    expect(entry).toMatchObject({ issuer: gh.url });
    expect(entry!.ca).toBeUndefined();
    const verifier = createOidcVerifier({ settings: { issuers: [entry!], configured: true } });
    const asked = gh.hits['/.well-known/openid-configuration'];
    await expect(verifier.verify(await gh.sign(githubClaims()))).rejects.toMatchObject({ code: 'oidc_issuer_unavailable' });
    // Refused in the TLS handshake: no request reached the issuer.
    expect(gh.hits['/.well-known/openid-configuration']).toBe(asked);
  });

  it('claims outside every rule: 403 oidc_no_matching_rule; a readonly rule: 403 operator_role_required', async () => {
    const other = await restart(h.app, 'host=web-1&service=frontend', await gh.sign(githubClaims({ repository: 'acme/other' })));
    expect([other.status, other.body.code]).toEqual([403, 'oidc_no_matching_rule']);
    const branch = await restart(h.app, 'host=web-1&service=frontend', await gh.sign(githubClaims({ ref: 'refs/heads/dev' })));
    expect([branch.status, branch.body.code]).toEqual([403, 'oidc_no_matching_rule']);
    const release = await restart(h.app, 'host=web-1&service=frontend', await gh.sign(githubClaims({ ref: 'refs/heads/release/1.2' })));
    expect([release.status, release.body.code]).toEqual([403, 'operator_role_required']);
  });

  it('a host outside the scope: 403 out_of_scope, for an OIDC rule and a scoped key alike', async () => {
    const oidc = await restart(h.app, 'host=db-1&service=postgres-exporter', await gh.sign(githubClaims()));
    expect([oidc.status, oidc.body.code]).toEqual([403, 'out_of_scope']);
    const key = await request(h.app).post('/ops/restart?host=db-1&service=postgres-exporter').set('X-API-Key', SCOPED_KEY);
    expect([key.status, key.body.code]).toEqual([403, 'out_of_scope']);
    const inScope = await request(h.app).post('/ops/restart?host=web-1&service=frontend').set('X-API-Key', SCOPED_KEY);
    expect(inScope.status).toBe(200);
    const status = await request(h.app).get('/ops/hosts/db-1').set('X-API-Key', SCOPED_KEY);
    expect([status.status, status.body.code]).toEqual([403, 'out_of_scope']);
  });

  it("a scoped key's other routes: freezes, approvals, replays, dead letters and Bull Board stay within its scope", async () => {
    const post = (path: string, body: Record<string, unknown>, key = SCOPED_KEY) =>
      request(h.app).post(path).set('X-API-Key', key).set('Content-Type', 'application/json').send(JSON.stringify(body));
    const freeze = (body: Record<string, unknown>) => post('/ops/freezes', { reason: 'r', duration: '1h', ...body });
    expect((await freeze({ scope: 'namespace', namespace: 'data' })).body.code).toBe('out_of_scope');
    expect((await freeze({ scope: 'all' })).body.code).toBe('out_of_scope');
    const mine = await freeze({ scope: 'project', project: 'acme/shop' });
    expect(mine.status).toBe(201);
    const theirs = await post('/ops/freezes', { scope: 'namespace', namespace: 'data', reason: 'r', duration: '1h' }, OP_KEY);
    expect(theirs.status).toBe(201);
    const lift = (id: string) =>
      request(h.app)
        .delete(`/ops/freezes/${id}`)
        .set('X-API-Key', SCOPED_KEY)
        .set('Content-Type', 'application/json')
        .send('{"reason":"r"}');
    expect([(await lift(theirs.body.id)).status, (await lift(mine.body.id)).status]).toEqual([403, 200]);
    // An approval of a restart of pay-1, outside the key's hosts.
    const asked = await request(h.app).post('/ops/restart?host=pay-1&service=api').set('X-API-Key', OP_KEY);
    expect(asked.status).toBe(202);
    const approve = await post(`/ops/approvals/${asked.body.approval_id}/approve`, { reason: 'ok' });
    expect([approve.status, approve.body.code]).toEqual([403, 'out_of_scope']);
    // A recorded push of acme/legacy, outside the key's projects.
    const push = await request(h.app)
      .post('/webhook/scm')
      .set('X-Scm-Token', SCM_SECRET)
      .set('X-Scm-Event', 'Push Hook')
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ ref: 'refs/heads/main', checkout_sha: SHA, project: { path_with_namespace: 'acme/legacy' } }));
    expect(push.body).toMatchObject({ accepted: true });
    await h.deliveries.flush();
    const delivery = await waitFor('the recorded push', async () => {
      const list = await request(h.app).get('/ops/deliveries?source=scm').set('X-API-Key', RO_KEY);
      return (list.body.deliveries as Array<{ id: string }> | undefined)?.[0]?.id;
    });
    const replay = await post(`/ops/deliveries/${delivery}/replay`, { reason: 'again' });
    expect([replay.status, replay.body.code]).toEqual([403, 'out_of_scope']);
    const retry = await post(`/ops/jobs/${push.body.job_id}/retry`, { reason: 'again' });
    expect([retry.status, retry.body.code]).toEqual([403, 'out_of_scope']);
    const board = await request(h.app).get('/admin/queues').set('X-API-Key', SCOPED_KEY);
    expect([board.status, board.body.code]).toEqual([403, 'out_of_scope']);
    expect((await request(h.app).get('/admin/queues').set('X-API-Key', OP_KEY)).status).toBe(200);
  });

  it("four eyes compares owners: a key of the OIDC identity's owner cannot approve its restart, another operator can; an OIDC token never approves", async () => {
    const asked = await restart(h.app, 'host=pay-1&service=api', await gh.sign(githubClaims()));
    expect(asked.status).toBe(202);
    const id = asked.body.approval_id as string;
    const decide = (key: string) =>
      request(h.app)
        .post(`/ops/approvals/${id}/approve`)
        .set('X-API-Key', key)
        .set('Content-Type', 'application/json')
        .send('{"reason":"ok"}');
    const same = await decide(SAME_OWNER_KEY);
    expect([same.status, same.body.code]).toEqual([403, 'self_approval']);
    const token = await request(h.app)
      .post(`/ops/approvals/${id}/approve`)
      .set('Authorization', `Bearer ${await gh.sign(githubClaims())}`)
      .set('Content-Type', 'application/json')
      .send('{"reason":"ok"}');
    expect([token.status, token.body.code]).toEqual([401, 'missing_api_key']);
    const other = await decide(OP_KEY);
    expect(other.status).toBe(200);
    expect(other.body.status).toBe('approved');
  });
});

describe('POST /ops/deploys', () => {
  it('a GitHub token deploys exactly the commit it names, without a body; the same commit again is a duplicate', async () => {
    const first = await deploy(await gh.sign(githubClaims()));
    expect(first.status).toBe(202);
    expect(first.body).toMatchObject({
      project: 'acme/storefront',
      ref: 'refs/heads/main',
      sha: SHA,
      event_id: `ci:acme/storefront:refs/heads/main:${SHA}`,
      accepted: true,
      duplicate: false,
      status: 'queued',
    });
    const job = await h.queue.bull.getJob(first.body.job_id);
    expect(job?.name).toBe(JOB.runDeployPipeline);
    expect(job?.data).toMatchObject({
      project: 'acme/storefront',
      ref: 'refs/heads/main',
      sha: SHA,
      requested_owner: 'github:acme/storefront',
    });
    const again = await deploy(await gh.sign(githubClaims()), { project: 'acme/storefront', sha: SHA });
    expect(again.body).toMatchObject({ accepted: false, duplicate: true, job_id: first.body.job_id });
    expect(lastAudit(h, '/ops/deploys')).toMatchObject({
      oidc: { issuer: gh.url, rule: 'storefront-main' },
      sha: SHA,
      outcome: 'duplicate',
      deploy_status: 'queued',
    });
  });

  it("a body disagreeing with the token's sha (or project) is refused, nothing queued", async () => {
    const sha = await deploy(await gh.sign(githubClaims()), { sha: OTHER_SHA });
    expect([sha.status, sha.body.code]).toEqual([403, 'deploy_not_bound_to_token']);
    const project = await deploy(await gh.sign(githubClaims()), { project: 'acme/legacy' });
    expect([project.status, project.body.code]).toEqual([403, 'deploy_not_bound_to_token']);
    expect(await h.queue.bull.getJobCounts('waiting')).toEqual({ waiting: 0 });
  });

  it('a GitLab token: its ref normalized to refs/heads/main, its project a both-ways project', async () => {
    const res = await deploy(await gl.sign(gitlabClaims()));
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({
      project: 'acme/shop',
      ref: 'refs/heads/main',
      sha: '714a629c0b401fdce83e847fc9589983fc6f46bc',
      accepted: true,
    });
  });

  it('the shared bearer token is refused here; an operator key names the whole target and may deploy within its scope', async () => {
    const shared = await deploy(BEARER, { project: 'acme/shop', ref: 'refs/heads/main', sha: SHA });
    expect([shared.status, shared.body.code]).toEqual([403, 'bearer_token_not_accepted']);
    const key = (k: string, body: Record<string, unknown>) =>
      request(h.app).post('/ops/deploys').set('X-API-Key', k).set('Content-Type', 'application/json').send(JSON.stringify(body));
    expect((await key(OP_KEY, { project: 'acme/shop', ref: 'refs/heads/main', sha: SHA })).status).toBe(202);
    const partial = await key(OP_KEY, { project: 'acme/shop', ref: 'refs/heads/main' });
    expect([partial.status, partial.body.code]).toEqual([422, 'invalid_body']);
    const ro = await key(RO_KEY, { project: 'acme/shop', ref: 'refs/heads/main', sha: SHA });
    expect([ro.status, ro.body.code]).toEqual([403, 'operator_role_required']);
    const scoped = await key(SCOPED_KEY, { project: 'acme/storefront', ref: 'refs/heads/main', sha: SHA });
    expect([scoped.status, scoped.body.code]).toEqual([403, 'out_of_scope']);
  });

  it('deploy_from: a CI deploy to a push project is 409; a push to a CI project does not deploy', async () => {
    const legacy = await request(h.app)
      .post('/ops/deploys')
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ project: 'acme/legacy', ref: 'refs/heads/main', sha: SHA }));
    expect([legacy.status, legacy.body.code]).toEqual([409, 'deploy_source_refused']);
    const push = await request(h.app)
      .post('/webhook/scm')
      .set('X-Scm-Token', SCM_SECRET)
      .set('X-Scm-Event', 'Push Hook')
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ ref: 'refs/heads/main', checkout_sha: SHA, project: { path_with_namespace: 'acme/storefront' } }));
    expect(push.status).toBe(202);
    expect(push.body).toEqual({ ignored: true, reason: expect.stringContaining('deploy_from: ci') });
    expect(await h.queue.bull.getJobCounts('waiting')).toEqual({ waiting: 0 });
  });

  it('through the pipeline: a project whose policy asks for approval waits for one (the same commit again joins it)', async () => {
    const ask = () =>
      request(h.app)
        .post('/ops/deploys')
        .set('X-API-Key', OP_KEY)
        .set('Content-Type', 'application/json')
        .send(JSON.stringify({ project: 'acme/guarded', ref: 'refs/heads/main', sha: SHA }));
    const first = await ask();
    expect(first.status).toBe(202);
    expect(first.body).toMatchObject({ status: 'pending_approval', accepted: true, duplicate: false });
    expect(first.body.approval_id).toBe(first.body.job_id);
    const again = await ask();
    expect(again.body).toMatchObject({ status: 'pending_approval', accepted: false, duplicate: true, approval_id: first.body.approval_id });
    // Only the on-call report of the request is queued, no deploy.
    expect((await h.queue.bull.getJobs(['waiting', 'delayed'])).map((j) => j.name)).not.toContain(JOB.runDeployPipeline);
    const approval = await request(h.app).get(`/ops/approvals/${first.body.approval_id}`).set('X-API-Key', RO_KEY);
    expect(approval.body).toMatchObject({ status: 'pending' });
  });

  it('Idempotency-Key: a retry answers the first call; the key reused for another commit is 422', async () => {
    const key = (k: string, sha: string) =>
      request(h.app)
        .post('/ops/deploys')
        .set('X-API-Key', OP_KEY)
        .set('Idempotency-Key', k)
        .set('Content-Type', 'application/json')
        .send(JSON.stringify({ project: 'acme/shop', ref: 'refs/heads/main', sha }));
    const first = await key('release-1', SHA);
    expect(first.status).toBe(202);
    const retry = await key('release-1', SHA);
    expect(retry.body).toEqual(first.body);
    const reused = await key('release-1', OTHER_SHA);
    expect([reused.status, reused.body.code]).toEqual([422, 'idempotency_key_reused']);
  });
});

describe('POST /ops/deploys/rollback with an OIDC token', () => {
  const rollback = (token: string, body: Record<string, unknown>) =>
    request(h.app)
      .post('/ops/deploys/rollback')
      .set('Authorization', `Bearer ${token}`)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ ref: 'refs/heads/main', reason: 'bad release', ...body }));

  it("an operator rule rolls back its own project; a readonly rule, and a project other than the token's, are refused", async () => {
    // A succeeded deploy of another commit in the history (the step as the worker writes it).
    await createDeployHistory(h.redis, 100).record({
      id: 'storefront-1',
      accepted: Date.now() - 1000,
      first: {
        project: 'acme/storefront',
        ref: 'refs/heads/main',
        commit: OTHER_SHA,
        group: 'acme/storefront:refs/heads/main',
        origin: 'ci',
        owner: 'github:acme/storefront',
        queue_job: 'storefront-1',
      },
      step: { state: 'succeeded', finished_at: Date.now() },
    });
    const ok = await rollback(await gh.sign(githubClaims()), { project: 'acme/storefront', to: OTHER_SHA });
    expect(ok.status).toBe(202);
    expect(ok.body).toMatchObject({ sha: OTHER_SHA, rolled_back_from: 'storefront-1', rolled_back_to: 'storefront-1', status: 'queued' });
    const job = await h.queue.bull.getJob(ok.body.job_id);
    expect(job?.data).toMatchObject({ sha: OTHER_SHA, rollback: true, requested_owner: 'github:acme/storefront' });

    const other = await rollback(await gh.sign(githubClaims()), { project: 'acme/legacy' });
    expect([other.status, other.body.code]).toEqual([403, 'deploy_not_bound_to_token']);
    const readonly = await rollback(await gh.sign(githubClaims({ ref: 'refs/heads/release/1' })), {
      project: 'acme/storefront',
      ref: 'refs/heads/release/1',
    });
    expect([readonly.status, readonly.body.code]).toEqual([403, 'operator_role_required']);
    // Its rule does not say may_override: no person stands behind it.
    const override = await rollback(await gh.sign(githubClaims()), { project: 'acme/storefront', to: OTHER_SHA, override: true });
    expect([override.status, override.body.code]).toEqual([403, 'override_not_allowed']);
  });
});

describe("keyless callers held to people's rules", () => {
  const approve = (id: string, key: string) =>
    request(h.app)
      .post(`/ops/approvals/${id}/approve`)
      .set('X-API-Key', key)
      .set('Content-Type', 'application/json')
      .send('{"reason":"ok"}');

  it('the person a rule names (person: {actor}) cannot approve the change with their own key: 403 self_approval; another person can', async () => {
    const asked = await restart(h.app, 'host=pay-1&service=api', await gh.sign(githubClaims({ actor: 'alice' })));
    expect([asked.status, asked.body.required]).toEqual([202, 1]);
    expect(lastAudit(h, '/ops/restart')).toMatchObject({ owner: 'github:acme/storefront', owner_known: true, person: 'alice' });
    const id = asked.body.approval_id as string;
    const self = await approve(id, ALICE_KEY);
    expect([self.status, self.body.code]).toEqual([403, 'self_approval']);
    expect(self.body.detail).toMatch(/the credential belongs to alice/);
    expect(await h.queue.bull.getJob(id)).toBeUndefined();
    const other = await approve(id, OP_KEY);
    expect([other.status, other.body.status]).toEqual([200, 'approved']);
  });

  it('a token whose rule names no person, or whose person is empty, needs one approver more than the policy says', async () => {
    const asked = await restart(h.app, 'host=pay-1&service=api', await gh.sign(githubClaims({ actor: '' })));
    expect([asked.status, asked.body.required]).toEqual([202, 2]);
    expect(lastAudit(h, '/ops/restart')).toMatchObject({ owner_known: false });
    const id = asked.body.approval_id as string;
    const first = await approve(id, ALICE_KEY);
    expect([first.status, first.body.status, first.body.approvals_needed]).toEqual([202, 'pending', 1]);
    expect(await h.queue.bull.getJob(id)).toBeUndefined();
    expect((await approve(id, OP_KEY)).body.status).toBe('approved');
    // Without an approval policy it is queued as the contract says.
    const free = await restart(h.app, 'host=web-1&service=frontend', await gh.sign(githubClaims({ actor: '' })));
    expect([free.status, free.body.status]).toEqual([200, 'submitted']);
  });

  it('override=true: 403 override_not_allowed from an OIDC token without may_override and from the shared token; a may_override rule overrides, audited', async () => {
    const frozen = await request(h.app)
      .post('/ops/freezes')
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ scope: 'namespace', namespace: 'shop', reason: 'sale', duration: '1h' }));
    expect(frozen.status).toBe(201);
    const main = await gh.sign(githubClaims());
    expect((await restart(h.app, 'host=web-1&service=frontend', main)).body.code).toBe('change_refused');
    for (const [token, query] of [
      [main, 'host=web-1&service=frontend&override=true&reason=x'],
      [main, 'host=web-1&service=frontend&override=true&reason=x&dry_run=true'],
      [BEARER, 'host=web-1&service=frontend&override=true&reason=x'],
    ] as const) {
      const refused = await restart(h.app, query, token);
      expect([refused.status, refused.body.code]).toEqual([403, 'override_not_allowed']);
    }
    expect(await h.queue.bull.getJobCounts('waiting')).toEqual({ waiting: 0 });
    const hotfix = await restart(
      h.app,
      'host=web-1&service=frontend&override=true&reason=checkout%20wedged',
      await gh.sign(githubClaims({ ref: 'refs/heads/hotfix', actor: 'alice' })),
    );
    expect([hotfix.status, hotfix.body.status]).toEqual([200, 'submitted']);
    expect(lastAudit(h, '/ops/restart')).toMatchObject({ status: 200, override: true, oidc: { rule: 'storefront-hotfix' } });
    const job = await h.queue.bull.getJob(hotfix.body.job_id);
    expect(job?.data.override).toMatchObject({ by: expect.stringMatching(/^oidc:/), reason: 'checkout wedged' });
    const key = await request(h.app).post('/ops/restart?host=web-1&service=checkout&override=true&reason=x').set('X-API-Key', OP_KEY);
    expect(key.status).toBe(200);
  });

  it("a token valid for longer than its issuer's max_token_lifetime: 401 oidc_token_lifetime_exceeded, counted", async () => {
    const before = await verifications(gh.url, 'lifetime');
    const t = Math.floor(Date.now() / 1000);
    for (const exp of [t + 7200, t + 365 * 86400]) {
      const res = await restart(h.app, 'host=web-1&service=frontend', await gh.sign(githubClaims({ iat: t - 5, exp })));
      expect([res.status, res.body.code]).toEqual([401, 'oidc_token_lifetime_exceeded']);
      expect(res.body.detail).toMatch(/longer than the 3600 s its issuer's max_token_lifetime allows/);
    }
    expect(await verifications(gh.url, 'lifetime')).toBe(before + 2);
    expect(await h.queue.bull.getJobCounts('waiting')).toEqual({ waiting: 0 });
  });

  it("a token issued longer ago than its issuer's max_token_age, and a token without sub: 401 saying so", async () => {
    const t = Math.floor(Date.now() / 1000);
    const old = await deploy(await gl.sign(gitlabClaims({ iat: t - 120, nbf: t - 120 })));
    expect([old.status, old.body.code]).toEqual([401, 'invalid_oidc_token']);
    expect(old.body.detail).toMatch(/issued more than 60 s ago/);
    const { sub: _sub, ...claims } = githubClaims();
    const nosub = await restart(h.app, 'host=web-1&service=frontend', await gh.sign(claims));
    expect([nosub.status, nosub.body.code, nosub.body.detail]).toEqual([401, 'invalid_oidc_token', 'the OIDC token has no "sub" claim']);
  });

  it("GitLab's ref_type is honoured: a tag named refs/heads/main is a tag, which the rule for main does not admit", async () => {
    const tag = await deploy(await gl.sign(gitlabClaims({ ref: 'refs/heads/main', ref_type: 'tag' })));
    expect([tag.status, tag.body.code]).toEqual([403, 'oidc_no_matching_rule']);
    expect(await h.queue.bull.getJobCounts('waiting')).toEqual({ waiting: 0 });
  });
});

describe('GET /ops/keys, and the file re-read while the API runs', () => {
  it('lists the issuers and rules beside the keys and their scopes, never a secret', async () => {
    const res = await request(h.app).get('/ops/keys').set('X-API-Key', OP_KEY);
    expect(res.status).toBe(200);
    expect(res.body.keys.find((k: { id: string }) => k.id === 'scoped').scope).toEqual({ hosts: ['web-1'], projects: ['acme/shop'] });
    expect(res.body.oidc_issuers.map((i: { issuer: string }) => i.issuer)).toEqual([gh.url, gl.url, down.url]);
    expect(res.body.oidc_issuers[0].rules[0]).toEqual({
      name: 'storefront-main',
      match: { repository: 'acme/storefront', ref: 'refs/heads/main' },
      owner: 'github:{repository}',
      role: 'operator',
      scope: { projects: ['acme/storefront', 'acme/legacy'], hosts: ['web-1', 'pay-1'] },
      deploy: { project: '{repository}', ref: '{ref}', sha: '{sha}' },
      person: '{actor}',
      may_override: false,
      owner_claim: null,
    });
    expect(
      res.body.oidc_issuers.map((i: { max_token_lifetime: number; max_token_age: number | null }) => [
        i.max_token_lifetime,
        i.max_token_age,
      ]),
    ).toEqual([
      [3600, null],
      [86400, 60],
      [3600, null],
    ]);
    for (const secret of [SCOPED_KEY, SAME_OWNER_KEY, OP_KEY, ca.key]) expect(JSON.stringify(res.body)).not.toContain(secret);
  });

  it('a changed OPS_OIDC_FILE is put in use without a restart; one with a rule that binds no owner is refused, naming the rule', async () => {
    const file = join(dir, 'reload.yaml');
    writeFileSync(file, oidcYaml());
    const config = loadApiConfig({ ...baseEnv(srv.url), OPS_OIDC_FILE: file, SECRETS_RELOAD_INTERVAL_MS: '60000' });
    const lines: string[] = [];
    const logger = createLogger({ level: 'info', write: (l) => lines.push(l) });
    const reload = watchCredentials({ config, senderSecrets: createSenderSecrets({}), logger });
    try {
      const verifier = createOidcVerifier({ settings: config.oidc });
      const other = await gh.sign(githubClaims({ repository: 'acme/other' }));
      await expect(verifier.verify(other)).rejects.toMatchObject({ code: 'oidc_no_matching_rule' });
      writeFileSync(
        file,
        oidcYaml().replace('match: {repository: acme/storefront, ref: refs/heads/main}', 'match: {repository: acme/other}'),
      );
      await reload.check();
      expect((await verifier.verify(other))?.identity.owner).toBe('github:acme/other');
      // Any repository on GitHub can have a token signed for this audience: a rule for */* admits strangers.
      writeFileSync(
        file,
        oidcYaml().replace('match: {repository: acme/storefront, ref: refs/heads/main}', 'match: {repository: "glob:*/*"}'),
      );
      await reload.check();
      const refused = lines.find((l) => l.includes('credentials reload refused'));
      expect(refused).toContain('OPS_OIDC_FILE');
      expect(refused).toContain('rule 1 (\\"storefront-main\\") binds no owner');
      await expect(
        verifier.verify(await gh.sign(githubClaims({ repository: 'mallory/pwn', repository_owner: 'mallory' }))),
      ).rejects.toMatchObject({
        code: 'oidc_no_matching_rule',
      });
      expect((await verifier.verify(other))?.identity.owner).toBe('github:acme/other');
    } finally {
      reload.close();
    }
  });
});

describe('a Kubernetes issuer with discovery_auth: serviceaccount', () => {
  it("fetches discovery and keys with the pod's own token and CA; a token for another audience is refused", async () => {
    const sa = mkdtempSync(join(dir, 'sa-'));
    writeFileSync(join(sa, 'token'), 'pod-own-token\n');
    writeFileSync(join(sa, 'ca.crt'), ca.cert);
    const k8s = await startIssuer(makeLeaf(dir, ca, 'apiserver'), 'RS256');
    k8s.requireBearer('pod-own-token');
    try {
      const issuers = parseOidcFile(`
issuers:
  - issuer: ${k8s.url}
    kind: kubernetes
    audience: opsgate
    discovery_auth: serviceaccount
    rules:
      - match: {/kubernetes.io/namespace: ci, sub: "glob:system:serviceaccount:ci:*"}
        owner: "k8s:{/kubernetes.io/namespace}/{/kubernetes.io/serviceaccount/name}"
        role: operator
        scope: {namespaces: ["{/kubernetes.io/namespace}"]}
`);
      const verifier = createOidcVerifier({ settings: { issuers, configured: true }, serviceAccountDir: sa });
      const caller = await verifier.verify(await k8s.sign(kubernetesClaims('ci', 'tekton-bot')));
      expect(caller).toMatchObject({ identity: { owner: 'k8s:ci/tekton-bot' }, scope: { namespaces: ['ci'] }, role: 'operator' });
      expect(k8s.hits['/.well-known/openid-configuration']).toBe(1);
      await expect(
        verifier.verify(await k8s.sign(kubernetesClaims('ci', 'tekton-bot', { aud: ['https://kubernetes.default.svc'] }))),
      ).rejects.toMatchObject({
        code: 'invalid_oidc_token',
      });
      await expect(verifier.verify(await k8s.sign(kubernetesClaims('prod', 'deployer')))).rejects.toMatchObject({
        code: 'oidc_no_matching_rule',
      });
      // With another token the API server answers 401: the issuer cannot be read, and opsgate fails closed.
      const other = mkdtempSync(join(dir, 'sa-other-'));
      writeFileSync(join(other, 'token'), 'someone-else\n');
      writeFileSync(join(other, 'ca.crt'), ca.cert);
      const stranger = createOidcVerifier({ settings: { issuers, configured: true }, serviceAccountDir: other });
      const asked = k8s.hits['/.well-known/openid-configuration'];
      await expect(stranger.verify(await k8s.sign(kubernetesClaims('ci', 'tekton-bot')))).rejects.toMatchObject({
        code: 'oidc_issuer_unavailable',
      });
      expect(k8s.hits['/.well-known/openid-configuration']).toBe(asked! + 1);
    } finally {
      await k8s.stop();
    }
  });

  it("sends the pod's token only to the API server: the issuer's origin, KUBERNETES_SERVICE_HOST:PORT, or an address its EndpointSlice advertises", async () => {
    const sa = mkdtempSync(join(dir, 'sa-dest-'));
    writeFileSync(join(sa, 'token'), 'pod-own-token\n');
    writeFileSync(join(sa, 'ca.crt'), ca.cert);
    const apiserver = await startIssuer(makeLeaf(dir, ca, 'apiserver'), 'RS256');
    // Another host serving the issuer's keys, as a discovery document may name (a cloud's key host).
    const keyHost = await startIssuer(makeLeaf(dir, ca, 'keyhost'), 'RS256');
    apiserver.pointKeysAt(`${keyHost.url}/keys`);
    const port = new URL(keyHost.url).port;
    const issuers = parseOidcFile(`
issuers:
  - issuer: ${apiserver.url}
    kind: kubernetes
    audience: opsgate
    discovery_auth: serviceaccount
    rules:
      - {match: {/kubernetes.io/namespace: ci}, owner: "k8s:{/kubernetes.io/namespace}", role: operator}
`);
    const token = () => apiserver.sign(kubernetesClaims('ci', 'tekton-bot'), keyHost.keys[0]);
    const verify = async (env: Record<string, string>) =>
      createOidcVerifier({ settings: { issuers, configured: true }, serviceAccountDir: sa, env }).verify(await token());
    try {
      // Outside a cluster, or a cluster whose API server is elsewhere: the keys are fetched without the token.
      expect(await verify({})).toMatchObject({ identity: { owner: 'k8s:ci' } });
      expect(await verify({ KUBERNETES_SERVICE_HOST: '127.0.0.2', KUBERNETES_SERVICE_PORT: '443' })).toBeDefined();
      expect(apiserver.authorizations['/.well-known/openid-configuration']).toEqual(['Bearer pod-own-token', 'Bearer pod-own-token']);
      expect(keyHost.authorizations['/keys']).toEqual(['', '']);
      // The API server as the pod's environment names it.
      expect(await verify({ KUBERNETES_SERVICE_HOST: '127.0.0.1', KUBERNETES_SERVICE_PORT: port })).toBeDefined();
      expect(keyHost.authorizations['/keys']!.at(-1)).toBe('Bearer pod-own-token');
      // An address the API server advertises, read from its EndpointSlice with the token.
      const slice = '/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes';
      apiserver.serve(slice, {
        endpoints: [{ addresses: ['127.0.0.1'] }],
        ports: [{ name: 'https', port: Number(port), protocol: 'TCP' }],
      });
      const inCluster = { KUBERNETES_SERVICE_HOST: '127.0.0.1', KUBERNETES_SERVICE_PORT: new URL(apiserver.url).port };
      expect(await verify(inCluster)).toBeDefined();
      expect(apiserver.authorizations[slice]).toEqual(['Bearer pod-own-token']);
      expect(keyHost.authorizations['/keys']!.at(-1)).toBe('Bearer pod-own-token');
      // An EndpointSlice that names other addresses: no token.
      apiserver.serve(slice, { endpoints: [{ addresses: ['127.0.0.1'] }], ports: [{ name: 'https', port: 1, protocol: 'TCP' }] });
      expect(await verify(inCluster)).toBeDefined();
      expect(keyHost.authorizations['/keys']!.at(-1)).toBe('');
    } finally {
      await apiserver.stop();
      await keyHost.stop();
    }
  });
});
