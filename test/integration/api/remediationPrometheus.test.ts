import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Redis } from 'ioredis';
import request from 'supertest';
import { JOB } from '../../../src/shared/jobs.js';
import { remediationActiveKey } from '../../../src/shared/keys.js';
import { OP_KEY, RO_KEY, createHarness, type Harness } from '../../helpers/apiHarness.js';
import type { Alertmanager } from '../../helpers/alertmanager.js';
import { noCluster, restartAs } from '../../helpers/guards.js';
import { PROMETHEUS_BIN, type TestPrometheus } from '../../helpers/prometheus.js';
import { startRemediationRig, type RemediationRig } from '../../helpers/remediationRig.js';
import { waitFor } from '../../helpers/waitFor.js';

/**
 * Only real alerts act, on real parts: a real Prometheus evaluating static rules over a target the
 * test controls (its alerts sent to a real Alertmanager, which delivers them to the API), the API
 * confirming every alert at PROMETHEUS_URL, and a real worker running the checks and watches
 * (restarts fail without a cluster, which is not what is tested here).
 * - An alert anyone posts to Alertmanager's API restarts nothing, makes no silence, takes no place
 *   of people's budget; a genuine alert with more labels stays active and unsilenced.
 * - Timing is Prometheus's: a genuine alert acts after its rule's `for`, whatever startsAt a
 *   notification claims; an alert firing longer than `within` is one episode.
 * - Prometheus down: `error`, and the check asks again until it answers, then acts.
 * - `targets:` pins what a rule restarts; a rule's restarts draw on budgets of their own.
 * - Once the restart is queued, a failure to save the remediation's record keeps the claim and is
 *   retried (a real Redis ACL denies the API's user those keys for a moment).
 */
jest.setTimeout(120_000);

const TOKEN = 'alerts-token-for-remediation-prom-01';
const HOSTS = `
hosts:
  web-01:
    namespace: shop
    deployments: [storefront, checkout, cart, search, images, basket, ledger, api, web]
    policy:
      budget: {restarts: 2, per: 1h}
      remediation_budget: {restarts: 10, per: 1h}
`;
const INVENTORY = `${HOSTS}
remediations:
  - name: mismatch
    match: {alertname: KubeDeploymentReplicasMismatch}
    targets: [web-01]
    trigger: {for: 10m}
    silence: true
  - name: slow
    match: {alertname: Slow}
    targets: [shop/cart]
    trigger: {for: 2s}
  - name: flaky
    match: {alertname: Flaky}
    targets: [shop/search]
  - name: pinned
    match: {alertname: Pinned}
    targets: [shop/images]
  - name: budgeted
    match: {alertname: Budgeted}
    targets: [shop/api, shop/web]
    budget: {restarts: 1, per: 1h}
`;
/** Rules of an API apart from the rig's (its alerts reach it by direct posts alone, not by Alertmanager's deliveries). */
const SOLO_INVENTORY = `${HOSTS}
remediations:
  - name: long
    match: {alertname: Long}
    targets: [shop/ledger]
    trigger: {within: 1s}
  - name: halfdone
    match: {alertname: HalfDone}
    targets: [shop/basket]
`;

let rig: RemediationRig | undefined;
let h: Harness;
let am: Alertmanager;
let prom: TestPrometheus;
let solo: Harness | undefined;

beforeAll(async () => {
  rig = await startRemediationRig({
    inventoryYaml: INVENTORY,
    token: TOKEN,
    workerEnv: { JOB_ATTEMPTS: '1' },
    kubeConfig: noCluster,
    prometheus: {
      rules: ['KubeDeploymentReplicasMismatch', 'Slow', 'Flaky', 'Pinned', 'Budgeted', 'Long', 'HalfDone'].map((alert) => ({ alert })),
    },
  });
  ({ h, am } = rig);
  prom = rig.prom!;
  solo = await createHarness(rig.redisUrl, {
    inventoryYaml: SOLO_INVENTORY,
    env: { ALERTS_WEBHOOK_TOKEN: TOKEN, PROMETHEUS_URL: prom.url },
  });
});
afterAll(async () => {
  await solo?.close();
  await rig?.close();
});

const shop = (alertname: string, deployment: string, extra: Record<string, string> = {}) => ({
  alertname,
  namespace: 'shop',
  deployment,
  ...extra,
});
const decisions = async (app = h.app) =>
  (await request(app).get('/ops/remediations?limit=500').set('X-API-Key', RO_KEY)).body.remediations as any[];
const decisionOf =
  (rule: string, deployment: string, decision: string, app = h.app) =>
  async () =>
    (await decisions(app)).find((d) => d.rule === rule && d.deployment === deployment && d.decision === decision);
const restartsOf = async (deployment: string) =>
  (await h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed'])).filter(
    (j) => j.name === JOB.restartService && j.data.service === deployment,
  );
let fp = 0;
/** A notification posted straight to the webhook (the authenticated sender), as Alertmanager sends one. */
const post = (app: Harness['app'], labels: Record<string, string>, startsAt: number) =>
  request(app)
    .post('/webhook/alerts')
    .set('Authorization', `Bearer ${TOKEN}`)
    .set('Content-Type', 'application/json')
    .send(
      JSON.stringify({
        status: 'firing',
        alerts: [
          {
            status: 'firing',
            labels,
            annotations: {},
            startsAt: new Date(startsAt).toISOString(),
            fingerprint: `prom${String(++fp).padStart(12, '0')}`,
          },
        ],
      }),
    );

it('the real Prometheus binary is installed', () => {
  expect(PROMETHEUS_BIN).toBeDefined();
});

describe('a forged alert', () => {
  it("posted to Alertmanager's API restarts nothing, makes no silence and takes no place of people's budget", async () => {
    const twentyMinutes = Date.now() - 20 * 60_000;
    await am.push([
      { labels: shop('KubeDeploymentReplicasMismatch', 'storefront'), startsAt: new Date(twentyMinutes).toISOString() },
      { labels: shop('KubeDeploymentReplicasMismatch', 'checkout'), startsAt: new Date(twentyMinutes).toISOString() },
    ]);
    const forged = await waitFor('both forged alerts decided', async () => {
      const mine = (await decisions()).filter((d) => d.rule === 'mismatch');
      return mine.length >= 2 ? mine : undefined;
    });
    expect(forged.map((d) => [d.deployment, d.decision, d.guard]).sort()).toEqual([
      ['checkout', 'suppressed', 'not_firing'],
      ['storefront', 'suppressed', 'not_firing'],
    ]);
    expect(forged[0].reason).toMatch(/Prometheus at PROMETHEUS_URL fires no alert with these labels/);
    expect([...(await restartsOf('storefront')), ...(await restartsOf('checkout'))]).toHaveLength(0);
    expect(await am.silences()).toEqual([]);
    // People's budget is whole: an operator's restart that fits it is accepted.
    expect((await restartAs(h.app, '?host=web-01&service=storefront&reason=mine', { 'X-API-Key': OP_KEY })).status).toBe(200);

    // The genuine alert of the same Deployment, with more labels, is Prometheus's: active and unsilenced.
    const genuine = shop('KubeDeploymentReplicasMismatch', 'checkout', { cluster: 'eu-2', severity: 'critical' });
    prom.fire(genuine);
    await waitFor('the genuine alert delivered', async () =>
      (await decisions()).find((d) => d.rule === 'mismatch' && d.decision === 'waiting'),
    );
    const held = await waitFor('Alertmanager to hold the genuine alert', async () => {
      const res = await fetch(`${am.url}/api/v2/alerts?filter=cluster%3D%22eu-2%22`);
      return ((await res.json()) as any[]).find((a) => a.labels.deployment === 'checkout');
    });
    expect(held.status).toMatchObject({ state: 'active', silencedBy: [] });
    expect(await am.silences()).toEqual([]);
  });
});

describe('timing from Prometheus', () => {
  it('a genuine alert acts after its `for`, counted from when Prometheus began firing it, whatever startsAt a notification claims', async () => {
    const l = shop('Slow', 'cart');
    const since = await prom.ensureFiring(l);
    // A notification claiming it fires for 20 minutes still waits for the rule's 2 s from Prometheus's start.
    const claimed = await post(h.app, l, Date.now() - 20 * 60_000);
    const [early] = claimed.body.remediations;
    if (Date.now() < since + 2000) {
      expect(early).toMatchObject({ decision: 'waiting' });
      expect(early.reason).toMatch(/checked with Prometheus at PROMETHEUS_URL at/);
    }
    const queued = await waitFor('the check to act', decisionOf('slow', 'cart', 'queued'), 30_000);
    expect(Date.parse(queued.starts_at)).toBe(since);
    expect(Date.parse(queued.at)).toBeGreaterThanOrEqual(since + 2000);
    expect(await restartsOf('cart')).toHaveLength(1);
  });

  it('an alert firing longer than `within` is one episode, and acts', async () => {
    const l = shop('Long', 'ledger');
    const since = await prom.ensureFiring(l);
    await waitFor('the alert firing longer than within (1 s)', () => Date.now() > since + 1500, 10_000);
    const res = await post(solo!.app, l, since);
    expect(res.body.remediations[0]).toMatchObject({ decision: 'queued' });
  });
});

describe('Prometheus down', () => {
  it('is an error, nothing restarted; the check asks again with backoff and acts once Prometheus is back', async () => {
    const l = shop('Flaky', 'search');
    await prom.ensureFiring(l);
    await prom.stop();
    try {
      const res = await post(h.app, l, Date.now());
      expect(res.status).toBe(202);
      expect(res.body.remediations[0]).toMatchObject({ decision: 'error' });
      expect(res.body.remediations[0].reason).toMatch(/^Prometheus GET \/api\/v1\/\S+: unreachable; nothing restarted; asked again at/);
      expect(await restartsOf('search')).toHaveLength(0);
    } finally {
      await prom.start();
    }
    await waitFor('the retried check to act', decisionOf('flaky', 'search', 'queued'), 40_000);
    expect(await restartsOf('search')).toHaveLength(1);
  });
});

describe('targets', () => {
  it('an alert naming a Deployment the rule does not list restarts nothing: target_not_allowed', async () => {
    const res = await post(h.app, shop('Pinned', 'storefront'), Date.now());
    expect(res.body.remediations[0]).toMatchObject({ decision: 'suppressed' });
    expect(res.body.remediations[0].reason).toBe(
      'Deployment shop/storefront (host web-01) is not among the targets of rule pinned; nothing restarted',
    );
    expect((await decisions()).find((d) => d.rule === 'pinned')).toMatchObject({ guard: 'target_not_allowed' });
  });
});

describe('budgets of its own', () => {
  it("a rule's restarts draw on its budget and the namespace's remediation budget, never on people's", async () => {
    for (const d of ['api', 'web']) await prom.ensureFiring(shop('Budgeted', d));
    // Alertmanager delivers the same two alerts to the API as well, in an order of its own: whichever
    // of them comes first takes the rule's one place, and every later one of the other is refused.
    for (const d of ['api', 'web']) await post(h.app, shop('Budgeted', d), Date.now());
    const mine = await waitFor('one restart queued and the other refused', async () => {
      const ds = (await decisions()).filter((d) => d.rule === 'budgeted');
      const queued = ds.filter((d) => d.decision === 'queued');
      const refused = ds.filter((d) => d.decision === 'refused');
      return queued.length > 0 && refused.length > 0 ? { queued, refused } : undefined;
    });
    expect(mine.queued.map((d) => d.deployment)).toHaveLength(1);
    const first = mine.queued[0].deployment as string;
    expect(new Set(mine.refused.map((d) => d.deployment))).toEqual(new Set([first === 'api' ? 'web' : 'api']));
    expect(mine.refused[0].reason).toMatch(/^not restarted: remediation budget of rule budgeted exhausted: at most 1 restart per 1h/);
    expect([...(await restartsOf('api')), ...(await restartsOf('web'))]).toHaveLength(1);
    // People's budget (2 per hour) took the operator's one restart above; the remediations took none of it.
    expect((await restartAs(h.app, '?host=web-01&service=checkout&reason=mine', { 'X-API-Key': OP_KEY })).status).toBe(200);
    const third = await restartAs(h.app, '?host=web-01&service=images&reason=mine', { 'X-API-Key': OP_KEY });
    expect(third.status).toBe(429);
    expect(third.body.detail).toMatch(/^restart budget of namespace shop exhausted/);
    const list = await request(h.app).get('/ops/remediations?rule=budgeted').set('X-API-Key', RO_KEY);
    expect(list.body.budgets).toEqual(
      expect.arrayContaining([
        { budget: 'rule', name: 'budgeted', used: 1, limit: 1, per: 3600 },
        { budget: 'namespace', name: 'shop', used: expect.any(Number), limit: 10, per: 3600 },
      ]),
    );
    const text = await h.metrics.registry.metrics();
    expect(text).toContain('opsgate_remediation_budget_used{budget="rule",name="budgeted"} 1');
    expect(text).toContain('opsgate_remediation_budget_limit{budget="namespace",name="shop"} 10');
  });
});

describe('never half-done', () => {
  it('once the restart is queued, a failure to save its record keeps the claim and is retried', async () => {
    const l = shop('HalfDone', 'basket');
    await prom.ensureFiring(l);
    // A user that may write every key but the remediations' records (Redis ACL key patterns allow only: every prefix that is not it).
    const admin = new Redis(rig!.redisUrl);
    const denied = 'opsgate:remediation:active:';
    const allowed = Array.from(denied, (c, i) => `~${denied.slice(0, i)}[^${c}]*`);
    await admin.call('ACL', 'SETUSER', 'halfdone', 'on', '>halfdone-pw', 'resetkeys', '%R~*', ...allowed, '&*', '+@all');
    const url = new URL(rig!.redisUrl);
    url.username = 'halfdone';
    url.password = 'halfdone-pw';
    const limited = await createHarness(url.toString(), {
      inventoryYaml: SOLO_INVENTORY,
      env: { ALERTS_WEBHOOK_TOKEN: TOKEN, PROMETHEUS_URL: prom.url },
    });
    try {
      const answer = post(limited.app, l, Date.now()).then((r) => r);
      await waitFor('the restart queued', async () => (await restartsOf('basket')).length === 1, 10_000, 20);
      await admin.call('ACL', 'SETUSER', 'halfdone', 'allkeys');
      const res = await answer;
      expect(res.body.remediations[0]).toMatchObject({ decision: 'queued' });
      const id = res.body.remediations[0].id as string;
      const active = JSON.parse((await admin.get(remediationActiveKey('halfdone', `prom${String(fp).padStart(12, '0')}`))) ?? 'null');
      expect(active).toMatchObject({ id, phase: 'waiting' });
      expect(await h.queue.bull.getJob(`remediate-watch.${id}`)).toBeDefined();
      // The claim was kept: the next notification is held by the cooldown, one restart in all.
      expect((await post(limited.app, l, Date.now())).body.remediations[0]).toMatchObject({ decision: 'suppressed' });
      expect(await restartsOf('basket')).toHaveLength(1);
    } finally {
      await limited.close();
      await admin.quit();
    }
  });
});
