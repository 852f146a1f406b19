import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import request from 'supertest';
import { JOB } from '../../../src/shared/jobs.js';
import { RO_KEY, type Harness } from '../../helpers/apiHarness.js';
import { ALERTMANAGER_BIN, type Alertmanager } from '../../helpers/alertmanager.js';
import type { TestPrometheus } from '../../helpers/prometheus.js';
import { startRemediationRig, type RemediationRig } from '../../helpers/remediationRig.js';
import { noCluster } from '../../helpers/guards.js';
import { waitFor } from '../../helpers/waitFor.js';

/**
 * Alert-driven remediation with a real Debian prometheus-alertmanager and a real Prometheus: alerts
 * fired by Prometheus's rules and sent to Alertmanager, its real webhook notifications posted to
 * the API (a receiver with send_resolved and short intervals), Prometheus asked whether an alert
 * fires, and Alertmanager's silences kept by a real worker. Restarts run in the worker without a cluster (the kube stand-in of the
 * worker tests: the rollout fails), so the outcome verified here is the rollout's failure; a
 * rollout that succeeds and an alert that resolves are the node e2e's.
 */
jest.setTimeout(120_000);

const TOKEN = 'alerts-token-for-remediation-0002';
const INVENTORY = `
hosts:
  web-1:
    namespace: shop
    deployments: [frontend, checkout, cart, search]
remediations:
  - name: hush
    match: {alertname: Hush}
    targets: [web-1]
    silence: true
    verify: 5s
    settle: 4s
  - name: slow
    match: {alertname: Slow}
    targets: [web-1]
    trigger: {for: 3s}
  - name: flappy
    match: {alertname: Flapping}
    targets: [web-1]
    trigger: {episodes: 2, within: 1h}
`;

let am: Alertmanager;
let h: Harness;
let rig: RemediationRig | undefined;
let prom: TestPrometheus;

beforeAll(async () => {
  rig = await startRemediationRig({
    inventoryYaml: INVENTORY,
    token: TOKEN,
    workerEnv: { JOB_ATTEMPTS: '1' },
    kubeConfig: noCluster,
    prometheus: { rules: [{ alert: 'Hush' }, { alert: 'Slow' }, { alert: 'Flapping' }] },
  });
  ({ h, am } = rig);
  prom = rig.prom!;
});
afterAll(async () => {
  await rig?.close();
});

const decisions = async () => (await request(h.app).get('/ops/remediations?limit=500').set('X-API-Key', RO_KEY)).body.remediations as any[];
const decisionOf = (rule: string, deployment: string, decision: string) => async () =>
  (await decisions()).find((d) => d.rule === rule && d.deployment === deployment && d.decision === decision);
const restartsOf = async (deployment: string) =>
  (await h.queue.bull.getJobs(['waiting', 'delayed', 'active', 'completed', 'failed'])).filter(
    (j) => j.name === JOB.restartService && j.data.service === deployment,
  );
const labels = (alertname: string, deployment: string) => ({ alertname, namespace: 'shop', deployment, severity: 'critical' });

it('the real Alertmanager binary is installed', () => {
  expect(ALERTMANAGER_BIN).toBeDefined();
});

describe('only real alerts act', () => {
  it('a forged firing alert Prometheus does not fire restarts nothing; the contract answer is unchanged', async () => {
    const res = await request(h.app)
      .post('/webhook/alerts')
      .set('Authorization', `Bearer ${TOKEN}`)
      .set('Content-Type', 'application/json')
      .send(
        JSON.stringify({
          alerts: [
            {
              status: 'firing',
              labels: labels('Hush', 'checkout'),
              annotations: {},
              startsAt: new Date(Date.now() - 60_000).toISOString(),
              fingerprint: '0123456789abcdef',
            },
          ],
        }),
      );
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ received: 1, firing: 1, job_ids: [expect.any(String)] });
    expect(res.body.remediations[0]).toMatchObject({ decision: 'suppressed' });
    expect(res.body.remediations[0].reason).toMatch(/Prometheus at PROMETHEUS_URL fires no alert with these labels/);
    expect(await restartsOf('checkout')).toHaveLength(0);
  });
});

describe('a real alert, delivered by Alertmanager', () => {
  it('restarts the Deployment, keeps a silence of exactly that alert while acting, extends it, and lets it lapse after settle', async () => {
    const l = labels('Hush', 'frontend');
    prom.fire(l);
    const queued = await waitFor('the delivered alert to queue a restart', decisionOf('hush', 'frontend', 'queued'), 30_000);
    expect(await restartsOf('frontend')).toHaveLength(1);

    const mine = (s: { comment: string }) => s.comment.includes(queued.id);
    const first = await waitFor(
      'the silence',
      async () => (await am.silences()).find((s) => mine(s) && s.status.state === 'active'),
      20_000,
    );
    expect(first.comment).toContain('by rule hush: restart of Deployment shop/frontend');
    expect(
      (first.matchers as Array<{ name: string; value: string; isRegex: boolean }>).map((m) => `${m.name}=${m.value}:${m.isRegex}`).sort(),
    ).toEqual(
      Object.entries(l)
        .map(([k, v]) => `${k}=${v}:false`)
        .sort(),
    );
    // Short: a few seconds ahead (lapses by itself if opsgate stops), then moved on while the work lasts.
    expect(Date.parse(first.endsAt) - Date.now()).toBeLessThan(10_000);
    await waitFor(
      'the silence extended in place',
      async () => (await am.silences()).find((s) => s.id === first.id && Date.parse(s.endsAt) > Date.parse(first.endsAt) + 500),
      20_000,
    );

    // The rollout fails (no cluster here): its failure is the outcome, recorded and counted.
    const outcome = await waitFor('the outcome', decisionOf('hush', 'frontend', 'outcome'), 30_000);
    expect(outcome).toMatchObject({ outcome: 'failed', job_id: queued.job_id });
    // settle (4 s) passed: the silence is expired and no longer counted.
    await waitFor('the silence to lapse', async () => (await am.silences()).every((s) => !mine(s) || s.status.state === 'expired'), 30_000);
    expect(await h.inspect.scard('opsgate:remediation:silences')).toBe(0);
  });

  it('for: a notification before it schedules a check; the worker asks Prometheus when it passes, and acts', async () => {
    prom.fire(labels('Slow', 'cart'));
    const waiting = await waitFor('the waiting decision', decisionOf('slow', 'cart', 'waiting'), 30_000);
    expect(waiting.reason).toMatch(/checked with Prometheus at PROMETHEUS_URL at/);
    expect(
      (await h.queue.bull.getJobs(['delayed', 'waiting', 'active', 'completed'])).some(
        (j) => j.name === JOB.remediate && j.data.step === 'check',
      ),
    ).toBe(true);
    // The check is a delayed job of the worker's, due when `for` has passed: on a loaded machine it can
    // run late, so the deadline is wide.
    await waitFor('the check to act', decisionOf('slow', 'cart', 'queued'), 90_000);
    expect(await restartsOf('cart')).toHaveLength(1);
  });

  it('flapping: the second distinct firing of the alert (resolved and notified in between) acts', async () => {
    const l = labels('Flapping', 'search');
    const deliveries = () => h.audits().filter((a) => a.path === '/webhook/alerts' && a.who === 'webhook:alerts').length;
    prom.fire(l);
    await waitFor('the first episode', decisionOf('flappy', 'search', 'suppressed'), 30_000);
    // Alertmanager tells a firing from the next one by their notifications: the resolved one must go
    // out before the alert fires again (within one group_interval it would be the same firing to it).
    const before = deliveries();
    prom.clear(l);
    await waitFor('the resolved notification', () => deliveries() > before, 30_000);
    prom.fire(l);
    const queued = await waitFor('the second episode to act', decisionOf('flappy', 'search', 'queued'), 30_000);
    expect(queued.starts_at).not.toBe((await decisionOf('flappy', 'search', 'suppressed')())!.starts_at);
    expect(await restartsOf('search')).toHaveLength(1);
  });
});
