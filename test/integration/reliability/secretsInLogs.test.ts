/**
 * No configured secret in any log line of a full run: the real API and worker processes at
 * LOG_LEVEL=debug, every endpoint called with right and wrong credentials (secrets presented in
 * the wrong header, Basic auth, signatures), failures included (Redis outage, notification
 * endpoint failing, Kubernetes unreachable, dead letters), then a graceful shutdown. Every
 * stdout and stderr line of both processes is searched for every secret, in plain, JSON-escaped,
 * URL-encoded and base64 forms. Secrets: API keys (one containing colons), bearer token, scm and
 * GitHub webhook secrets, alerts token, the notification webhook URL's secret path and query
 * token, and the kubeconfig's bearer token.
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createHmac } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startApi, startWorkerProcess, type OpsProcess } from '../../helpers/processes.js';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import {
  alertPayload,
  apiEnv,
  inspectQueue,
  makeSecrets,
  post,
  scmPush,
  secretValues,
  startReceiver,
  waitFor,
  workerEnv,
  type Receiver,
} from '../../helpers/reliability.js';

const secrets = makeSecrets('logs');
const NOTIFY_PATH_SECRET = 'hookpath-SECRETNOTIFYPATH-' + Math.random().toString(36).slice(2, 8);
const NOTIFY_QUERY_SECRET = 'qtok-SECRETNOTIFYQUERY-' + Math.random().toString(36).slice(2, 8);
const KUBE_TOKEN = 'kubetok-SECRETKUBE-' + Math.random().toString(36).slice(2, 8);

let redis: RedisServer;
let receiver: Receiver;
let api: OpsProcess & { baseUrl: string };
let worker: OpsProcess;
let dir: string;

function forms(s: string): string[] {
  return [s, JSON.stringify(s).slice(1, -1), encodeURIComponent(s), Buffer.from(s).toString('base64')];
}

beforeAll(async () => {
  redis = await startRedis();
  receiver = await startReceiver();
  dir = mkdtempSync(join(tmpdir(), 'opsgate-logs-'));
  const inventory = join(dir, 'inventory.json');
  writeFileSync(
    inventory,
    JSON.stringify({
      hosts: { 'web-01': { namespace: 'shop', deployments: ['web'] } },
      projects: { 'team/app': { namespace: 'ci', serviceAccountName: 'deployer', image: 'busybox:1.36' } },
    }),
  );
  const kubeconfig = join(dir, 'kubeconfig.yaml');
  writeFileSync(
    kubeconfig,
    `apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:${await freePort()}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: ${KUBE_TOKEN}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n`,
  );
  const notifyUrl = `${receiver.url.replace('/hooks/oncall', '')}/services/${NOTIFY_PATH_SECRET}?token=${NOTIFY_QUERY_SECRET}`;
  api = await startApi({
    env: await apiEnv(redis.url, secrets, {
      LOG_LEVEL: 'debug',
      ALERTS_WEBHOOK_TOKEN: secrets.alerts,
      OPS_INVENTORY_FILE: inventory,
      KUBECONFIG: kubeconfig,
      JOB_ATTEMPTS: '2',
      JOB_BACKOFF_MS: '100',
      RATE_LIMIT_RPS: '1000',
      ADMIN_UI_ENABLED: 'true',
    }),
  });
  worker = await startWorkerProcess({
    env: await workerEnv(redis.url, {
      LOG_LEVEL: 'debug',
      NOTIFY_WEBHOOK_URLS: notifyUrl,
      OPS_INVENTORY_FILE: inventory,
      KUBECONFIG: kubeconfig,
    }),
  });
}, 90_000);

afterAll(async () => {
  await api?.stop();
  await worker?.stop();
  await receiver?.close();
  await redis?.destroy();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('no secret in any log line of a full run', () => {
  it('exercises every endpoint, failures included, and finds no secret in api or worker output', async () => {
    const u = api.baseUrl;
    const all = [...secretValues(secrets)];
    const get = (path: string, headers: Record<string, string> = {}, method = 'GET') =>
      fetch(`${u}${path}`, { method, headers }).then(async (r) => ({ status: r.status, text: await r.text() }));

    // Every endpoint, every credential in every header (right and wrong places).
    for (const s of all) {
      for (const h of ['X-API-Key', 'X-Scm-Token', 'X-Hub-Signature-256']) {
        await get('/ops/hosts', { [h]: s });
        await get('/ops/cache', { [h]: s }, 'DELETE');
        await get('/ops/jobs/1', { [h]: s });
        await get('/admin/queues', { [h]: s });
      }
      await get('/ops/restart?host=web-01&service=nope', { Authorization: `Bearer ${s}` }, 'POST');
      await get('/ops/hosts', { Authorization: `Basic ${Buffer.from(`admin:${s}`).toString('base64')}` });
      await get('/admin/queues', { Authorization: `Basic ${Buffer.from(`admin:${s}`).toString('base64')}` });
      await post(`${u}/webhook/scm`, scmPush('team/app', 'x'), { 'X-Scm-Token': s, 'X-Scm-Event': 'Push Hook' });
      await post(`${u}/webhook/alerts`, alertPayload([{ fingerprint: 'a' }]), { Authorization: `Bearer ${s}` });
      await get(`/ops/hosts/${encodeURIComponent(s)}`, { 'X-API-Key': secrets.readonlyKey });
      await get(`/ops/jobs/${encodeURIComponent(s)}`, { 'X-API-Key': secrets.readonlyKey });
      await get(`/nope?token=${encodeURIComponent(s)}`);
      await get('/ops/cache', { 'X-Request-Id': s, 'X-API-Key': 'wrong' }, 'DELETE'); // request ids are logged
    }
    // The right ones: successes that create work.
    expect((await get('/ops/hosts', { 'X-API-Key': secrets.colonKey })).status).toBe(200);
    expect((await get('/ops/hosts/web-01', { 'X-API-Key': secrets.readonlyKey })).status).toBe(503); // Kubernetes unreachable
    expect((await get('/ops/cache', { 'X-API-Key': secrets.operatorKey }, 'DELETE')).status).toBe(200);
    expect(
      (await get('/admin/queues', { Authorization: `Basic ${Buffer.from(`ops:${secrets.operatorKey}`).toString('base64')}` })).status,
    ).toBe(200);
    const restart = await get('/ops/restart?host=web-01&service=web', { Authorization: `Bearer ${secrets.bearer}` }, 'POST');
    expect(restart.status).toBe(200);
    expect(
      (await post(`${u}/webhook/scm`, scmPush('team/app', 'logs-sha'), { 'X-Scm-Token': secrets.scm, 'X-Scm-Event': 'Push Hook' })).status,
    ).toBe(202);
    const ghBody = JSON.stringify({ ref: 'refs/heads/main', after: 'abcdef1', repository: { full_name: 'team/app' } });
    const sig = 'sha256=' + createHmac('sha256', secrets.github).update(ghBody).digest('hex');
    expect((await post(`${u}/webhook/github`, ghBody, { 'X-Hub-Signature-256': sig, 'X-GitHub-Event': 'push' })).status).toBe(202);
    receiver.status = (b) => (String(b.fingerprint).startsWith('fail') ? 500 : 200);
    expect(
      (
        await post(`${u}/webhook/alerts`, alertPayload([{ fingerprint: 'ok-1', summary: 'disk full' }, { fingerprint: 'fail-1' }]), {
          Authorization: `Bearer ${secrets.alerts}`,
        })
      ).status,
    ).toBe(202);

    // Failures: jobs retried and dead-lettered (Kubernetes unreachable, endpoint 500), Redis outage.
    const q = inspectQueue(redis.url);
    let dead = 0;
    try {
      // Dead: the restart, alert fail-1 (HTTP 500) and the newest of the 3 deploys of one project and
      // ref (scm x2, github; Kubernetes unreachable); an older deploy of them is dead too, or ends
      // superseded (completed) when the newest started before its retry (docs/deploys.md).
      // Completed besides: alerts a and ok-1, and the 4 reports of how the restart and the deploys
      // ended (posted too: their text must hold no secret either). 11 jobs in all.
      await waitFor(
        'the 11 jobs ended: at least 3 dead-lettered, the rest completed',
        async () => {
          const c = await q.counts();
          dead = c.failed;
          return c.failed >= 3 && c.failed + c.completed === 11 && c.waiting + c.active + c.delayed === 0;
        },
        90_000,
        200,
      );
    } finally {
      await q.close();
    }
    await redis.stop();
    try {
      expect(
        (await post(`${u}/webhook/scm`, scmPush('team/app', 'during-outage'), { 'X-Scm-Token': secrets.scm, 'X-Scm-Event': 'Push Hook' }))
          .status,
      ).toBe(503);
      expect((await get('/ready')).status).toBe(503);
      await get('/ops/hosts', { 'X-API-Key': secrets.operatorKey });
      await new Promise((r) => setTimeout(r, 1500)); // let the worker log its connection errors
    } finally {
      await redis.start();
    }
    await waitFor('api ready again', async () => (await get('/ready')).status === 200, 30_000, 100);

    // Graceful shutdown logs too.
    api.kill('SIGTERM');
    worker.kill('SIGTERM');
    await Promise.all([api.waitExit(30_000), worker.waitExit(60_000)]);

    // ---- the search
    const secretsAll = [...all, NOTIFY_PATH_SECRET, NOTIFY_QUERY_SECRET, KUBE_TOKEN];
    const outputs = [
      ['api stdout', api.lines],
      ['api stderr', api.stderr],
      ['worker stdout', worker.lines],
      ['worker stderr', worker.stderr],
    ] as const;
    let total = 0;
    for (const [name, lines] of outputs) {
      for (const line of lines) {
        total++;
        for (const s of secretsAll)
          for (const f of forms(s))
            if (line.includes(f)) throw new Error(`${name} leaks a secret (${s.slice(0, 8)}...): ${line.slice(0, 300)}`);
      }
    }
    // The run really produced the logs it is meant to check: audits, failures, dead letters, outage.
    expect(total).toBeGreaterThan(100);
    const apiLogs = api.logs();
    const workerLogs = worker.logs();
    expect(apiLogs.filter((l) => l.msg === 'audit').length).toBeGreaterThan(40); // state-changing calls and webhooks are audited
    expect(apiLogs.some((l) => l.msg === 'audit' && l.status === 401)).toBe(true);
    expect(apiLogs.some((l) => l.msg === 'audit' && l.status === 503)).toBe(true);
    expect(workerLogs.filter((l) => l.msg === 'job dead-lettered')).toHaveLength(dead);
    expect(workerLogs.some((l) => l.msg === 'notification delivered')).toBe(true);
    // Every stdout line is a structured JSON log line.
    for (const [, lines] of outputs.filter(([n]) => n.endsWith('stdout')))
      for (const line of lines) expect(() => JSON.parse(line)).not.toThrow();
  }, 240_000);
});
