import { afterAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import request from 'supertest';
import { API_KEY_ID } from '../../../src/api/apiKeys.js';
import { credentialId } from '../../../src/shared/crypto.js';
import { JOB } from '../../../src/shared/jobs.js';
import { BEARER, createHarness, OP_KEY, OP_KEY_2, RO_KEY, useHarness } from '../../helpers/apiHarness.js';

/**
 * People, not credentials, through the real app on a real Redis: every accepted credential names
 * its owner (a keys-file entry's owner, else its id; env:<id> for OPS_API_KEY_ROLES;
 * OPS_BEARER_TOKEN_OWNER for the bearer token, which is no known person either way), which reaches the audit
 * line and GET /ops/keys; and a keys-file id as long as the configuration allows restarts a
 * Deployment: its principal fits the job it is written into.
 */
const LONG_ID = 'a'.repeat(62) + 'z';
const LONG_KEY = 'long-id-operator-key-0001';
const BOB_KEY = 'bob-readonly-key-0002';

const dir = mkdtempSync(join(tmpdir(), 'opsgate-owners-'));
const keysFile = join(dir, 'api-keys.yaml');
writeFileSync(
  keysFile,
  `- { id: ${LONG_ID}, role: operator, key: ${LONG_KEY}, owner: alice@example.com }
- { id: bob, role: readonly, key: ${BOB_KEY} }
`,
);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const ctx = useHarness({ env: { OPS_API_KEYS_FILE: keysFile, OPS_BEARER_TOKEN_OWNER: 'ci:deploy-bot' } });

const auditOf = (requestId: string) => ctx.h.audits().find((a) => a.caller_request_id === requestId);

describe('a keys-file id as long as the configuration allows', () => {
  it('is the longest id the configuration accepts', () => {
    expect(API_KEY_ID.test(LONG_ID)).toBe(true);
    expect(API_KEY_ID.test(LONG_ID + 'z')).toBe(false);
  });

  it('restarts a Deployment of a host without guards: 200 with its job_id, the job recording key:<id>, readable by the key', async () => {
    const res = await request(ctx.h.app)
      .post('/ops/restart?host=web-1&service=frontend')
      .set('X-API-Key', LONG_KEY)
      .set('X-Request-Id', 'long-id-restart');
    expect([res.status, res.body]).toEqual([
      200,
      { host: 'web-1', service: 'frontend', status: 'submitted', job_id: expect.any(String), coalesced: false },
    ]);
    const job = await ctx.h.queue.bull.getJob(res.body.job_id);
    expect(job?.name).toBe(JOB.restartService);
    expect(job?.data).toMatchObject({ host: 'web-1', service: 'frontend', requested_by: `key:${LONG_ID}` });
    const read = await request(ctx.h.app).get(`/ops/jobs/${res.body.job_id}`).set('X-API-Key', LONG_KEY);
    expect([read.status, read.body.id]).toEqual([200, res.body.job_id]);
    expect(auditOf('long-id-restart')).toMatchObject({
      who: `key:${LONG_ID}`,
      owner: 'alice@example.com',
      owner_known: true,
      credential: credentialId(LONG_KEY),
      status: 200,
    });
  });
});

describe('the owner in the audit line', () => {
  it('the bearer token with OPS_BEARER_TOKEN_OWNER: named by its configured owner, still no known person', async () => {
    const res = await request(ctx.h.app)
      .post('/ops/restart?host=db-1&service=postgres-exporter')
      .set('Authorization', `Bearer ${BEARER}`)
      .set('X-Request-Id', 'owned-bearer');
    expect(res.status).toBe(200);
    expect(auditOf('owned-bearer')).toMatchObject({
      who: `bearer:${credentialId(BEARER)}`,
      owner: 'ci:deploy-bot',
      owner_known: false,
      credential: credentialId(BEARER),
    });
  });

  it('the bearer token without OPS_BEARER_TOKEN_OWNER: owner bearer:<credential id>, not known', async () => {
    const h = await createHarness(ctx.srv.url, { env: { OPS_API_KEYS_FILE: keysFile, OPS_BEARER_TOKEN_OWNER: undefined } });
    try {
      const res = await request(h.app)
        .post('/ops/restart?host=web-1&service=checkout')
        .set('Authorization', `Bearer ${BEARER}`)
        .set('X-Request-Id', 'unowned-bearer');
      expect(res.status).toBe(200);
      expect(h.audits().find((a) => a.caller_request_id === 'unowned-bearer')).toMatchObject({
        who: `bearer:${credentialId(BEARER)}`,
        owner: `bearer:${credentialId(BEARER)}`,
        owner_known: false,
      });
    } finally {
      await h.close();
    }
  });

  it('a key of OPS_API_KEY_ROLES is its own owner, env:<id>; a refused call names none', async () => {
    const res = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', OP_KEY).set('X-Request-Id', 'env-key');
    expect(res.status).toBeLessThan(300);
    expect(auditOf('env-key')).toMatchObject({
      who: `key:${credentialId(OP_KEY)}`,
      owner: `env:${credentialId(OP_KEY)}`,
      owner_known: true,
    });
    const refused = await request(ctx.h.app).delete('/ops/cache').set('X-API-Key', 'not-a-key-0003').set('X-Request-Id', 'no-key');
    expect(refused.status).toBe(401);
    const line = auditOf('no-key')!;
    expect(line.who).toBe('anonymous');
    expect(['owner', 'owner_known', 'credential'].filter((f) => f in line)).toEqual([]);
  });
});

describe('GET /ops/keys', () => {
  it("lists each key's owner, never a key", async () => {
    const res = await request(ctx.h.app).get('/ops/keys').set('X-API-Key', LONG_KEY);
    expect(res.status).toBe(200);
    expect(res.body.keys.map((k: { id: string; owner: string; source: string }) => [k.id, k.owner, k.source])).toEqual([
      [credentialId(RO_KEY), `env:${credentialId(RO_KEY)}`, 'env'],
      [credentialId(OP_KEY), `env:${credentialId(OP_KEY)}`, 'env'],
      [credentialId(OP_KEY_2), `env:${credentialId(OP_KEY_2)}`, 'env'],
      [LONG_ID, 'alice@example.com', 'file'],
      ['bob', 'bob', 'file'],
    ]);
    for (const secret of [RO_KEY, OP_KEY, OP_KEY_2, LONG_KEY, BOB_KEY, BEARER]) expect(res.text).not.toContain(secret);
  });
});
