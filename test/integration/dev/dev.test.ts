import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { connect } from 'node:net';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse as parseYaml } from 'yaml';
import { allDocBlocks, blockScript, runCleanBash, where, type DocBlock, type ShellResult } from '../../helpers/docBlocks.js';
import { freePort } from '../../helpers/redis.js';

/**
 * `make dev` (hack/dev.sh on the built dist/): a local Redis, the API and the worker come up,
 * the printed demo credentials (every endpoint's: API keys, bearer token, scm/GitHub webhook
 * secrets, alerts token) and sample requests work, every documented shell block marked
 * `<!-- doc-test: dev [label] -->` runs as printed against it (with the `export …` line dev.sh
 * prints, in a clean shell; the labelled setup guides have their answers checked, the Alertmanager
 * receiver by the real amtool and then by a real Alertmanager that delivers an alert to the dev
 * API), and Ctrl-C (SIGINT) stops everything.
 */
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
let proc: ChildProcess | undefined;
let alertmanager: ChildProcess | undefined;
const dir = mkdtempSync(join(tmpdir(), 'opsgate-dev-'));
let out = '';
let base = '';
let port = 0;

afterAll(() => {
  if (alertmanager && alertmanager.exitCode === null) alertmanager.kill('SIGKILL');
  if (proc && proc.exitCode === null) process.kill(-proc.pid!, 'SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

const cred = (label: string) => new RegExp(`${label}\\s*:\\s*(\\S+)`).exec(out)![1]!;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until<T>(what: string, fn: () => Promise<T | undefined> | T | undefined, timeoutMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(200);
  }
}

/** Runs a shell snippet as a user would: a clean bash (PATH and HOME only) in `cwd`, after the export line dev.sh printed. */
function sh(script: string, cwd: string, timeoutMs = 60_000): Promise<ShellResult> {
  const exportLine = /^\s*(export OPSGATE_URL=.*)$/m.exec(out)![1]!;
  return runCleanBash(`${exportLine}\n${script}`, cwd, { PATH: process.env.PATH ?? '', HOME: cwd }, timeoutMs);
}

/** Every `doc-test: dev` block of the documentation. */
function devBlocks(): DocBlock[] {
  return allDocBlocks(ROOT).filter((b) => b.marker === 'dev');
}

/** The labelled dev blocks, by label. */
function readmeGuides(): Map<string, DocBlock> {
  return new Map(
    devBlocks()
      .filter((b) => b.arg)
      .map((b) => [b.arg!, b]),
  );
}

function auditLines(): Array<Record<string, unknown>> {
  return readFileSync(join(dir, 'api.log'), 'utf8')
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((l) => l.msg === 'audit');
}

let devEnv: Record<string, string> = {};

/** hack/dev.sh in its own process group (like a terminal session); `output()` is its stdout and stderr so far. */
function spawnDev(env: Record<string, string>): { proc: ChildProcess; output: () => string } {
  let text = '';
  const p = spawn('bash', [join(ROOT, 'hack/dev.sh')], {
    cwd: ROOT,
    detached: true,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  p.stdout.on('data', (d: Buffer) => (text += d.toString()));
  p.stderr.on('data', (d: Buffer) => (text += d.toString()));
  return { proc: p, output: () => text };
}

async function devUp(dev: { proc: ChildProcess; output: () => string }): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (!dev.output().includes('Ctrl-C stops everything')) {
    if (dev.proc.exitCode !== null || Date.now() > deadline) throw new Error(`dev.sh did not come up:\n${dev.output()}`);
    await sleep(100);
  }
}

function exited(p: ChildProcess): Promise<number | null> {
  return new Promise((r) => (p.exitCode !== null ? r(p.exitCode) : p.once('exit', (c) => r(c))));
}

/** Ctrl-C to a dev.sh and its children; one that has not stopped within 30 s is killed, and that fails the test. */
async function stopDev(p: ChildProcess): Promise<void> {
  if (p.exitCode === null) process.kill(-p.pid!, 'SIGINT');
  let late: NodeJS.Timeout | undefined;
  const gone = await Promise.race([exited(p).then(() => true), new Promise<false>((r) => (late = setTimeout(() => r(false), 30_000)))]);
  clearTimeout(late);
  if (!gone) {
    process.kill(-p.pid!, 'SIGKILL');
    throw new Error('dev.sh did not stop within 30 s of Ctrl-C');
  }
}

const SCM_PUSH = JSON.stringify({ ref: 'refs/heads/main', checkout_sha: 'abc123', project: { path_with_namespace: 'acme/storefront' } });

/** The ports of one dev run, asked for when it starts (a stopped run's may be taken since, by another test process). */
async function devPorts(): Promise<{ PORT: string; REDIS_PORT: string; API_METRICS_PORT: string; WORKER_METRICS_PORT: string }> {
  const [p, redisPort, apiMetrics, workerMetrics] = await Promise.all([freePort(), freePort(), freePort(), freePort()]);
  return {
    PORT: String(p),
    REDIS_PORT: String(redisPort),
    API_METRICS_PORT: String(apiMetrics),
    WORKER_METRICS_PORT: String(workerMetrics),
  };
}

beforeAll(async () => {
  devEnv = { ...(await devPorts()), DEV_DIR: dir };
  port = Number(devEnv.PORT);
  base = `http://127.0.0.1:${port}`;
  const dev = spawnDev(devEnv);
  proc = dev.proc;
  try {
    await devUp(dev);
  } finally {
    out = dev.output();
  }
  dev.proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  dev.proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
}, 90_000);

describe('make dev (hack/dev.sh)', () => {
  it('prints demo credentials that work against the running API and worker', async () => {
    const hosts = await fetch(`${base}/ops/hosts`, { headers: { 'X-API-Key': cred('readonly API key') } });
    expect(hosts.status).toBe(200);
    expect(((await hosts.json()) as { hosts: string[] }).hosts).toEqual(['payments-01', 'web-01', 'worker-01']);

    const push = await fetch(`${base}/webhook/scm`, {
      method: 'POST',
      headers: { 'X-Scm-Token': cred('SCM webhook token'), 'X-Scm-Event': 'Push Hook', 'Content-Type': 'application/json' },
      body: SCM_PUSH,
    });
    expect(push.status).toBe(202);
    expect(await push.json()).toMatchObject({ accepted: true, duplicate: false });

    const wrongScm = await fetch(`${base}/webhook/scm`, {
      method: 'POST',
      headers: { 'X-Scm-Token': 'wrong', 'X-Scm-Event': 'Push Hook', 'Content-Type': 'application/json' },
      body: '{}',
    });
    expect(wrongScm.status).toBe(403);

    // The printed GitHub secret signs deliveries; GitHub's ping on webhook creation is answered "ignored".
    const ping = JSON.stringify({ zen: 'Keep it logically awesome.', hook_id: 1 });
    const pinged = await fetch(`${base}/webhook/github`, {
      method: 'POST',
      headers: {
        'X-GitHub-Event': 'ping',
        'X-Hub-Signature-256': `sha256=${createHmac('sha256', cred('GitHub webhook secret')).update(ping).digest('hex')}`,
        'Content-Type': 'application/json',
      },
      body: ping,
    });
    expect(pinged.status).toBe(202);
    expect(await pinged.json()).toMatchObject({ ignored: true });

    // The alerts token is required (dev sets it) and the printed one is accepted.
    const alert = {
      version: '4',
      status: 'firing',
      alerts: [{ status: 'firing', labels: { alertname: 'DevCheck' }, fingerprint: 'dev-check-1' }],
    };
    const noToken = await fetch(`${base}/webhook/alerts`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(alert),
    });
    expect(noToken.status).toBe(401);
    const withToken = await fetch(`${base}/webhook/alerts`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${cred('alerts token')}` },
      body: JSON.stringify(alert),
    });
    expect(withToken.status).toBe(202);

    const restart = await fetch(`${base}/ops/restart?host=web-01&service=storefront`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${cred('bearer token')}` },
    });
    expect(restart.status).toBe(200);
    const { job_id } = (await restart.json()) as { job_id: string };
    // The worker takes the job; with no cluster here it is dead-lettered with a clear reason.
    const job = await until(
      'the restart job to be dead-lettered',
      async () => {
        const r = await fetch(`${base}/ops/jobs/${job_id}`, { headers: { 'X-API-Key': cred('readonly API key') } });
        const j = (await r.json()) as { state?: string; failed_reason?: string };
        return j.state === 'failed' ? j : undefined;
      },
      60_000,
    );
    expect(job.failed_reason).toMatch(/no Kubernetes configuration/);

    const board = await fetch(`${base}/admin/queues`, {
      headers: { Authorization: `Basic ${Buffer.from(`me:${cred('operator API key')}`).toString('base64')}` },
    });
    expect(board.status).toBe(200);

    // Terminal logs are pino-pretty's; the log files keep the JSON lines.
    expect(out).toMatch(/INFO: api listening/);
    // The API writes its log lines asynchronously (pino): on a busy machine they reach the file later.
    await until('an audit line in api.log', () => (auditLines().length > 0 ? true : undefined), 20_000);
    expect(auditLines().length).toBeGreaterThan(0);
  }, 90_000);

  it('runs the documented setup guides (docs/senders.md) as printed and gets the documented answers', async () => {
    const guides = new Map([...readmeGuides()].filter(([label]) => label.startsWith('guide-')));
    const expected = ['guide-gitlab-native', 'guide-gitlab-scm', 'guide-github', 'guide-alertmanager', 'guide-alertmanager-send'];
    expect([...guides.keys()].sort()).toEqual([...expected].sort());
    const work = join(dir, 'guides');
    mkdirSync(work);
    const json = async (name: string) => {
      const block = guides.get(name)!;
      const r = await sh(blockScript(block), work);
      expect({ block: where(block), code: r.code, stderr: r.stderr }).toEqual({ block: where(block), code: 0, stderr: '' });
      return JSON.parse(r.stdout) as Record<string, unknown>;
    };

    // GitLab's own headers on /webhook/gitlab: accepted, then the same delivery again a duplicate.
    expect(await json('guide-gitlab-native')).toMatchObject({ accepted: true, duplicate: false, project: 'acme/storefront' });
    expect(await json('guide-gitlab-native')).toMatchObject({ accepted: false, duplicate: true, project: 'acme/storefront' });

    // GitLab with the contract's headers (X-Scm-Token, X-Scm-Event): accepted, then the same push again a duplicate.
    expect(await json('guide-gitlab-scm')).toMatchObject({ accepted: true, duplicate: false, project: 'acme/storefront' });
    expect(await json('guide-gitlab-scm')).toMatchObject({ accepted: false, duplicate: true, project: 'acme/storefront' });

    // GitHub: the signature computed with openssl over the body is accepted.
    expect(await json('guide-github')).toMatchObject({ accepted: true, duplicate: false, project: 'acme/storefront' });

    // Alertmanager: what it sends is accepted with the token.
    expect(await json('guide-alertmanager-send')).toMatchObject({ received: 1, firing: 1 });

    // Alertmanager: the receiver block is written and the real amtool accepts it.
    const am = await sh(blockScript(guides.get('guide-alertmanager')!), work);
    expect({ block: where(guides.get('guide-alertmanager')!), code: am.code }).toEqual({
      block: where(guides.get('guide-alertmanager')!),
      code: 0,
    });
    expect(am.stdout).toMatch(/SUCCESS/);
    const config = parseYaml(readFileSync(join(work, 'alertmanager.yml'), 'utf8'));
    const wh = config.receivers.find((r: { name: string }) => r.name === config.route.receiver).webhook_configs[0];
    expect(wh).toMatchObject({
      url: `${base}/webhook/alerts`,
      max_alerts: 500,
      send_resolved: true,
      http_config: { authorization: { type: 'Bearer', credentials: cred('alerts token') } },
    });

    // ... and a real Alertmanager running that file delivers an alert to the dev API with the bearer token.
    const alertAudits = () => auditLines().filter((l) => l.path === '/webhook/alerts');
    const before = alertAudits().length;
    const binary = ['/usr/bin/prometheus-alertmanager', '/usr/bin/alertmanager'].find((b) => existsSync(b));
    expect(binary).toBeDefined(); // Debian prometheus-alertmanager (make tools-amtool)
    const amPort = await freePort();
    alertmanager = spawn(
      binary!,
      [
        `--config.file=${join(work, 'alertmanager.yml')}`,
        `--storage.path=${join(work, 'am-data')}`,
        `--web.listen-address=127.0.0.1:${amPort}`,
        '--cluster.listen-address=',
      ],
      { cwd: work, stdio: 'ignore' },
    );
    await until(
      'alertmanager ready',
      async () => ((await fetch(`http://127.0.0.1:${amPort}/-/ready`).catch(() => undefined))?.status === 200 ? true : undefined),
      30_000,
    );
    const add = await sh(
      `amtool alert add --alertmanager.url=http://127.0.0.1:${amPort} alertname=GuideCheck severity=critical --annotation=summary='from a real alertmanager'`,
      work,
    );
    expect({ code: add.code, stderr: add.stderr }).toEqual({ code: 0, stderr: '' });
    // group_wait 10 s, then one delivery: audited as the alerts sender, accepted, and the worker notifies.
    const delivered = await until('the delivery of the real alertmanager', () => alertAudits().slice(before)[0], 60_000);
    expect(delivered).toMatchObject({ method: 'POST', status: 202, who: 'webhook:alerts' });
    await until(
      'the notify job for GuideCheck',
      () => (readFileSync(join(dir, 'worker.log'), 'utf8').includes('"alertname":"GuideCheck"') ? true : undefined),
      30_000,
    );
    alertmanager.kill('SIGTERM');
  }, 150_000);

  it('runs docs/guarded-changes.md as printed: a dry run, four eyes, a freeze with its override and a held deploy', async () => {
    const guards = new Map([...readmeGuides()].filter(([label]) => label.startsWith('guards-')));
    expect([...guards.keys()].sort()).toEqual(['guards-approval', 'guards-dry-run', 'guards-freeze']);
    const work = join(dir, 'guards');
    mkdirSync(work);
    const lines = async (name: string): Promise<string[]> => {
      const block = guards.get(name)!;
      const r = await sh(blockScript(block), work);
      expect({ block: where(block), code: r.code, stderr: r.stderr }).toEqual({ block: where(block), code: 0, stderr: '' });
      return r.stdout.trim().split('\n');
    };
    const json = (l: string | undefined) => JSON.parse(l ?? 'null') as Record<string, any>;

    // the dry run: verdicts, no cluster to ask here, nothing queued
    const [dry] = await lines('guards-dry-run');
    expect(json(dry)).toMatchObject({ dry_run: true, change: 'restart', host: 'web-01', would: 'queue', kubernetes: { checked: false } });

    // four eyes: pending, listed, 403 for the requester, approved by the other operator, the job carries its id
    const [pending, self, approved, job] = await lines('guards-approval');
    const approval = json(pending).approvals[0];
    expect(approval).toMatchObject({ status: 'pending', host: 'payments-01', service: 'api', reason: 'heap at 95%' });
    expect(self).toBe('403');
    expect(json(approved)).toMatchObject({
      status: 'approved',
      job_id: approval.id,
      approval: { approvals: [{ reason: 'dashboards agree (CHG-7)' }] },
    });
    expect(json(job)).toMatchObject({ id: approval.id, name: 'ops_worker.restart_service' });

    // a freeze: the restart refused, overridden with a reason, the push held, both freezes lifted releasing it
    const [refused, forced, heldJob, holds, liftProject, liftNamespace] = await lines('guards-freeze');
    expect(json(refused).detail).toMatch(
      /^restart of Deployment shop\/checkout refused: freeze frz-[0-9a-f]+ of namespace shop until .* \(black friday\)/,
    );
    expect(json(forced)).toMatchObject({ host: 'web-01', service: 'checkout', status: 'submitted' });
    expect(json(heldJob)).toMatchObject({ name: 'ops_worker.run_deploy_pipeline', state: 'held', outcome: { result: 'held' } });
    expect(json(holds).holds.map((h: { job_id: string }) => h.job_id)).toEqual([json(heldJob).id]);
    expect(json(liftProject)).toMatchObject({ lifted: true, released: [json(heldJob).id] });
    expect(json(liftNamespace)).toMatchObject({ lifted: true, released: [] });
    // the override and the decisions are audited with who and why
    await until('the audit lines of the guarded changes', () => (auditLines().some((l) => l.override === true) ? true : undefined), 20_000);
    expect(auditLines().find((l) => l.decision === 'approve' && l.status === 200)).toMatchObject({ reason: 'dashboards agree (CHG-7)' });
  }, 120_000);

  it('runs every other documented dev block as printed, each with exit code 0', async () => {
    const blocks = devBlocks().filter((b) => !b.arg);
    expect(blocks.length).toBeGreaterThan(0);
    const work = join(dir, 'blocks');
    mkdirSync(work);
    for (const b of blocks) {
      const r = await sh(blockScript(b), work, 60_000);
      expect({ block: where(b), code: r.code, stderr: r.stderr }).toEqual({ block: where(b), code: 0, stderr: '' });
    }
  }, 150_000);

  it('refuses a second copy on the same DEV_DIR, naming the running one, and leaves it alone', async () => {
    const logBefore = readFileSync(join(dir, 'api.log'), 'utf8');
    const second = spawnDev({ ...devEnv, ...(await devPorts()) });
    const stray = setTimeout(() => second.proc.exitCode === null && process.kill(-second.proc.pid!, 'SIGINT'), 45_000);
    const code = await exited(second.proc);
    clearTimeout(stray);
    expect(code).toBe(1);
    expect(second.output()).toContain(`make dev is already running: pid ${proc!.pid}, API ${base}, logs in ${dir}`);
    expect(second.output()).not.toContain('Ctrl-C stops everything');
    // The first copy still serves, its log was not truncated, and its lock is still its own.
    expect((await fetch(`${base}/ready`)).status).toBe(200);
    expect(readFileSync(join(dir, 'api.log'), 'utf8').startsWith(logBefore)).toBe(true);
    expect(readFileSync(join(dir, 'dev.pid'), 'utf8').trim()).toBe(`${proc!.pid} ${port}`);
  }, 60_000);

  it('stops everything on Ctrl-C', async () => {
    process.kill(-proc!.pid!, 'SIGINT');
    const code = await exited(proc!);
    expect(code).not.toBeNull();
    await until(
      'the API to be gone',
      async () =>
        (await fetch(`${base}/health`).then(
          () => false,
          () => true,
        ))
          ? true
          : undefined,
      10_000,
    );
    // Redis runs in a session of its own (out of Ctrl-C's reach, stopped last): it is gone too.
    await until(
      'Redis to be gone',
      () =>
        new Promise<true | undefined>((done) => {
          const s = connect(Number(devEnv.REDIS_PORT), '127.0.0.1');
          s.once('connect', () => {
            s.destroy();
            done(undefined);
          });
          s.once('error', () => done(true));
        }),
      10_000,
    );
    expect(existsSync(join(dir, 'dev.pid'))).toBe(false);
  }, 30_000);

  it("starts the next run with an empty database: the first run's push is new again", async () => {
    // The same DEV_DIR, on ports of its own.
    const ports = await devPorts();
    const dev = spawnDev({ ...devEnv, ...ports });
    try {
      await devUp(dev);
      const token = new RegExp('SCM webhook token\\s*:\\s*(\\S+)').exec(dev.output())![1]!;
      const push = await fetch(`http://127.0.0.1:${ports.PORT}/webhook/scm`, {
        method: 'POST',
        headers: { 'X-Scm-Token': token, 'X-Scm-Event': 'Push Hook', 'Content-Type': 'application/json' },
        body: SCM_PUSH,
        signal: AbortSignal.timeout(30_000),
      });
      expect(push.status).toBe(202);
      expect(await push.json()).toMatchObject({ accepted: true, duplicate: false });
    } finally {
      await stopDev(dev.proc);
    }
  }, 120_000);
});
