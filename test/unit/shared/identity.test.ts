/**
 * Who a caller is (src/api/identity.ts): every credential resolves to a principal and an owner,
 * and every identity the configuration accepts fits every job field it reaches (requested_by,
 * approvers, override.by), checked here against the job schemas themselves with the longest id and
 * owner the configuration's own patterns accept.
 */
import { afterAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadApiConfig } from '../../../src/api/config.js';
import { API_KEY_ID } from '../../../src/api/apiKeys.js';
import { credentialId } from '../../../src/shared/crypto.js';
import {
  bearerIdentity,
  keyIdentity,
  keyPrincipal,
  OWNER,
  OWNER_MAX,
  ownerProblem,
  senderIdentity,
  widthProblem,
} from '../../../src/api/identity.js';
import { JOB, MAX_PRINCIPAL, parseJobData } from '../../../src/shared/jobs.js';

/** The longest string of `ch` a pattern accepts, found by trying (the pattern's own bound, not a copy of it). */
function longest(re: RegExp, ch: string): number {
  let n = 0;
  while (n < 10_000 && re.test(ch.repeat(n + 1))) n++;
  return n;
}

const dir = mkdtempSync(join(tmpdir(), 'opsgate-identity-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The data of every job that records an identity, with `who` in each identity field. */
function jobsWith(who: string) {
  const audit = { audit_id: 'a-1', requested_by: who };
  const approval = { approval_id: 'ap-1', approvers: [who, who, who, who, who] };
  return [
    [JOB.restartService, { host: 'web-1', service: 'frontend', ...approval, override: { by: who, reason: 'r' }, ...audit }],
    [JOB.runDeployPipeline, { project: 'g/app', ref: 'refs/heads/main', ...approval, ...audit }],
    [JOB.reportChange, { event: 'outcome', change: 'restart', namespace: 'shop', approvers: approval.approvers, ...audit }],
    [JOB.dryRun, { change: 'restart', host: 'web-1', service: 'frontend', ...audit }],
    [JOB.notifyOncall, { alertname: 'Disk', annotations: {}, ...audit }],
  ] as const;
}

describe('every accepted identity fits every job', () => {
  it('the longest keys-file id, loaded from a file, builds a principal that every job schema accepts; so does the longest owner', () => {
    const idMax = longest(API_KEY_ID, 'i');
    const ownerMax = longest(OWNER, 'o');
    expect(idMax).toBeGreaterThan(0);
    expect(ownerMax).toBe(OWNER_MAX);
    const file = join(dir, 'keys.yaml');
    writeFileSync(file, `- { id: ${'i'.repeat(idMax)}, role: operator, key: longest-id-key-0001, owner: ${'o'.repeat(ownerMax)} }\n`);
    const [key] = loadApiConfig({ REDIS_URL: 'redis://127.0.0.1:6379', OPS_API_KEYS_FILE: file }).apiKeys;
    const who = keyIdentity(key!);
    expect(who).toEqual({ principal: `key:${'i'.repeat(idMax)}`, owner: 'o'.repeat(ownerMax), ownerKnown: true, mayOverride: true });
    for (const value of [who.principal, who.owner]) {
      for (const [name, data] of jobsWith(value)) {
        const parsed = parseJobData(name, data);
        expect([name, value.length, parsed.success ? 'ok' : parsed.error.issues]).toEqual([name, value.length, 'ok']);
      }
    }
  });

  it('past MAX_PRINCIPAL a value fits no job, and the configuration check says so', () => {
    const fits = 'x'.repeat(MAX_PRINCIPAL);
    const over = 'x'.repeat(MAX_PRINCIPAL + 1);
    expect(widthProblem(fits)).toBeUndefined();
    expect(widthProblem(over)).toBe(`is longer than ${MAX_PRINCIPAL} characters, the width of a job's identity fields`);
    for (const [name, data] of jobsWith(fits)) expect([name, parseJobData(name, data).success]).toEqual([name, true]);
    for (const [name, data] of jobsWith(over)) expect([name, parseJobData(name, data).success]).toEqual([name, false]);
    expect(keyPrincipal('x'.repeat(MAX_PRINCIPAL)).length).toBeGreaterThan(MAX_PRINCIPAL);
    expect(widthProblem(keyPrincipal('x'.repeat(MAX_PRINCIPAL)))).toBeDefined();
  });
});

describe('identities', () => {
  it('a key is its principal key:<id> with its configured owner, a known person who may override', () => {
    expect(keyIdentity({ id: 'alice-laptop', owner: 'alice@example.com' })).toEqual({
      principal: 'key:alice-laptop',
      owner: 'alice@example.com',
      ownerKnown: true,
      mayOverride: true,
    });
  });

  it('the bearer token: named by OPS_BEARER_TOKEN_OWNER when configured, else by itself; never a known person, never overriding', () => {
    const id = credentialId('bearer-token-0001');
    expect(bearerIdentity(id, 'ci:deploy-bot')).toEqual({
      principal: `bearer:${id}`,
      owner: 'ci:deploy-bot',
      ownerKnown: false,
      mayOverride: false,
    });
    expect(bearerIdentity(id, undefined)).toEqual({
      principal: `bearer:${id}`,
      owner: `bearer:${id}`,
      ownerKnown: false,
      mayOverride: false,
    });
  });

  it('a webhook sender is its own owner, known once its proof was checked', () => {
    expect(senderIdentity('github', true)).toEqual({
      principal: 'webhook:github',
      owner: 'webhook:github',
      ownerKnown: true,
      mayOverride: false,
    });
    expect(senderIdentity('alerts', false)).toEqual({
      principal: 'webhook:alerts',
      owner: 'webhook:alerts',
      ownerKnown: false,
      mayOverride: false,
    });
  });

  it('owner syntax: 1-128 of letters, digits and . _ : @ / + -', () => {
    for (const good of ['alice', 'alice@example.com', 'team:payments', 'ci:group/project', 'a+b_c.d-e', '0', 'x'.repeat(128)]) {
      expect([good, ownerProblem(good)]).toEqual([good, undefined]);
    }
    for (const bad of ['', ' alice', 'alice smith', 'a,b', 'a\nb', 'zoë', 'a"b', 'x'.repeat(129)]) {
      expect([bad, ownerProblem(bad)]).toEqual([bad, 'is not 1-128 letters, digits or the characters . _ : @ / + -']);
    }
  });
});
