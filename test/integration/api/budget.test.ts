import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { JOB } from '../../../src/shared/jobs.js';
import { budgetKey } from '../../../src/shared/keys.js';
import { OP_KEY, OP_KEY_2, createHarness, useHarness, type Harness } from '../../helpers/apiHarness.js';
import { GUARDED_INVENTORY_YAML, decide, restartAs } from '../../helpers/guards.js';
import { metricValue } from '../../helpers/workerSupport.js';

/**
 * Restart budgets on a real Redis, shared by two API instances (two createApp on one Redis, as two
 * replicas): host batch-1's namespace allows 3 restarts per 10 minutes, whoever asks through
 * whichever replica; the 4th is a 429 with Retry-After and the budget in the detail, counted in
 * opsgate_budget_exhausted_total. A restart that joins one in progress takes no budget; an approved
 * restart takes its place with its last approval.
 */
let clock = Date.parse('2026-03-02T10:00:00Z');
const ctx = useHarness({ inventoryYaml: GUARDED_INVENTORY_YAML, now: () => clock });
let b: Harness;
beforeAll(async () => {
  b = await createHarness(ctx.srv.url, { inventoryYaml: GUARDED_INVENTORY_YAML, now: () => clock });
});
afterAll(async () => {
  await b?.close();
});

const restartJobs = async (h: Harness) =>
  (await h.queue.bull.getJobs(['waiting', 'active', 'delayed', 'completed', 'failed'])).filter((j) => j.name === JOB.restartService);

describe('a namespace budget of 3 restarts per 10 minutes', () => {
  it('is shared by two API replicas: 3 restarts through either, the 4th a 429 with Retry-After and the budget; joined restarts are free', async () => {
    const a = ctx.h;
    expect((await restartAs(a.app, '?host=batch-1&service=reports')).status).toBe(200);
    clock += 60_000;
    expect((await restartAs(b.app, '?host=batch-1&service=exports')).status).toBe(200);
    clock += 60_000;
    expect((await restartAs(a.app, '?host=batch-1&service=imports', { 'X-API-Key': OP_KEY })).status).toBe(200);
    expect(await ctx.h.inspect.zcard(budgetKey('batch'))).toBe(3);

    // joining a restart still waiting is no new restart: 200 coalesced, nothing taken
    const joined = await restartAs(b.app, '?host=batch-1&service=reports');
    expect(joined.status).toBe(200);
    expect(joined.body.coalesced).toBe(true);

    const over = await restartAs(b.app, '?host=batch-1&service=sync');
    expect(over.status).toBe(429);
    // the first restart (10:00) leaves the 10-minute window at 10:10, 8 minutes after now (10:02)
    expect(over.headers['retry-after']).toBe('480');
    expect(over.body).toEqual({
      detail: 'restart budget of namespace batch exhausted: at most 3 restarts per 10m; the next restart fits in 480 s',
      code: 'budget_exhausted',
    });
    expect(await metricValue(b.metrics as never, 'opsgate_budget_exhausted_total', { namespace: 'batch' })).toBe(1);
    expect(b.audits().at(-1)).toMatchObject({ status: 429, detail: over.body.detail });
    expect((await restartJobs(a)).map((j) => j.data.service).sort()).toEqual(['exports', 'imports', 'reports']);

    // another namespace has its own (here: no) budget
    expect((await restartAs(b.app, '?host=web-1&service=frontend')).status).toBe(200);

    // 8 minutes later the oldest restart has left the window: one more fits
    clock += 480_000;
    expect((await restartAs(a.app, '?host=batch-1&service=sync')).status).toBe(200);
    expect((await restartAs(b.app, '?host=batch-1&service=sync')).body.coalesced).toBe(true);
  });

  it('the last approval of an approved restart takes a place, or answers 429 and leaves the approval pending', async () => {
    await ctx.h.inspect.flushall();
    for (const s of ['reports', 'exports', 'imports']) expect((await restartAs(ctx.h.app, `?host=batch-1&service=${s}`)).status).toBe(200);
    const asked = await restartAs(ctx.h.app, '?host=batch-2&service=archive', { 'X-API-Key': OP_KEY });
    expect(asked.status).toBe(202);
    const spent = await decide(b.app, asked.body.approval_id, 'approve', OP_KEY_2);
    expect(spent.status).toBe(429);
    expect(spent.body.detail).toMatch(
      /^restart budget of namespace batch exhausted: at most 3 restarts per 10m; the next restart fits in \d+ s$/,
    );
    expect(spent.headers['retry-after']).toMatch(/^\d+$/);
    expect((await restartAs(ctx.h.app, '?host=batch-2&service=archive')).body).toMatchObject({
      approval_id: asked.body.approval_id,
      coalesced: true,
    });
    clock += 600_000;
    const ok = await decide(b.app, asked.body.approval_id, 'approve', OP_KEY_2);
    expect(ok.status).toBe(200);
    expect(await ctx.h.inspect.zscore(budgetKey('batch'), asked.body.approval_id)).not.toBeNull();
  });
});
