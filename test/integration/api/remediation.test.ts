import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import request from 'supertest';
import { start } from '../../../src/server.js';
import { ConfigError } from '../../../src/shared/errors.js';
import { JOB } from '../../../src/shared/jobs.js';
import { REMEDIATION_DECISIONS_KEY } from '../../../src/shared/keys.js';
import { OP_KEY, RO_KEY, baseEnv, createHarness, useHarness, type Harness } from '../../helpers/apiHarness.js';
import { restartAs } from '../../helpers/guards.js';
import { startPrometheus, type TestPrometheus } from '../../helpers/prometheus.js';
import { waitFor } from '../../helpers/waitFor.js';

/**
 * Alert-driven remediation through /webhook/alerts, on a real Redis and BullMQ queue, with the
 * notifications posted as Alertmanager posts them, and every alert confirmed by a real Prometheus
 * at PROMETHEUS_URL (the test fires it there before posting it, and stops it before posting its
 * resolution). The real Alertmanager's own deliveries and silences: remediationAlertmanager.test.ts;
 * forged alerts and Prometheus's timing: remediationPrometheus.test.ts. The contract's answer and
 * notify_oncall jobs stay as they are; remediation adds `remediations` and its restart jobs,
 * decided by the change pipeline like a person's restart.
 */
jest.setTimeout(60_000);
const TOKEN = 'alerts-token-for-remediation-0001';
const INVENTORY = `
hosts:
  web-1:
    namespace: shop
    deployments: [frontend, checkout, cart, search, images, basket]
  pay-1:
    namespace: payments
    deployments: [api, ledger]
    policy:
      approval: {required: 1, ttl: 1h}
  batch-1:
    namespace: batch
    deployments: [reports, exports]
    policy:
      budget: {restarts: 1, per: 1h}
remediations:
  - name: down
    match: {alertname: Down, labels: {severity: "=~critical|page"}}
    targets: [web-1, pay-1, batch-1]
    cooldown: 1h
  - name: flappy
    match: {alertname: Flapping}
    targets: [web-1]
    trigger: {episodes: 2, within: 1h}
  - name: slow
    match: {alertname: Slow}
    targets: [web-1]
    trigger: {for: 5s}
  - name: rehearse
    match: {alertname: Rehearse}
    targets: [web-1]
    mode: dry-run
  - name: loop
    match: {alertname: Loop}
    targets: [web-1]
    cooldown: 1s
    escalate_after: 2
    escalation_window: 1h
`;

/** The alerts the rules match, each a rule of the test Prometheus. */
const RULED = ['Down', 'Flapping', 'Slow', 'Rehearse', 'Loop'];
let prom: TestPrometheus;
const env: Record<string, string> = { ALERTS_WEBHOOK_TOKEN: TOKEN };
// Before the harness starts (hooks run in order): it is given PROMETHEUS_URL.
beforeAll(async () => {
  prom = await startPrometheus({ rules: RULED.map((alert) => ({ alert })) });
  env.PROMETHEUS_URL = prom.url;
});
afterAll(async () => {
  await prom?.close();
});
const ctx = useHarness({ inventoryYaml: INVENTORY, env });

let seq = 0;
interface TestAlert {
  status: 'firing' | 'resolved';
  labels: Record<string, string>;
  annotations: Record<string, string>;
  startsAt: string;
  endsAt: string;
  fingerprint: string;
}
/** An alert as Alertmanager's webhook sends one (a firing alert's endsAt is the zero time). */
function alert(alertname: string, deployment: string, extra: Partial<TestAlert> & { labels?: Record<string, string> } = {}): TestAlert {
  seq += 1;
  return {
    status: 'firing',
    annotations: { summary: `${alertname} on ${deployment}` },
    startsAt: new Date(Date.now() - 60_000).toISOString(),
    endsAt: '0001-01-01T00:00:00Z',
    fingerprint: `fp${String(seq).padStart(14, '0')}`,
    ...extra,
    labels: { alertname, namespace: 'shop', deployment, severity: 'critical', ...(extra.labels ?? {}) },
  };
}
const resolvedOf = (a: TestAlert): TestAlert => ({ ...a, status: 'resolved', endsAt: new Date().toISOString() });

/**
 * Posts a notification as Alertmanager does, after making Prometheus agree with it: a firing alert
 * of a rule fires there first, a resolved one has stopped (`confirm: false`: posted as it is).
 */
const post = async (h: Harness, alerts: TestAlert[], opts: { confirm?: boolean } = {}) => {
  for (const a of opts.confirm === false ? [] : alerts.filter((x) => RULED.includes(x.labels.alertname ?? ''))) {
    if (a.status === 'firing') await prom.ensureFiring(a.labels);
    else {
      prom.clear(a.labels);
      await prom.waitResolved(a.labels);
    }
  }
  return send(h, alerts);
};
const send = (h: Harness, alerts: TestAlert[]) =>
  request(h.app)
    .post('/webhook/alerts')
    .set('Authorization', `Bearer ${TOKEN}`)
    .set('Content-Type', 'application/json')
    .send(JSON.stringify({ version: '4', status: alerts[0]?.status ?? 'firing', receiver: 'opsgate', alerts }));

const jobsNamed = async (h: Harness, name: string) =>
  (await h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed', 'prioritized'])).filter((j) => j.name === name);
const restarts = (h: Harness) => jobsNamed(h, JOB.restartService);
const reports = async (h: Harness) => (await jobsNamed(h, JOB.reportChange)).map((j) => j.data as Record<string, any>);
const decisions = async (h: Harness) =>
  (await request(h.app).get('/ops/remediations?limit=500').set('X-API-Key', RO_KEY)).body.remediations as any[];

describe('the contract of /webhook/alerts is unchanged; remediation is additive', () => {
  it('a matching firing alert: received, firing and its notify_oncall job as ever, plus a restart by remediation:<rule>', async () => {
    const a = alert('Down', 'frontend');
    const res = await post(ctx.h, [a, alert('Unrelated', 'checkout')]);
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ received: 2, firing: 2, job_ids: [expect.any(String), expect.any(String)] });
    expect(res.body.remediations).toEqual([
      {
        rule: 'down',
        fingerprint: a.fingerprint,
        decision: 'queued',
        reason: 'restart of Deployment shop/frontend queued',
        id: expect.stringMatching(/^rem-[0-9a-f]{20}$/),
      },
    ]);
    expect((await jobsNamed(ctx.h, JOB.notifyOncall)).map((j) => j.data.alertname).sort()).toEqual(['Down', 'Unrelated']);
    const [job] = await restarts(ctx.h);
    expect(job!.data).toMatchObject({
      host: 'web-1',
      service: 'frontend',
      requested_by: 'remediation:down',
      requested_owner: 'remediation:down',
    });
    expect(job!.data.reason).toMatch(/^alert Down firing since .* \(rule down\)$/);
    // The same notification again (Alertmanager's repeat): the notify job is deduplicated 300 s, the cooldown holds the restart.
    const again = await post(ctx.h, [a]);
    expect(again.body).toMatchObject({ received: 1, firing: 1, job_ids: [] });
    expect(again.body.remediations[0]).toMatchObject({ decision: 'suppressed' });
    expect(again.body.remediations[0].reason).toMatch(/cooldown ends in \d+ s/);
    expect(await restarts(ctx.h)).toHaveLength(1);
  });

  it("no rule matched: the answer is exactly the contract's (no remediations field)", async () => {
    const res = await post(ctx.h, [alert('Down', 'frontend', { labels: { severity: 'info' } })]);
    expect(Object.keys(res.body).sort()).toEqual(['firing', 'job_ids', 'received']);
    expect(await restarts(ctx.h)).toHaveLength(0);
  });

  it('a target that is not a Deployment of an inventory host restarts nothing', async () => {
    const res = await post(
      ctx.h,
      [alert('Down', 'frontend', { labels: { namespace: 'kube-system' } }), alert('Down', 'no-such-deployment')],
      { confirm: false },
    );
    expect(res.body.remediations.map((r: any) => r.decision)).toEqual(['suppressed', 'suppressed']);
    expect(res.body.remediations[0].reason).toMatch(/name no Deployment of an inventory host/);
    expect(await restarts(ctx.h)).toHaveLength(0);
  });
});

describe('trigger', () => {
  it('for: a notification before it waits, whatever startsAt it claims, and schedules a check with Prometheus when it passes', async () => {
    const early = alert('Slow', 'cart', { startsAt: new Date(Date.now() - 600_000).toISOString() });
    const r1 = await post(ctx.h, [early]);
    expect(r1.body.remediations[0]).toMatchObject({ decision: 'waiting' });
    expect(r1.body.remediations[0].reason).toMatch(/checked with Prometheus at PROMETHEUS_URL at/);
    const [check] = await jobsNamed(ctx.h, JOB.remediate);
    expect(check!.data).toMatchObject({ step: 'check', rule: 'slow' });
    // The worker runs the check (remediationPrometheus.test.ts); here nothing acts before it.
    expect(await restarts(ctx.h)).toHaveLength(0);
  });

  it('episodes: a flapping alert acts at its second distinct firing within the window, not at a repeat of the first', async () => {
    const first = alert('Flapping', 'search', { startsAt: new Date(Date.now() - 600_000).toISOString() });
    expect((await post(ctx.h, [first])).body.remediations[0]).toMatchObject({ decision: 'suppressed' });
    const repeat = await post(ctx.h, [first]);
    expect(repeat.body.remediations[0].reason).toBe('1 of the 2 firings within 1h the rule waits for');
    await post(ctx.h, [resolvedOf(first)]);
    const second = { ...first, startsAt: new Date(Date.now() - 30_000).toISOString() };
    expect((await post(ctx.h, [second])).body.remediations[0]).toMatchObject({ decision: 'queued' });
    expect(await restarts(ctx.h)).toHaveLength(1);
  });
});

describe('the guards of a restart apply as to a person', () => {
  it('a freeze refuses it (restarts are not held); the refusal is recorded and reported, and the cooldown given back', async () => {
    const f = await request(ctx.h.app)
      .post('/ops/freezes')
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ scope: 'namespace', namespace: 'shop', reason: 'release day', duration: '1h' }));
    expect(f.status).toBe(201);
    await ctx.h.freezesFlushed();
    const a = alert('Down', 'images');
    const res = await post(ctx.h, [a]);
    expect(res.body.remediations[0]).toMatchObject({ decision: 'refused' });
    expect(res.body.remediations[0].reason).toMatch(/^not restarted: freeze .* of namespace shop .*\(release day\)/);
    expect(await restarts(ctx.h)).toHaveLength(0);
    const report = (await reports(ctx.h)).find((r) => r.event === 'remediation');
    expect(report).toMatchObject({
      change: 'restart',
      service: 'images',
      namespace: 'shop',
      requested_by: 'remediation:down',
      remediation: { rule: 'down', decision: 'refused', outcome: 'refused' },
    });
    // The freeze lifted, the next notification acts: a refusal took no cooldown.
    await request(ctx.h.app)
      .delete(`/ops/freezes/${f.body.id}`)
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ reason: 'done' }));
    await ctx.h.freezesFlushed();
    expect((await post(ctx.h, [a])).body.remediations[0]).toMatchObject({ decision: 'queued' });
  });

  it("a spent budget refuses it, with the budget's words", async () => {
    expect((await post(ctx.h, [alert('Down', 'reports', { labels: { namespace: 'batch' } })])).body.remediations[0].decision).toBe(
      'queued',
    );
    const res = await post(ctx.h, [alert('Down', 'exports', { labels: { namespace: 'batch' } })]);
    expect(res.body.remediations[0]).toMatchObject({ decision: 'refused' });
    expect(res.body.remediations[0].reason).toMatch(/remediation budget of namespace batch exhausted/);
    expect(await restarts(ctx.h)).toHaveLength(1);
  });

  it('an approval policy makes it wait; the alert resolving withdraws the approval and reports the cancellation', async () => {
    const a = alert('Down', 'api', { labels: { namespace: 'payments' } });
    const res = await post(ctx.h, [a]);
    expect(res.body.remediations[0]).toMatchObject({ decision: 'pending_approval' });
    const [pending] = (await request(ctx.h.app).get('/ops/approvals').set('X-API-Key', RO_KEY)).body.approvals;
    expect(pending).toMatchObject({ requested_by: 'remediation:down', status: 'pending' });
    const gone = await post(ctx.h, [resolvedOf(a)]);
    expect(gone.body).toMatchObject({ received: 1, firing: 0 });
    expect(gone.body.remediations).toEqual([expect.objectContaining({ rule: 'down', decision: 'cancelled' })]);
    expect((await request(ctx.h.app).get(`/ops/approvals/${pending.id}`).set('X-API-Key', RO_KEY)).body.status).toBe('rejected');
    expect(await restarts(ctx.h)).toHaveLength(0);
    expect((await reports(ctx.h)).some((r) => r.event === 'remediation' && r.remediation.decision === 'cancelled')).toBe(true);
  });

  it("joins a person's waiting restart and never cancels it when the alert resolves", async () => {
    const mine = await restartAs(ctx.h.app, '?host=web-1&service=basket&reason=oom');
    expect(mine.status).toBe(200);
    const a = alert('Down', 'basket');
    const res = await post(ctx.h, [a]);
    expect(res.body.remediations[0]).toMatchObject({ decision: 'joined' });
    expect(res.body.remediations[0].reason).toContain(mine.body.job_id);
    await post(ctx.h, [resolvedOf(a)]);
    expect((await restarts(ctx.h)).map((j) => j.id)).toEqual([mine.body.job_id]);
  });

  it('its own restart, queued and not started, is taken back when the alert resolves', async () => {
    const a = alert('Down', 'checkout');
    await post(ctx.h, [a]);
    expect(await restarts(ctx.h)).toHaveLength(1);
    const gone = await post(ctx.h, [resolvedOf(a)]);
    expect(gone.body.remediations[0]).toMatchObject({ decision: 'cancelled' });
    expect(await restarts(ctx.h)).toHaveLength(0);
  });
});

describe('modes and escalation', () => {
  it('dry-run plans and reports what would happen, and changes nothing', async () => {
    const res = await post(ctx.h, [alert('Rehearse', 'frontend')]);
    expect(res.body.remediations[0]).toMatchObject({ decision: 'dry_run' });
    expect(res.body.remediations[0].reason).toBe('dry-run: would restart Deployment shop/frontend; the pipeline would queue the restart');
    expect(await restarts(ctx.h)).toHaveLength(0);
    expect((await reports(ctx.h)).find((r) => r.event === 'remediation')).toMatchObject({
      remediation: { mode: 'dry-run', decision: 'dry_run' },
    });
  });

  it('after escalate_after remediations within the window it stops acting and pages once, with the history', async () => {
    const a = alert('Loop', 'frontend');
    // cooldown 1s: a notification after it acts again (the second joins the first restart, still waiting), until the rule escalates.
    const seen: string[] = [];
    for (let i = 0; i < 3; i++) {
      seen.push(
        await waitFor(
          'a notification past the cooldown',
          async () => {
            const d = (await post(ctx.h, [a])).body.remediations[0].decision as string;
            return d === 'suppressed' ? undefined : d;
          },
          10_000,
          200,
        ),
      );
    }
    expect(seen).toEqual(['queued', 'joined', 'escalated']);
    const after = await post(ctx.h, [a]);
    expect(after.body.remediations[0].reason).toMatch(/^escalated: 2 remediations within 1h/);
    const pages = (await jobsNamed(ctx.h, JOB.notifyOncall)).filter((j) => j.data.alertname === 'OpsgateRemediationEscalated');
    expect(pages).toHaveLength(1);
    expect(pages[0]!.data.annotations.history).toHaveLength(2);
    expect(pages[0]!.data.annotations.summary).toMatch(/did not keep alert Loop away/);
    const report = (await reports(ctx.h)).find((r) => r.event === 'remediation' && r.remediation.decision === 'escalated');
    expect(report?.remediation.history).toHaveLength(2);
  });
});

describe('a notification of several alerts', () => {
  it("answers each matching alert's decision in the notification's order, decided at once", async () => {
    const sent = [alert('Down', 'gone-1'), alert('Down', 'frontend'), alert('Unrelated', 'checkout'), alert('Down', 'gone-2')];
    const res = await post(ctx.h, sent);
    expect(res.status).toBe(202);
    expect(res.body.remediations.map((r: { fingerprint: string; decision: string }) => [r.fingerprint, r.decision])).toEqual([
      [sent[0]!.fingerprint, 'suppressed'],
      [sent[1]!.fingerprint, 'queued'],
      [sent[3]!.fingerprint, 'suppressed'],
    ]);
    expect(await restarts(ctx.h)).toHaveLength(1);
    expect((await decisions(ctx.h)).map((d) => d.deployment).sort()).toEqual(['frontend', 'gone-1', 'gone-2']);
  });
});

describe('GET /ops/remediations', () => {
  it('any key reads the recent decisions with their reasons, newest first, paged', async () => {
    // Two notifications: the alerts of one are decided at once, and their decisions land in either order.
    await post(ctx.h, [alert('Down', 'frontend')]);
    await post(ctx.h, [alert('Down', 'no-such-deployment')]);
    const all = await decisions(ctx.h);
    expect(all.map((d) => d.decision)).toEqual(['suppressed', 'queued']);
    expect(all[1]).toMatchObject({
      rule: 'down',
      mode: 'act',
      alertname: 'Down',
      namespace: 'shop',
      deployment: 'frontend',
      host: 'web-1',
      job_id: expect.any(String),
    });
    const p1 = await request(ctx.h.app).get('/ops/remediations?limit=1').set('X-API-Key', RO_KEY);
    expect(p1.body.remediations).toHaveLength(1);
    const p2 = await request(ctx.h.app).get(`/ops/remediations?cursor=${p1.body.next_cursor}`).set('X-API-Key', RO_KEY);
    expect(p2.body).toMatchObject({ remediations: [all[1]], next_cursor: null, budgets: expect.any(Array) });
    expect((await request(ctx.h.app).get('/ops/remediations?rule=slow').set('X-API-Key', RO_KEY)).body.remediations).toEqual([]);
    // A cursor continues its own query (here: every rule's decisions), not another rule's.
    const other = await request(ctx.h.app).get(`/ops/remediations?rule=slow&cursor=${p1.body.next_cursor}`).set('X-API-Key', RO_KEY);
    expect(other.status).toBe(422);
    expect(other.body.code).toBe('invalid_cursor');
    const mine = await request(ctx.h.app).get('/ops/remediations?rule=down&limit=1').set('X-API-Key', RO_KEY);
    const next = await request(ctx.h.app).get(`/ops/remediations?cursor=${mine.body.next_cursor}`).set('X-API-Key', RO_KEY);
    expect(next.body).toMatchObject({ remediations: [all[1]], next_cursor: null });
    expect((await request(ctx.h.app).get('/ops/remediations')).status).toBe(401);
    expect((await request(ctx.h.app).get('/ops/remediations?limit=0').set('X-API-Key', RO_KEY)).body.code).toBe('invalid_query');
    expect(await ctx.h.inspect.llen(REMEDIATION_DECISIONS_KEY)).toBe(2);
  });

  it('the metrics of every rule exist from the start, and count what happened', async () => {
    const h = await createHarness(ctx.srv.url, { inventoryYaml: INVENTORY, env });
    try {
      const text = await h.metrics.registry.metrics();
      expect(text).toContain('opsgate_remediations_total{rule="loop",outcome="remediated"} 0');
      expect(text).toContain('opsgate_remediations_suppressed_total{rule="down",guard="cooldown"} 0');
      expect(text).toContain('opsgate_remediation_escalations_total{rule="flappy"} 0');
      expect(text).toContain('opsgate_remediation_budget_exhausted_total{budget="rule",name="flappy"} 0');
      expect(text).toMatch(/opsgate_remediation_silences_active \d+/);
      await post(h, [alert('Rehearse', 'frontend')]);
      expect(await h.metrics.registry.metrics()).toContain('opsgate_remediations_total{rule="rehearse",outcome="dry_run"} 1');
    } finally {
      await h.close();
    }
  });
});

describe('replicas', () => {
  it('the cooldown is shared by two API processes: two alerts naming one Deployment, one restart', async () => {
    const other = await createHarness(ctx.srv.url, { inventoryYaml: INVENTORY, env });
    try {
      const [a1, a2] = [alert('Down', 'cart', { labels: { pod: 'cart-1' } }), alert('Down', 'cart', { labels: { pod: 'cart-2' } })];
      await Promise.all([prom.ensureFiring(a1.labels), prom.ensureFiring(a2.labels)]);
      const [r1, r2] = await Promise.all([send(ctx.h, [a1]), send(other, [a2])]);
      const got = [r1.body.remediations[0].decision, r2.body.remediations[0].decision].sort();
      expect(got).toEqual(['queued', 'suppressed']);
      expect(await restarts(ctx.h)).toHaveLength(1);
    } finally {
      await other.close();
    }
  });
});

describe('start-up refusal', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'opsgate-remediation-'));
    writeFileSync(join(dir, 'inventory.yaml'), INVENTORY);
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('rules without an authenticated alerts sender: the API does not start, naming ALERTS_WEBHOOK_TOKEN', async () => {
    const settings = {
      ...baseEnv(ctx.srv.url),
      PROMETHEUS_URL: prom.url,
      OPS_INVENTORY_FILE: join(dir, 'inventory.yaml'),
      PORT: '0',
      METRICS_PORT: '0',
    };
    const err = await start(settings).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as ConfigError).problems.map((p) => p.variable)).toEqual(['ALERTS_WEBHOOK_TOKEN']);
  });

  it('silence: true without ALERTMANAGER_URL: refused too', async () => {
    writeFileSync(join(dir, 'silent.yaml'), `${INVENTORY}  - {name: hush, match: {alertname: Hush}, targets: [web-1], silence: true}\n`);
    const settings = {
      ...baseEnv(ctx.srv.url),
      ALERTS_WEBHOOK_TOKEN: TOKEN,
      PROMETHEUS_URL: prom.url,
      OPS_INVENTORY_FILE: join(dir, 'silent.yaml'),
      PORT: '0',
      METRICS_PORT: '0',
    };
    const err = (await start(settings).catch((e: unknown) => e)) as ConfigError;
    expect(err.problems).toEqual([{ variable: 'ALERTMANAGER_URL', problem: expect.stringContaining('(hush)') }]);
  });

  it('act rules with no way to confirm their alerts: refused, naming both ways', async () => {
    const settings = {
      ...baseEnv(ctx.srv.url),
      ALERTS_WEBHOOK_TOKEN: TOKEN,
      OPS_INVENTORY_FILE: join(dir, 'inventory.yaml'),
      PORT: '0',
      METRICS_PORT: '0',
    };
    const err = (await start(settings).catch((e: unknown) => e)) as ConfigError;
    expect(err.problems).toEqual([{ variable: 'PROMETHEUS_URL', problem: expect.stringContaining('(down, flappy, slow, loop)') }]);
    expect(err.problems[0]!.problem).toMatch(/confirm: alertmanager with ALERTMANAGER_URL and credentials of its API/);
  });
});
