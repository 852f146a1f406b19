import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SOURCES, SOURCE_SECRET_ENVS, secretFileVar, type PushSource } from '../../../src/sources/index.js';
import { SecretVolume } from '../../helpers/certs.js';
import { API_ENTRY, spawnNode, startApi, type OpsProcess } from '../../helpers/processes.js';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import { proofHeaders, pushHeaders, pushSources } from '../../helpers/senders.js';
import { waitFor } from '../../helpers/waitFor.js';

/**
 * Rotation without a restart, on the real API process (dist/, spawned) with its credentials in a
 * Secret volume laid out as the kubelet writes it (test/helpers/certs.ts SecretVolume): the keys
 * file (OPS_API_KEYS_FILE) and every sender's secret in file mode (<VARIABLE>_FILE). A new key and
 * a second value of each secret are taken while deliveries and calls go on, either value works
 * (the audit line says which one matched), the old ones are then removed and refused, and no
 * delivery is lost. Invalid new files are refused and the last good credentials stay in use.
 */
const RELOAD_MS = 200;
const RO_KEY = `ro-env-key-${randomBytes(8).toString('hex')}`;
const OLD_KEY = `old-op-key-${randomBytes(8).toString('hex')}`;
const NEW_KEY = `new-op-key-${randomBytes(8).toString('hex')}`;
const sha = (s: string) => createHash('sha256').update(s).digest('hex');
/** Each sender variable's old and new secret. */
const OLD = Object.fromEntries(SOURCE_SECRET_ENVS.map((e) => [e, `old-${e.toLowerCase()}-${randomBytes(6).toString('hex')}`]));
const NEW = Object.fromEntries(SOURCE_SECRET_ENVS.map((e) => [e, `new-${e.toLowerCase()}-${randomBytes(6).toString('hex')}`]));
const ALL_SECRETS = [RO_KEY, OLD_KEY, NEW_KEY, ...Object.values(OLD), ...Object.values(NEW)];

const keysFile = (...entries: Array<{ id: string; key: string }>) =>
  entries.map((e) => `- { id: ${e.id}, role: operator, sha256: ${sha(e.key)} }`).join('\n') + '\n';
/** The volume's files: the keys file and one file per sender variable, each `current[\nprevious]`. */
const files = (keys: string, secrets: Record<string, string>): Record<string, string> => ({ 'api-keys.yaml': keys, ...secrets });
const secretsOf = (values: (env: string) => string[]) =>
  Object.fromEntries(SOURCE_SECRET_ENVS.map((e) => [e, values(e).join('\n') + '\n']));

let srv: RedisServer;
let dir: string;
let vol: SecretVolume;
let api: OpsProcess & { baseUrl: string };

beforeAll(async () => {
  srv = await startRedis();
  dir = mkdtempSync(join(tmpdir(), 'opsgate-rotation-'));
  vol = new SecretVolume(join(dir, 'credentials'));
  vol.write(
    files(
      keysFile({ id: 'ci-old', key: OLD_KEY }),
      secretsOf((e) => [OLD[e]!]),
    ),
  );
  api = await startApi({
    env: {
      PORT: String(await freePort()),
      METRICS_PORT: String(await freePort()),
      REDIS_URL: srv.url,
      OPS_API_KEY_ROLES: `${RO_KEY}:readonly`,
      OPS_API_KEYS_FILE: vol.path('api-keys.yaml'),
      ...Object.fromEntries(SOURCE_SECRET_ENVS.map((e) => [secretFileVar(e), vol.path(e)])),
      SECRETS_RELOAD_INTERVAL_MS: String(RELOAD_MS),
      RATE_LIMIT_RPS: '0',
    },
    readyTimeoutMs: 60_000,
  });
}, 120_000);
afterAll(async () => {
  await api?.stop();
  await srv?.destroy();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const github = pushSources().find((s) => s.name === 'github')!;
let seq = 0;
/** One signed delivery of `source` with `secret`: a push with a new commit, or a firing alert with a new fingerprint. */
async function deliver(source: (typeof SOURCES)[number], secret: string): Promise<{ status: number; body: any; requestId: string }> {
  let payload: string;
  let headers: Record<string, string>;
  if (source.kind === 'push') {
    payload = pushPayload(source);
    headers = pushHeaders(source, secret, payload);
  } else {
    payload = JSON.stringify({
      alerts: [{ status: 'firing', labels: { alertname: 'Rotation' }, fingerprint: `fp-${++seq}-${Date.now()}` }],
    });
    headers = { ...proofHeaders(source, secret, payload), 'Content-Type': 'application/json' };
  }
  const res = await fetch(`${api.baseUrl}/webhook/${source.name}`, {
    method: 'POST',
    headers,
    body: payload,
    signal: AbortSignal.timeout(10_000),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : {}, requestId: res.headers.get('x-request-id') ?? '' };
}

/** A push of `source` to the deploy branch with a commit never sent before (its example, another sha). */
function pushPayload(source: PushSource): string {
  const commit = randomBytes(20).toString('hex');
  return JSON.stringify(source.example).replaceAll(/"[0-9a-f]{40}"/g, `"${commit}"`);
}

const call = async (key: string) =>
  (await fetch(`${api.baseUrl}/ops/hosts`, { headers: { 'X-API-Key': key }, signal: AbortSignal.timeout(10_000) })).status;

async function metric(name: string, labels: string): Promise<number> {
  const port = api.logs().find((l) => l.msg === 'metrics listening')?.port;
  const text = await (await fetch(`http://127.0.0.1:${String(port)}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name}{${labels}}`));
  return line ? Number(line.split(' ').pop()) : NaN;
}

const audit = (requestId: string) =>
  waitFor('the audit line', () => api.logs().find((l) => l.msg === 'audit' && l.request_id === requestId));

describe('rotation under traffic, no restart', () => {
  it('a new key and a second value of every secret work beside the old ones; the old ones removed are refused; no delivery is lost', async () => {
    expect(api.logs().find((l) => l.msg === 'api listening')?.credential_files).toEqual(
      expect.arrayContaining(['OPS_API_KEYS_FILE', 'GITHUB_WEBHOOK_SECRET_FILE', 'ALERTS_WEBHOOK_TOKEN_FILE']),
    );
    // A sender that retries a refused delivery (as GitHub redelivers), and a caller of the ops API.
    let senderSecret = OLD.GITHUB_WEBHOOK_SECRET!;
    let callerKey = OLD_KEY;
    const sent: Array<{ attempts: number; status: number; jobId?: string }> = [];
    const calls: number[] = [];
    let stop = false;
    const sender = (async () => {
      while (!stop) {
        const payload = pushPayload(github);
        let attempts = 0;
        let res: Response | undefined;
        for (; attempts < 20 && res?.status !== 202; attempts++) {
          res = await fetch(`${api.baseUrl}/webhook/github`, {
            method: 'POST',
            headers: pushHeaders(github, senderSecret, payload),
            body: payload,
            signal: AbortSignal.timeout(10_000),
          }).catch(() => undefined);
          if (res?.status !== 202) await new Promise((r) => setTimeout(r, 100));
        }
        const body = res ? ((await res.json()) as { job_id?: string }) : {};
        sent.push({ attempts, status: res?.status ?? 0, ...(body.job_id ? { jobId: body.job_id } : {}) });
      }
    })();
    const caller = (async () => {
      while (!stop) {
        calls.push(await call(callerKey));
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    try {
      await waitFor('traffic with the old credentials', () => sent.length >= 5 && calls.length >= 5);

      // Step 1: add the new key and a second (new, current) value of every secret.
      vol.write(
        files(
          keysFile({ id: 'ci-old', key: OLD_KEY }, { id: 'ci-new', key: NEW_KEY }),
          secretsOf((e) => [NEW[e]!, OLD[e]!]),
        ),
      );
      await waitFor(
        'the new key and the new secrets in use',
        async () => (await call(NEW_KEY)) === 200 && (await deliver(github, NEW.GITHUB_WEBHOOK_SECRET!)).status === 202,
        20_000,
      );

      // Both work, for every sender; the audit line says which value matched, never the value.
      for (const source of SOURCES) {
        const env = source.secret.env;
        for (const [secret, matched] of [
          [NEW[env]!, 'current'],
          [OLD[env]!, 'previous'],
        ] as const) {
          const r = await deliver(source, secret);
          expect({ sender: source.name, matched, status: r.status }).toEqual({ sender: source.name, matched, status: 202 });
          expect((await audit(r.requestId)).matched_secret).toBe(matched);
        }
      }
      expect(await call(OLD_KEY)).toBe(200);
      expect(await call(NEW_KEY)).toBe(200);

      // The sender and the caller move to the new credentials.
      senderSecret = NEW.GITHUB_WEBHOOK_SECRET!;
      callerKey = NEW_KEY;
      const moved = sent.length;
      await waitFor('deliveries with the new secret', () => sent.length >= moved + 5);

      // Step 2: remove the old ones; they are refused within a few reload intervals.
      const removedAt = Date.now();
      vol.write(
        files(
          keysFile({ id: 'ci-new', key: NEW_KEY }),
          secretsOf((e) => [NEW[e]!]),
        ),
      );
      await waitFor('the old key refused', async () => (await call(OLD_KEY)) === 401, 20_000);
      await waitFor('the old secret refused', async () => (await deliver(github, OLD.GITHUB_WEBHOOK_SECRET!)).status === 403, 20_000);
      const refusedAfterMs = Date.now() - removedAt;
      process.stderr.write(
        `[rotation] old credentials refused ${refusedAfterMs} ms after the files changed (reload every ${RELOAD_MS} ms)\n`,
      );
      for (const source of SOURCES) {
        expect({ sender: source.name, status: (await deliver(source, OLD[source.secret.env]!)).status }).toEqual({
          sender: source.name,
          status: source.verification.kind === 'bearer' ? 401 : 403,
        });
        expect({ sender: source.name, status: (await deliver(source, NEW[source.secret.env]!)).status }).toEqual({
          sender: source.name,
          status: 202,
        });
      }
      await waitFor('more deliveries after the removal', () => sent.length >= moved + 10);
    } finally {
      stop = true;
      await Promise.all([sender, caller]);
    }

    // Every delivery was accepted with its own job, none needed a retry (no gap), and each job exists.
    expect(sent.every((s) => s.status === 202 && s.jobId)).toBe(true);
    expect(sent.filter((s) => s.attempts > 1)).toEqual([]);
    expect(new Set(sent.map((s) => s.jobId)).size).toBe(sent.length);
    for (const s of sent) {
      const j = await fetch(`${api.baseUrl}/ops/jobs/${encodeURIComponent(s.jobId!)}`, { headers: { 'X-API-Key': RO_KEY } });
      expect(j.status).toBe(200);
    }
    // The caller was never refused: it moved to the new key while both worked.
    expect(calls.filter((c) => c !== 200)).toEqual([]);
    // The same process throughout; two reloads of each file, none refused.
    expect(api.exited).toBe(false);
    for (const variable of ['OPS_API_KEYS_FILE', ...SOURCE_SECRET_ENVS.map(secretFileVar)]) {
      expect([variable, await metric('opsgate_secret_reloads_total', `variable="${variable}",outcome="reloaded"`)]).toEqual([variable, 2]);
      expect([variable, await metric('opsgate_secret_reload_refused', `variable="${variable}"`)]).toEqual([variable, 0]);
    }
    const keys = await (await fetch(`${api.baseUrl}/ops/keys`, { headers: { 'X-API-Key': NEW_KEY } })).json();
    expect((keys as { keys: Array<{ id: string }> }).keys.map((k) => k.id)).toEqual([expect.stringMatching(/^[0-9a-f]{12}$/), 'ci-new']);
    // The metrics follow the keys in use: the removed key's series are gone (cardinality bounded by the configuration).
    expect(await metric('opsgate_api_key_last_used_timestamp_seconds', 'key_id="ci-new"')).toBeGreaterThan(0);
    expect(await metric('opsgate_api_key_last_used_timestamp_seconds', 'key_id="ci-old"')).toBeNaN();
    const leaked = ALL_SECRETS.filter((s) => api.lines.join('\n').includes(s));
    expect(leaked).toEqual([]);
  }, 180_000);
});

describe('an invalid new file is refused: logged, counted, the last good credentials stay', () => {
  const refusals = (variable: string) =>
    api.logs().filter((l) => l.msg === 'credentials reload refused: keeping the ones in use' && l.variable === variable);

  it('a keys file with a bad entry, a secret file with three values, then one gone: refused; fixing them is taken', async () => {
    const good = files(
      keysFile({ id: 'ci-new', key: NEW_KEY }),
      secretsOf((e) => [NEW[e]!]),
    );
    const keysBefore = refusals('OPS_API_KEYS_FILE').length;
    vol.write({
      ...good,
      'api-keys.yaml': `- { id: ci-new, role: operator, sha256: ${sha(NEW_KEY)} }\n- { id: broken, role: admin, key: ${OLD_KEY} }\n`,
      GITHUB_WEBHOOK_SECRET: `${NEW.GITHUB_WEBHOOK_SECRET}\n${OLD.GITHUB_WEBHOOK_SECRET}\nthird-value-0001\n`,
    });
    const keysRefused = await waitFor('the keys file refused', () => refusals('OPS_API_KEYS_FILE')[keysBefore], 20_000);
    expect(keysRefused).toMatchObject({
      level: 'error',
      problems: [{ variable: 'OPS_API_KEYS_FILE', problem: 'entry 2 (id "broken") has a role that is not readonly or operator' }],
    });
    const secretRefused = await waitFor('the secret file refused', () => refusals('GITHUB_WEBHOOK_SECRET_FILE').at(-1), 20_000);
    expect(secretRefused.problems).toEqual([
      { variable: 'GITHUB_WEBHOOK_SECRET_FILE', problem: 'holds more than two lines (the secret in use, then at most the previous one)' },
    ]);
    expect(await metric('opsgate_secret_reload_refused', 'variable="OPS_API_KEYS_FILE"')).toBe(1);
    expect(await metric('opsgate_secret_reload_refused', 'variable="GITHUB_WEBHOOK_SECRET_FILE"')).toBe(1);
    // The last good set: the new key and secret only.
    expect(await call(NEW_KEY)).toBe(200);
    expect(await call(OLD_KEY)).toBe(401);
    expect((await deliver(github, NEW.GITHUB_WEBHOOK_SECRET!)).status).toBe(202);
    expect((await deliver(github, OLD.GITHUB_WEBHOOK_SECRET!)).status).toBe(403);

    // The file gone from the volume (its key removed from the Secret): refused too.
    const { GITHUB_WEBHOOK_SECRET: _gone, ...withoutGithub } = good;
    vol.write(withoutGithub);
    await waitFor(
      'the missing file refused',
      () => refusals('GITHUB_WEBHOOK_SECRET_FILE').find((l) => JSON.stringify(l.problems).includes('cannot be read (ENOENT)')),
      20_000,
    );
    expect((await deliver(github, NEW.GITHUB_WEBHOOK_SECRET!)).status).toBe(202);

    // Fixed: taken, the gauge back at 0, and the process never left.
    const reloadedBefore = await metric('opsgate_secret_reloads_total', 'variable="GITHUB_WEBHOOK_SECRET_FILE",outcome="reloaded"');
    vol.write({ ...good, GITHUB_WEBHOOK_SECRET: `${OLD.GITHUB_WEBHOOK_SECRET}\n` });
    await waitFor('the fixed file taken', async () => (await deliver(github, OLD.GITHUB_WEBHOOK_SECRET!)).status === 202, 20_000);
    expect(await metric('opsgate_secret_reloads_total', 'variable="GITHUB_WEBHOOK_SECRET_FILE",outcome="reloaded"')).toBe(
      reloadedBefore + 1,
    );
    await waitFor(
      'the keys file back to the set in use',
      async () => (await metric('opsgate_secret_reload_refused', 'variable="OPS_API_KEYS_FILE"')) === 0,
      20_000,
    );
    expect(await metric('opsgate_secret_reload_refused', 'variable="GITHUB_WEBHOOK_SECRET_FILE"')).toBe(0);
    expect(await metric('opsgate_secret_reloads_total', 'variable="GITHUB_WEBHOOK_SECRET_FILE",outcome="refused"')).toBe(2);
    expect(api.exited).toBe(false);
    expect(ALL_SECRETS.filter((s) => api.lines.join('\n').includes(s))).toEqual([]);
    expect(api.lines.join('\n')).not.toContain('third-value-0001');
  }, 120_000);
});

describe('a secret file that does not exist yet (an optional key the kubelet has not written)', () => {
  it('its sender is unconfigured until the file appears, then configured without a restart; /webhook/alerts closes when its token appears', async () => {
    const late = new SecretVolume(join(dir, 'late'));
    late.write({ 'api-keys.yaml': keysFile({ id: 'ci-late', key: NEW_KEY }) });
    const p = await startApi({
      env: {
        PORT: String(await freePort()),
        METRICS_PORT: String(await freePort()),
        REDIS_URL: srv.url,
        OPS_API_KEYS_FILE: late.path('api-keys.yaml'),
        GITHUB_WEBHOOK_SECRET_FILE: late.path('GITHUB_WEBHOOK_SECRET'),
        ALERTS_WEBHOOK_TOKEN_FILE: late.path('ALERTS_WEBHOOK_TOKEN'),
        SECRETS_RELOAD_INTERVAL_MS: String(RELOAD_MS),
        RATE_LIMIT_RPS: '0',
      },
      readyTimeoutMs: 60_000,
    });
    const post = async (path: string, headers: Record<string, string>, body: string) =>
      (await fetch(`${p.baseUrl}${path}`, { method: 'POST', headers, body, signal: AbortSignal.timeout(10_000) })).status;
    const alert = () => JSON.stringify({ alerts: [{ status: 'firing', labels: { alertname: 'Late' }, fingerprint: `late-${++seq}` }] });
    try {
      expect(p.logs().filter((l) => l.level === 'warn' && String(l.msg).includes('names a file that does not exist'))).toHaveLength(2);
      const body = pushPayload(github);
      expect(await post('/webhook/github', pushHeaders(github, NEW.GITHUB_WEBHOOK_SECRET!, body), body)).toBe(403);
      expect(await post('/webhook/alerts', { 'Content-Type': 'application/json' }, alert())).toBe(202);

      late.write({
        'api-keys.yaml': keysFile({ id: 'ci-late', key: NEW_KEY }),
        GITHUB_WEBHOOK_SECRET: `${NEW.GITHUB_WEBHOOK_SECRET}\n`,
        ALERTS_WEBHOOK_TOKEN: `${NEW.ALERTS_WEBHOOK_TOKEN}\n`,
      });
      await waitFor(
        'the github secret in use',
        async () => {
          const b = pushPayload(github);
          return (await post('/webhook/github', pushHeaders(github, NEW.GITHUB_WEBHOOK_SECRET!, b), b)) === 202;
        },
        20_000,
      );
      await waitFor(
        '/webhook/alerts closed',
        async () => (await post('/webhook/alerts', { 'Content-Type': 'application/json' }, alert())) === 401,
        20_000,
      );
      expect(
        await post('/webhook/alerts', { 'Content-Type': 'application/json', Authorization: `Bearer ${NEW.ALERTS_WEBHOOK_TOKEN}` }, alert()),
      ).toBe(202);
      expect(p.exited).toBe(false);
    } finally {
      await p.stop();
    }
  }, 120_000);
});

describe('start-up', () => {
  it('an invalid secret file, and a variable set with its _FILE: exit 1, one stderr line each, no value', async () => {
    const bad = new SecretVolume(join(dir, 'bad'));
    bad.write({ GITEA_WEBHOOK_SECRET: 'one-gitea-value\n\n' });
    const p = spawnNode(API_ENTRY, {
      env: {
        PORT: String(await freePort()),
        METRICS_PORT: String(await freePort()),
        REDIS_URL: srv.url,
        OPS_API_KEY_ROLES: `${RO_KEY}:readonly`,
        GITEA_WEBHOOK_SECRET_FILE: bad.path('GITEA_WEBHOOK_SECRET'),
        SCM_WEBHOOK_SECRET: 'scm-env-value-0001',
        SCM_WEBHOOK_SECRET_FILE: bad.path('GITEA_WEBHOOK_SECRET'),
      },
    });
    try {
      expect((await p.waitExit(60_000)).code).toBe(1);
      expect(p.stderr.filter((l) => l !== '').sort()).toEqual([
        'opsgate-api: configuration error: GITEA_WEBHOOK_SECRET_FILE: line 2 is empty',
        'opsgate-api: configuration error: SCM_WEBHOOK_SECRET_FILE: is set together with SCM_WEBHOOK_SECRET; set one of them',
      ]);
      expect([...p.lines, ...p.stderr].join('\n')).not.toMatch(/one-gitea-value|scm-env-value-0001/);
    } finally {
      await p.stop();
    }
  }, 90_000);
});
