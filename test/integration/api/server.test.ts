import { createHash } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import { API_ENTRY, spawnNode, startApi } from '../../helpers/processes.js';
import { INVENTORY_YAML, OP_KEY, RO_KEY, SCM_SECRET, BEARER } from '../../helpers/apiHarness.js';

/**
 * The real entry point (node dist/src/server.js, built by the jest globalSetup) as a process:
 * start-up refusals (exit 1, exactly one stderr line naming the variable, never its value),
 * serving, and graceful SIGTERM (stop accepting, finish in-flight, close, exit 0).
 */
let srv: RedisServer;
let dir: string;

beforeAll(async () => {
  srv = await startRedis();
  dir = mkdtempSync(join(tmpdir(), 'opsgate-api-server-'));
});
afterAll(async () => {
  await srv?.destroy();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** Real processes start slowly on a loaded 2-core machine: generous per-test bound. */
const PROCESS_TIMEOUT = 120_000;
const SECRET_LOOKING = 'sUp3r-s3cret-value-XYZ';

async function refusal(env: Record<string, string | undefined>) {
  const p = spawnNode(API_ENTRY, { env: { PORT: String(await freePort()), METRICS_PORT: String(await freePort()), ...env } });
  try {
    const exit = await p.waitExit(30000);
    return { exit, stderr: p.stderr.filter((l) => l !== ''), stdout: p.lines };
  } finally {
    await p.stop();
  }
}

describe('start-up refusals (real process)', () => {
  const good = () => ({ OPS_API_KEY_ROLES: `${RO_KEY}:readonly`, REDIS_URL: srv.url });
  // Each case is a real process start (a few seconds on a loaded machine); every other refusal
  // case of the parser is covered in test/unit/shared/config.test.ts.
  it.each([
    { name: 'OPS_API_KEY_ROLES missing', env: { OPS_API_KEY_ROLES: undefined }, variable: 'OPS_API_KEY_ROLES' },
    { name: 'item without key:role', env: { OPS_API_KEY_ROLES: SECRET_LOOKING }, variable: 'OPS_API_KEY_ROLES' },
    { name: 'unknown role', env: { OPS_API_KEY_ROLES: `${SECRET_LOOKING}:admin` }, variable: 'OPS_API_KEY_ROLES' },
    { name: 'REDIS_URL missing', env: { REDIS_URL: undefined }, variable: 'REDIS_URL' },
    { name: 'REDIS_URL not a redis URL', env: { REDIS_URL: `http://user:${SECRET_LOOKING}@host` }, variable: 'REDIS_URL' },
    { name: 'OPS_INVENTORY_FILE unreadable', env: { OPS_INVENTORY_FILE: '/nonexistent/inventory.yaml' }, variable: 'OPS_INVENTORY_FILE' },
  ])(
    '$name -> exit 1, one stderr line naming $variable, never the value',
    async ({ env, variable }) => {
      const r = await refusal({ ...good(), ...env });
      expect(r.exit.code).toBe(1);
      expect(r.stderr).toHaveLength(1);
      expect(r.stderr[0]).toMatch(new RegExp(`^opsgate-api: configuration error: ${variable}: `));
      expect(r.stderr[0]).not.toContain(SECRET_LOOKING);
      expect(r.stdout.join('\n')).not.toContain(SECRET_LOOKING);
    },
    PROCESS_TIMEOUT,
  );
  it(
    'an invalid inventory file -> exit 1 naming OPS_INVENTORY_FILE',
    async () => {
      const file = join(dir, 'bad.yaml');
      writeFileSync(file, 'hosts:\n  web-1:\n    namespace: "Not A Label"\n    deployments: [x]\n');
      const r = await refusal({ ...good(), OPS_INVENTORY_FILE: file });
      expect(r.exit.code).toBe(1);
      expect(r.stderr).toHaveLength(1);
      expect(r.stderr[0]).toMatch(/^opsgate-api: configuration error: OPS_INVENTORY_FILE: /);
    },
    PROCESS_TIMEOUT,
  );
  it(
    'bad entries of the keys file -> every one reported by position and id, with the other variables, never a key or a hash',
    async () => {
      const file = join(dir, 'api-keys.yaml');
      const hash = createHash('sha256').update(SECRET_LOOKING).digest('hex');
      writeFileSync(
        file,
        [
          `- { id: ci, role: operator, key: ${SECRET_LOOKING} }`,
          `- { id: ci, role: readonly, key: ${SECRET_LOOKING}-2 }`,
          `- { id: dash, role: readonly, sha256: ${hash} }`,
          `- { id: later, role: readonly, key: ${SECRET_LOOKING}-3, expires: next week }`,
        ].join('\n'),
      );
      const r = await refusal({ ...good(), OPS_API_KEYS_FILE: file, PORT: 'eighty' });
      expect(r.exit.code).toBe(1);
      expect(r.stderr).toEqual([
        'opsgate-api: configuration error: OPS_API_KEYS_FILE: entry 2 (id "ci") repeats the id of entry 1',
        'opsgate-api: configuration error: OPS_API_KEYS_FILE: entry 3 (id "dash") holds the same key as entry 1 (id "ci"); list each key once',
        'opsgate-api: configuration error: OPS_API_KEYS_FILE: entry 4 (id "later") has an expires that is not an RFC 3339 date-time such as 2026-03-01T00:00:00Z',
        expect.stringMatching(/^opsgate-api: configuration error: PORT: /),
      ]);
      const line = JSON.parse(r.stdout[0]!) as { problems: Array<{ variable: string }> };
      expect(line.problems.map((p) => p.variable)).toEqual(['OPS_API_KEYS_FILE', 'OPS_API_KEYS_FILE', 'OPS_API_KEYS_FILE', 'PORT']);
      const all = [...r.stderr, ...r.stdout].join('\n');
      expect(all).not.toContain(SECRET_LOOKING);
      expect(all).not.toContain(hash);
    },
    PROCESS_TIMEOUT,
  );
  it(
    'two bad variables at once -> both reported: one JSON log line and one stderr line each, exit 1, no value',
    async () => {
      const r = await refusal({
        ...good(),
        OPS_API_KEY_ROLES: `${SECRET_LOOKING}:admin`,
        REDIS_URL: `http://user:${SECRET_LOOKING}@host`,
        PORT: 'eighty',
      });
      expect(r.exit.code).toBe(1);
      expect(r.stderr).toEqual([
        expect.stringMatching(/^opsgate-api: configuration error: OPS_API_KEY_ROLES: item 1 has a role that is not readonly or operator$/),
        expect.stringMatching(/^opsgate-api: configuration error: (REDIS_URL|PORT): /),
        expect.stringMatching(/^opsgate-api: configuration error: (REDIS_URL|PORT): /),
      ]);
      expect(r.stderr.join('\n')).toContain('REDIS_URL');
      expect(r.stderr.join('\n')).toContain('PORT');
      expect(r.stdout).toHaveLength(1);
      const line = JSON.parse(r.stdout[0]!) as {
        level: string;
        component: string;
        msg: string;
        problems: Array<{ variable: string; problem: string }>;
      };
      expect(line).toMatchObject({ level: 'error', component: 'api', msg: 'configuration error' });
      expect(line.problems.map((p) => p.variable).sort()).toEqual(['OPS_API_KEY_ROLES', 'PORT', 'REDIS_URL']);
      for (const p of line.problems) expect(p.problem).not.toBe('');
      expect([...r.stderr, ...r.stdout].join('\n')).not.toContain(SECRET_LOOKING);
      expect([...r.stderr, ...r.stdout].join('\n')).not.toContain('eighty');
    },
    PROCESS_TIMEOUT,
  );
});

describe('Redis unreachable at start (real process)', () => {
  it(
    'logs it with the URL minus its password, /ready answers 503 saying why, and 200 once a Redis listens there',
    async () => {
      const redisPort = await freePort();
      const password = 'pw-ready-SECRET-77';
      const port = await freePort();
      const p = spawnNode(API_ENTRY, {
        env: {
          PORT: String(port),
          METRICS_PORT: String(await freePort()),
          OPS_API_KEY_ROLES: `${RO_KEY}:readonly`,
          REDIS_URL: `redis://:${password}@127.0.0.1:${redisPort}`,
        },
      });
      let late: RedisServer | undefined;
      try {
        const logged = await p.waitForLog((l) => l.msg === 'redis connection error', 60_000);
        expect(logged).toMatchObject({
          level: 'warn',
          component: 'api',
          redis: `redis://:***@127.0.0.1:${redisPort}`,
          reason: 'ECONNREFUSED',
        });
        await p.waitForLog((l) => l.msg === 'api listening', 60_000);
        const down = await fetch(`http://127.0.0.1:${port}/ready`);
        expect(down.status).toBe(503);
        expect(down.headers.get('retry-after')).toMatch(/^\d+$/);
        expect(await down.json()).toEqual({ detail: 'redis unreachable: ECONNREFUSED', code: 'redis_unavailable' });

        late = await startRedis({ port: redisPort, password });
        const deadline = Date.now() + 60_000;
        let status = 0;
        while (status !== 200 && Date.now() < deadline) {
          status = (await fetch(`http://127.0.0.1:${port}/ready`)).status;
          if (status !== 200) await new Promise((r) => setTimeout(r, 100));
        }
        expect(status).toBe(200);
        await p.waitForLog((l) => l.msg === 'redis connection restored', 10_000);
        expect([...p.lines, ...p.stderr].join('\n')).not.toContain(password);
      } finally {
        await p.stop();
        await late?.destroy();
      }
    },
    PROCESS_TIMEOUT,
  );
});

describe('running process', () => {
  it(
    'serves the API, logs without secrets, drains in-flight requests on SIGTERM and exits 0',
    async () => {
      const inv = join(dir, 'inventory.yaml');
      writeFileSync(inv, INVENTORY_YAML);
      const port = await freePort();
      const api = await startApi({
        env: {
          PORT: String(port),
          METRICS_PORT: String(await freePort()),
          REDIS_URL: srv.url,
          OPS_API_KEY_ROLES: `${RO_KEY}:readonly,${OP_KEY}:operator`,
          OPS_BEARER_TOKEN: BEARER,
          SCM_WEBHOOK_SECRET: SCM_SECRET,
          OPS_INVENTORY_FILE: inv,
          RATE_LIMIT_RPS: '0',
          OPSGATE_VERSION: '1.2.3-test',
        },
      });
      try {
        const health = await fetch(`${api.baseUrl}/health`);
        expect(await health.json()).toEqual({ status: 'ok' });
        expect(await (await fetch(`${api.baseUrl}/version`)).json()).toMatchObject({ version: '1.2.3-test' });
        const hosts = await fetch(`${api.baseUrl}/ops/hosts`, { headers: { 'X-API-Key': RO_KEY } });
        expect(await hosts.json()).toEqual({ hosts: ['db-1', 'web-1'] });
        const restart = await fetch(`${api.baseUrl}/ops/restart?host=web-1&service=frontend`, {
          method: 'POST',
          headers: { Authorization: `Bearer ${BEARER}` },
        });
        expect(restart.status).toBe(200);

        // An in-flight request: headers and half a body sent, then SIGTERM, then the rest.
        const body = JSON.stringify({ ref: 'refs/heads/main', checkout_sha: 'drain01', project: { path_with_namespace: 'g/p' } });
        const inflight = new Promise<{ status: number; body: string }>((resolve, reject) => {
          const req = httpRequest(
            {
              host: '127.0.0.1',
              port,
              method: 'POST',
              path: '/webhook/scm',
              headers: {
                'Content-Type': 'application/json',
                'Content-Length': Buffer.byteLength(body),
                'X-Scm-Token': SCM_SECRET,
                'X-Scm-Event': 'Push Hook',
              },
            },
            (res) => {
              let text = '';
              res.on('data', (c: Buffer) => (text += c.toString()));
              res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
            },
          );
          req.on('error', reject);
          req.write(body.slice(0, 10));
          setTimeout(() => {
            api.kill('SIGTERM');
            setTimeout(() => req.end(body.slice(10)), 500);
          }, 300);
        });
        const done = await inflight;
        expect(done.status).toBe(202);
        expect(JSON.parse(done.body)).toMatchObject({ accepted: true, event_id: 'scm:g/p:refs/heads/main:drain01' });
        const exit = await api.waitExit(20000);
        expect(exit.code).toBe(0);
        // After the drain nothing listens any more.
        await expect(fetch(`${api.baseUrl}/health`)).rejects.toThrow();

        const logs = api.logs();
        expect(logs.some((l) => l.msg === 'api stopped')).toBe(true);
        const audit = logs.filter((l) => l.msg === 'audit');
        expect(audit.map((l) => [l.method, l.path, l.status].join(' '))).toEqual(['POST /ops/restart 200', 'POST /webhook/scm 202']);
        const all = api.lines.join('\n') + api.stderr.join('\n');
        for (const s of [RO_KEY, OP_KEY, BEARER, SCM_SECRET]) expect(all).not.toContain(s);

        // The accepted work is on the durable queue after the process is gone.
        const r = new Redis(srv.url);
        try {
          expect(await r.llen('bull:ops:wait')).toBe(2);
          // Its verdict too: the deliveries log sends what waits before Redis closes.
          const logged = await r.xrange('opsgate:deliveries:{scm}', '-', '+');
          expect(logged.map(([, f]) => f[f.indexOf('verdict') + 1])).toEqual(['queued']);
        } finally {
          r.disconnect();
        }
      } finally {
        await api.stop();
      }
    },
    PROCESS_TIMEOUT,
  );
});

describe('Redis unreachable', () => {
  it(
    'the API still starts (liveness 200, readiness 503) and SIGTERM still exits 0 promptly',
    async () => {
      const port = await freePort();
      const deadRedis = `redis://127.0.0.1:${await freePort()}`;
      const p = spawnNode(API_ENTRY, {
        env: {
          PORT: String(port),
          METRICS_PORT: String(await freePort()),
          REDIS_URL: deadRedis,
          OPS_API_KEY_ROLES: `${RO_KEY}:readonly`,
          SCM_WEBHOOK_SECRET: SCM_SECRET,
        },
      });
      try {
        await p.waitForLog((l) => l.msg === 'api listening', 30000);
        const base = `http://127.0.0.1:${port}`;
        expect((await fetch(`${base}/health`)).status).toBe(200);
        const ready = await fetch(`${base}/ready`);
        expect(ready.status).toBe(503);
        expect(ready.headers.get('retry-after')).toMatch(/^\d+$/);
        const hook = await fetch(`${base}/webhook/scm`, {
          method: 'POST',
          headers: { 'X-Scm-Token': SCM_SECRET, 'X-Scm-Event': 'Push Hook' },
          body: JSON.stringify({ ref: 'refs/heads/main', checkout_sha: 'x' }),
        });
        expect(hook.status).toBe(503);
        expect(hook.headers.get('retry-after')).toMatch(/^\d+$/);
        p.kill('SIGTERM');
        const exit = await p.waitExit(20000);
        expect(exit.code).toBe(0);
      } finally {
        await p.stop();
      }
    },
    PROCESS_TIMEOUT,
  );
});
