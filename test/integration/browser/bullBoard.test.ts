import { createServer, type Server } from 'node:http';
import { mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from '@jest/globals';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { startApi, startWorkerProcess, type OpsProcess } from '../../helpers/processes.js';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';

/**
 * Bull Board end to end in a real headless Chromium (Debian's chromium, `make chromium`), driven
 * by playwright-core, against the real built API and worker on a real redis-server:
 * a firing alert -> notify_oncall -> the on-call endpoint answers 400 -> the job is dead-lettered.
 * The operator logs in with HTTP Basic (operator key as password), sees the job in the Failed tab
 * with its reason, the endpoint is fixed (answers 200), the operator clicks Retry, and the job
 * completes (the endpoint receives the notification; the job shows up under Completed).
 * Screenshots go to artifacts/ (git-ignored).
 */
const ROOT = resolve(import.meta.dirname, '../../..');
const ARTIFACTS = join(ROOT, 'artifacts');
const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const OPERATOR = 'e2e-operator-key-9f8e7d6c';
const READONLY = 'e2e-readonly-key-1a2b3c4d';
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

describe('Bull Board in headless Chromium', () => {
  let redisServer: RedisServer;
  let api: OpsProcess & { baseUrl: string };
  let worker: OpsProcess;
  let receiver: Server;
  let receiverStatus = 400;
  const received: { status: number; body: string }[] = [];
  const profiles: string[] = [];
  const contexts: BrowserContext[] = [];
  let jobId = '';

  async function launch(credentials?: { username: string; password: string }): Promise<Page> {
    const profile = mkdtempSync(join(tmpdir(), 'opsgate-chromium-'));
    profiles.push(profile);
    const ctx = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: CHROMIUM_ARGS,
      viewport: { width: 1400, height: 900 },
      timeout: 60000,
      ...(credentials ? { httpCredentials: credentials } : {}),
    });
    contexts.push(ctx);
    const page = ctx.pages()[0] ?? (await ctx.newPage());
    // Closed network: the board's web-font stylesheet (an external host) would only time out.
    await page.route(/^https?:\/\/(?!127\.0\.0\.1[:/])/, (route) => route.abort());
    page.setDefaultTimeout(30000);
    return page;
  }

  beforeAll(async () => {
    mkdirSync(ARTIFACTS, { recursive: true });
    redisServer = await startRedis();
    receiver = createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        received.push({ status: receiverStatus, body });
        res.writeHead(receiverStatus, { 'Content-Type': 'application/json' }).end('{}');
      });
    });
    const receiverPort = await freePort();
    await new Promise<void>((r) => receiver.listen(receiverPort, '127.0.0.1', () => r()));
    api = await startApi({
      env: {
        PORT: String(await freePort()),
        METRICS_PORT: String(await freePort()),
        REDIS_URL: redisServer.url,
        OPS_API_KEY_ROLES: `${OPERATOR}:operator,${READONLY}:readonly`,
        RATE_LIMIT_RPS: '0',
        ADMIN_UI_ENABLED: 'true',
        JOB_ATTEMPTS: '3',
        JOB_BACKOFF_MS: '200',
      },
    });
    worker = await startWorkerProcess({
      env: {
        METRICS_PORT: String(await freePort()),
        REDIS_URL: redisServer.url,
        NOTIFY_WEBHOOK_URLS: `http://127.0.0.1:${receiverPort}/oncall`,
      },
    });
    const res = await fetch(`${api.baseUrl}/webhook/alerts`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({
        alerts: [
          { status: 'firing', fingerprint: 'fp-e2e', labels: { alertname: 'DiskFull' }, annotations: { summary: 'disk full on db-1' } },
        ],
      }),
    });
    expect(res.status).toBe(202);
    const dead = await worker.waitForLog((l) => l.msg === 'job dead-lettered', 30000);
    jobId = String(dead.job_id);
    expect(received).toHaveLength(1);
  }, 120000);

  afterAll(async () => {
    for (const c of contexts) await c.close().catch(() => {});
    await api?.stop();
    await worker?.stop();
    await new Promise<void>((r) => (receiver ? receiver.close(() => r()) : r()));
    await redisServer?.destroy();
    for (const p of profiles) rmSync(p, { recursive: true, force: true });
  });

  test('without credentials the browser gets the Basic challenge (401 JSON); a readonly key gets 403', async () => {
    // Headless Chromium cannot show the login prompt: it cancels the Basic challenge, which it
    // reports as ERR_INVALID_AUTH_CREDENTIALS; the 401 response itself is seen on the wire.
    const page = await launch();
    const seen: { status: number; challenge: string | null; body: string }[] = [];
    page.on('response', (r) => {
      if (r.url().endsWith('/admin/queues')) {
        void r.text().then(
          (body) => seen.push({ status: r.status(), challenge: r.headers()['www-authenticate'] ?? null, body }),
          () => seen.push({ status: r.status(), challenge: r.headers()['www-authenticate'] ?? null, body: '' }),
        );
      }
    });
    const err = await page.goto(`${api.baseUrl}/admin/queues`, { waitUntil: 'domcontentloaded' }).then(
      () => undefined,
      (e: Error) => e,
    );
    expect(err?.message).toMatch(/ERR_INVALID_AUTH_CREDENTIALS/);
    const anon = await page.request.get(`${api.baseUrl}/admin/queues`);
    expect(anon.status()).toBe(401);
    expect(anon.headers()['www-authenticate']).toMatch(/^Basic realm="opsgate"/);
    expect(await anon.json()).toMatchObject({ detail: expect.any(String), code: 'missing_credentials' });
    for (const r of seen) {
      expect(r.status).toBe(401);
      expect(r.challenge).toMatch(/^Basic realm="opsgate"/);
    }

    const ro = await launch({ username: 'viewer', password: READONLY });
    const denied = await ro.goto(`${api.baseUrl}/admin/queues`, { waitUntil: 'domcontentloaded' });
    expect(denied?.status()).toBe(403);
    expect(JSON.parse(await ro.locator('body').innerText())).toEqual({ detail: 'operator role required', code: 'operator_role_required' });
  }, 120000);

  test('operator logs in with HTTP Basic, sees the dead-lettered job with its reason, retries it, and it completes', async () => {
    const page = await launch({ username: 'sre', password: OPERATOR });
    const res = await page.goto(`${api.baseUrl}/admin/queues/queue/ops?status=failed`, { waitUntil: 'domcontentloaded' });
    expect(res?.status()).toBe(200);

    // The failed (= dead-lettered) job, with its name and failure reason.
    const card = page.locator('div', { hasText: jobId }).filter({ hasText: 'ops_worker.notify_oncall' }).last();
    await page.getByText(jobId).first().waitFor({ timeout: 30000 });
    await page
      .getByText(/notification rejected by 1 of 1 endpoint\(s\): 127\.0\.0\.1:\d+ \(HTTP 400\)/)
      .first()
      .waitFor();
    expect(await card.innerText()).toContain('ops_worker.notify_oncall');
    await page.screenshot({ path: join(ARTIFACTS, 'bullboard-dead-lettered.png'), fullPage: true });

    // The endpoint is fixed; retry from the board.
    receiverStatus = 200;
    const retryResponse = page.waitForResponse((r) => r.request().method() === 'PUT' && r.url().endsWith(`/api/queues/ops/${jobId}/retry`));
    // The job card's action icons (failed jobs: Retry, Duplicate, Edit, Clean) carry their name in a
    // tooltip; hover the first one and check it really is "Retry" before clicking it.
    const retryButton = page.locator('ul[class*="jobActions"] > li').first().locator('button');
    await retryButton.hover();
    await page.getByText('Retry', { exact: true }).first().waitFor({ state: 'visible', timeout: 10000 });
    await retryButton.click();
    // The board may ask for confirmation (setting "confirm actions").
    const confirm = page.getByRole('alertdialog').or(page.getByRole('dialog'));
    if (await confirm.isVisible().catch(() => false)) {
      await confirm
        .getByRole('button', { name: /retry|confirm|yes|ok/i })
        .first()
        .click();
    }
    const put = await retryResponse;
    expect(put.status()).toBe(204);

    // Watch it complete: the worker delivers it and the board lists it under Completed.
    await worker.waitForLog((l) => l.msg === 'job completed' && l.job_id === jobId, 30000);
    expect(received.filter((r) => r.status === 200)).toHaveLength(1);
    expect(JSON.parse(received.at(-1)!.body)).toMatchObject({ alertname: 'DiskFull' });
    await page.goto(`${api.baseUrl}/admin/queues/queue/ops?status=completed`, { waitUntil: 'domcontentloaded' });
    await page.getByText(jobId).first().waitFor({ timeout: 30000 });
    await page.screenshot({ path: join(ARTIFACTS, 'bullboard-retried-completed.png'), fullPage: true });
    expect(statSync(join(ARTIFACTS, 'bullboard-retried-completed.png')).size).toBeGreaterThan(10000);

    // The retry is audited: who (credential id, never the key), method, full path, status, request id.
    const audit = api
      .logs()
      .filter((l) => l.msg === 'audit' && l.method === 'PUT' && l.path === `/admin/queues/api/queues/ops/${jobId}/retry`);
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({ status: 204, role: 'operator' });
    expect(String(audit[0]!.who)).toMatch(/^key:[0-9a-f]{12}$/);
    expect(typeof audit[0]!.request_id).toBe('string');
    expect(api.lines.join('\n')).not.toContain(OPERATOR);
  }, 180000);
});
