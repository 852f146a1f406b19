import { afterEach, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { JOB } from '../../../src/shared/jobs.js';
import { budgetKey } from '../../../src/shared/keys.js';
import { OP_KEY, RO_KEY, useHarness, type Harness } from '../../helpers/apiHarness.js';
import { GUARDED_INVENTORY_YAML, guardedWorker, restartAs } from '../../helpers/guards.js';
import { waitFor } from '../../helpers/waitFor.js';
import { metricValue } from '../../helpers/workerSupport.js';

/**
 * Dry runs on a real Redis: POST /ops/restart?dry_run=true answers 200 with what would happen
 * (the freeze and window, approval, coalescing and budget verdicts) and the worker's answer from the
 * cluster, and changes nothing: no restart job, no budget taken, no approval asked. Without a
 * worker in time the answer says the cluster was not asked, and the dry-run job is taken back.
 * What the real Kubernetes API server answers (RBAC, ValidatingAdmissionPolicy, resourceVersion)
 * is tested on a real control plane: test/e2e/controlplane/dryRun.test.ts, and on the node e2e.
 */
const ctx = useHarness({ inventoryYaml: GUARDED_INVENTORY_YAML, env: { DRY_RUN_TIMEOUT_MS: '400' } });
let worker: Awaited<ReturnType<typeof guardedWorker>> | undefined;
afterEach(async () => {
  await worker?.close(2000);
  worker = undefined;
});

const op = { 'X-API-Key': OP_KEY };
const dry = (qs: string) => restartAs(ctx.h.app, `${qs}&dry_run=true`, op);
async function allJobs(h: Harness) {
  return h.queue.bull.getJobs(['waiting', 'active', 'delayed', 'completed', 'failed', 'prioritized']);
}

describe('POST /ops/restart?dry_run=true', () => {
  it('without a worker in time: 200 with the verdicts, the cluster not asked, the probe taken back; no job, nothing changed', async () => {
    const res = await dry('?host=web-1&service=frontend');
    expect(res.status).toBe(200);
    expect(res.body).toEqual({
      dry_run: true,
      change: 'restart',
      host: 'web-1',
      service: 'frontend',
      namespace: 'shop',
      would: 'queue',
      detail: 'queued',
      verdicts: {
        gate: { open: true, reasons: [], until: null, override: false },
        approval: null,
        coalescing: { joins: null },
        budget: null,
      },
      kubernetes: {
        checked: false,
        reason: expect.stringMatching(
          /^no worker answered within 400 ms \(dry-run job [0-9a-f-]+ taken back\); the cluster was not asked$/,
        ),
      },
    });
    expect(await allJobs(ctx.h)).toEqual([]);
    expect(ctx.h.audits().at(-1)).toMatchObject({ path: '/ops/restart', status: 200, dry_run: true, would: 'queue' });
    expect(await metricValue(ctx.h.metrics as never, 'opsgate_dry_runs_total', { change: 'restart', verdict: 'unknown' })).toBe(1);
  });

  it('with a worker that has no cluster: the answer says why the cluster could not be asked; only the finished dry-run job remains', async () => {
    worker = await guardedWorker(ctx.srv.url);
    const res = await dry('?host=web-1&service=frontend');
    expect(res.status).toBe(200);
    expect(res.body.kubernetes).toEqual({
      checked: false,
      reason: expect.stringMatching(/^the worker could not ask the cluster: .*none in this test/),
    });
    const jobs = await allJobs(ctx.h);
    expect(jobs.map((j) => j.name)).toEqual([JOB.dryRun]);
    expect(jobs[0]!.opts.attempts).toBe(1);
  });

  it('verdicts without side effects: a freeze (would refuse; with override would queue), approval, coalescing, budget', async () => {
    // approval: nothing is asked
    const appr = await dry('?host=pay-1&service=api');
    expect(appr.body).toMatchObject({ would: 'pending_approval', verdicts: { approval: { required: 1, ttl: '1h' } } });
    expect((await request(ctx.h.app).get('/ops/approvals').set('X-API-Key', RO_KEY)).body.approvals).toEqual([]);

    // budget: shown, not taken
    for (const s of ['reports', 'exports']) await restartAs(ctx.h.app, `?host=batch-1&service=${s}`);
    const budget = await dry('?host=batch-1&service=imports');
    expect(budget.body).toMatchObject({
      would: 'queue',
      verdicts: { budget: { restarts: 3, per: '10m', used: 2, remaining: 1, retry_after_s: 0 } },
    });
    expect(await ctx.h.inspect.zcard(budgetKey('batch'))).toBe(2);
    await restartAs(ctx.h.app, '?host=batch-1&service=imports');
    expect((await dry('?host=batch-1&service=sync')).body).toMatchObject({ would: 'over_budget', verdicts: { budget: { remaining: 0 } } });

    // coalescing: the restart of reports is still waiting
    const joins = await dry('?host=batch-1&service=reports');
    expect(joins.body.would).toBe('join');
    expect(joins.body.verdicts.coalescing.joins).toMatch(/^restart-/);

    // a freeze
    const f = await request(ctx.h.app)
      .post('/ops/freezes')
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ scope: 'namespace', namespace: 'shop', reason: 'audit', duration: '1h' }));
    const frozen = await dry('?host=web-1&service=checkout');
    expect(frozen.body).toMatchObject({
      would: 'refuse',
      verdicts: { gate: { open: false, reasons: [{ guard: 'freeze', freeze_id: f.body.id }] } },
    });
    expect(frozen.body.detail).toMatch(/^refused: freeze/);
    const forced = await dry('?host=web-1&service=checkout&override=true&reason=test');
    expect(forced.body).toMatchObject({ would: 'queue', verdicts: { gate: { open: false, override: true } } });
    expect(
      (await allJobs(ctx.h))
        .filter((j) => j.name === JOB.restartService)
        .map((j) => j.data.service)
        .sort(),
    ).toEqual(['exports', 'imports', 'reports']);
  });

  it('a read-only key may not dry-run a restart (it is a restart request: bearer or operator key); bad input is {detail, code}', async () => {
    expect((await restartAs(ctx.h.app, '?host=web-1&service=frontend&dry_run=true', { 'X-API-Key': RO_KEY })).status).toBe(403);
    const bad = await restartAs(ctx.h.app, '?host=web-1&service=frontend&dry_run=maybe', op);
    expect(bad.status).toBe(422);
    expect(bad.body).toEqual({ detail: 'query parameter "dry_run" must be true or false', code: 'invalid_query' });
    expect((await dry('?host=web-1&service=nope')).status).toBe(404);
  });
});

describe('POST /ops/deliveries/{id}/replay with dry_run', () => {
  it('answers what the replay would do (a duplicate of the job that stands for the event), and queues nothing', async () => {
    const push = JSON.stringify({ ref: 'refs/heads/main', checkout_sha: 'dr-1', project: { path_with_namespace: 'group/app' } });
    const sent = await request(ctx.h.app)
      .post('/webhook/scm')
      .set('Content-Type', 'application/json')
      .set('X-Scm-Token', ctx.h.config.SCM_WEBHOOK_SECRET as string)
      .set('X-Scm-Event', 'Push Hook')
      .send(push);
    const delivery = await waitFor('the delivery recorded', async () => {
      const list = await request(ctx.h.app).get('/ops/deliveries?source=scm').set('X-API-Key', RO_KEY);
      return (list.body.deliveries as Array<{ id: string }>)[0]?.id;
    });
    const before = (await allJobs(ctx.h)).length;
    const res = await request(ctx.h.app)
      .post(`/ops/deliveries/${delivery}/replay`)
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ reason: 'check', dry_run: true }));
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({
      dry_run: true,
      change: 'deploy',
      project: 'group/app',
      namespace: 'deploys',
      would: 'duplicate',
      verdicts: { duplicate: { job_id: sent.body.job_id }, approval: null, gate: { open: true } },
      kubernetes: { checked: false },
    });
    // dry_run given as on POST /ops/restart: the query parameter
    const byQuery = await request(ctx.h.app)
      .post(`/ops/deliveries/${delivery}/replay?dry_run=true`)
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ reason: 'check' }));
    expect(byQuery.status).toBe(200);
    expect(byQuery.body).toMatchObject({ dry_run: true, change: 'deploy', would: 'duplicate' });
    const bad = await request(ctx.h.app)
      .post(`/ops/deliveries/${delivery}/replay?dry_run=maybe`)
      .set('X-API-Key', OP_KEY)
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ reason: 'check' }));
    expect(bad.status).toBe(422);
    expect((await allJobs(ctx.h)).length).toBe(before);
  });
});
