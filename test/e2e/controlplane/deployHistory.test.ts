import { describe, expect, it, jest } from '@jest/globals';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import request from 'supertest';
import { parseInventory } from '../../../src/shared/inventory.js';
import { startWorker, type WorkerHandle } from '../../../worker/index.js';
import { RO_KEY, SCM_SECRET, useHarness } from '../../helpers/apiHarness.js';
import { useDeployNamespace } from '../../helpers/deployJobs.js';
import { waitFor } from '../../helpers/waitFor.js';
import { collectLogs, metricValue, testMetrics, workerConfig } from '../../helpers/workerSupport.js';

jest.setTimeout(120_000);

/**
 * The history of deploys (src/changes/deployOrder/history.ts) on real Redis, through the real app
 * and the real worker, against the real kube-apiserver and Job controller of the shared control
 * plane; no kubelet runs here, test/helpers/deployJobs.ts ends each Job's pod a moment after its
 * Job was created. The push path writes no entry: every push's entry here is the worker's.
 */
const NS = 'dhist-deploy';
const INVENTORY_YAML = `
projects:
  group/app:
    namespace: ${NS}
    serviceAccountName: deployer
    image: alpine:3.20
  site/web:
    namespace: ${NS}
    serviceAccountName: deployer
    image: alpine:3.20
`;
const inventory = parseInventory(INVENTORY_YAML);
const SCOPED_KEY = 'scoped-history-key-0401';
const keysDir = mkdtempSync(join(tmpdir(), 'opsgate-history-'));
writeFileSync(join(keysDir, 'keys.yaml'), `- {id: scoped, role: readonly, key: ${SCOPED_KEY}, scope: {projects: [site/web]}}\n`);
const ctx = useHarness({ inventoryYaml: INVENTORY_YAML, env: { OPS_API_KEYS_FILE: join(keysDir, 'keys.yaml') } });

const RUN_MS = 300;
const deployNs = useDeployNamespace(NS, RUN_MS);

async function withWorker<T>(
  fn: (w: WorkerHandle & { metrics: ReturnType<typeof testMetrics> }) => Promise<T>,
  env: Record<string, string> = {},
): Promise<T> {
  deployNs.kube.reset();
  const metrics = testMetrics();
  const w = await startWorker(workerConfig({ REDIS_URL: ctx.srv.url, ROLLOUT_POLL_INTERVAL_MS: '50', ...env }), {
    logger: collectLogs().logger,
    metrics,
    inventory,
    kubeConfig: () => deployNs.admin,
  });
  try {
    return await fn(Object.assign(w, { metrics }));
  } finally {
    await w.close(1000);
  }
}

async function pushed(project: string, sha: string): Promise<string> {
  const res = await request(ctx.h.app)
    .post('/webhook/scm')
    .set('Content-Type', 'application/json')
    .set({ 'X-Scm-Token': SCM_SECRET, 'X-Scm-Event': 'Push Hook' })
    .send(JSON.stringify({ ref: 'refs/heads/main', checkout_sha: sha, project: { path_with_namespace: project } }));
  expect(res.status).toBe(202);
  return res.body.job_id as string;
}

const get = (path: string, key = RO_KEY) => request(ctx.h.app).get(path).set('X-API-Key', key);

/** The deploys of the list once every one of `ids` has ended. */
const ended = (ids: string[], project = 'group/app') =>
  waitFor(`deploys ${ids.join(', ')} ended`, async () => {
    const res = await get(`/ops/deploys?project=${encodeURIComponent(project)}`);
    const mine = (res.body.deploys as Array<{ id: string; state: string }>).filter((d) => ids.includes(d.id));
    return mine.length === ids.length && mine.every((d) => ['succeeded', 'failed', 'superseded'].includes(d.state)) ? res.body : false;
  });

describe('the history of deploys', () => {
  it('three pushes: newest first, their states, superseded_by, the Kubernetes Job, GET by id, the project, the gauge', async () => {
    await withWorker(async (w) => {
      const ids = [await pushed('group/app', 'aaa1'), await pushed('group/app', 'aaa2'), await pushed('group/app', 'aaa3')];
      const body = (await ended(ids)) as { deploys: Array<Record<string, unknown>>; next_cursor: string | null };
      expect(body.deploys.map((d) => d.id)).toEqual([...ids].reverse());
      expect(body.next_cursor).toBeNull();
      const [newest, ...older] = body.deploys;
      expect(newest).toMatchObject({
        project: 'group/app',
        ref: 'refs/heads/main',
        commit: 'aaa3',
        group: 'group/app:refs/heads/main',
        origin: 'push',
        state: 'succeeded',
        job_id: ids[2],
        superseded_by: null,
      });
      expect(newest!.kubernetes_job).toMatch(/^opsgate-deploy-group-app-/);
      expect(deployNs.kube.jobs.some((j) => j.name === newest!.kubernetes_job)).toBe(true);
      for (const k of ['accepted_at', 'started_at', 'finished_at']) expect(Date.parse(newest![k] as string)).toBeGreaterThan(0);
      for (const d of older) {
        if (d.state === 'superseded') {
          expect(ids).toContain(d.superseded_by);
          expect(d.kubernetes_job).toBeNull();
          expect(d.started_at).toBeNull();
        } else {
          expect(d).toMatchObject({ state: 'succeeded', superseded_by: null });
        }
      }
      expect(older.some((d) => d.state === 'superseded')).toBe(true);

      const one = await get(`/ops/deploys/${ids[2]}`);
      expect(one.status).toBe(200);
      expect(one.body).toEqual(newest);
      const missing = await get('/ops/deploys/no-such-deploy');
      expect(missing.status).toBe(404);
      expect(missing.body).toMatchObject({ code: 'deploy_not_found' });

      const project = await get('/ops/projects/group%2Fapp');
      expect(project.status).toBe(200);
      expect(project.body).toEqual({ project: 'group/app', refs: [{ ref: 'refs/heads/main', current: newest, running: null }] });
      const unknown = await get('/ops/projects/group%2Fnope');
      expect(unknown.status).toBe(404);
      expect(unknown.body).toMatchObject({ code: 'project_not_found' });

      const seconds = await metricValue(w.metrics, 'opsgate_deploy_last_success_timestamp_seconds', {
        project: 'group/app',
        ref: 'refs/heads/main',
      });
      expect(seconds * 1000).toBeGreaterThanOrEqual(Date.parse(newest!.finished_at as string) - 1000);
    });
  });

  it('pages with limit and cursor, keeps the filters in the cursor, filters by state, refuses bad input with 422', async () => {
    await withWorker(async () => {
      const ids: string[] = [];
      for (const sha of ['bbb1', 'bbb2', 'bbb3']) {
        ids.push(await pushed('group/app', sha));
        await ended([ids.at(-1)!]);
      }
      const first = await get('/ops/deploys?project=group%2Fapp&limit=2');
      expect(first.body.deploys.map((d: { id: string }) => d.id)).toEqual([ids[2], ids[1]]);
      expect(first.body.next_cursor).toEqual(expect.any(String));
      const second = await get(`/ops/deploys?cursor=${first.body.next_cursor as string}`);
      expect(second.body.deploys.map((d: { id: string }) => d.id)).toEqual([ids[0]]);
      expect(second.body.next_cursor).toBeNull();
      const other = await get(`/ops/deploys?project=site%2Fweb&cursor=${first.body.next_cursor as string}`);
      expect(other.status).toBe(422);
      expect(other.body).toMatchObject({ code: 'invalid_cursor' });
      expect((await get('/ops/deploys?state=running')).body.deploys).toEqual([]);
      expect((await get('/ops/deploys?state=succeeded&ref=refs%2Fheads%2Fmain')).body.deploys).toHaveLength(3);
      for (const bad of ['?state=nope', '?limit=0', '?limit=101', '?cursor=nope', '?project=a&project=b']) {
        const res = await get(`/ops/deploys${bad}`);
        expect({ bad, status: res.status, code: res.body.code }).toEqual({ bad, status: 422, code: expect.any(String) });
        expect(res.body.detail).toEqual(expect.any(String));
      }
    });
  });

  it("a scoped credential sees only its projects' deploys", async () => {
    await withWorker(async () => {
      const app = await pushed('group/app', 'ccc1');
      const web = await pushed('site/web', 'ccc2');
      await ended([app]);
      await ended([web], 'site/web');
      expect((await get('/ops/deploys')).body.deploys.map((d: { id: string }) => d.id).sort()).toEqual([app, web].sort());
      expect((await get('/ops/deploys', SCOPED_KEY)).body.deploys.map((d: { id: string }) => d.id)).toEqual([web]);
      expect((await get(`/ops/deploys/${app}`, SCOPED_KEY)).status).toBe(404);
      expect((await get(`/ops/deploys/${web}`, SCOPED_KEY)).status).toBe(200);
      const out = await get('/ops/projects/group%2Fapp', SCOPED_KEY);
      expect(out.status).toBe(403);
      expect(out.body).toMatchObject({ code: 'out_of_scope' });
      expect((await get('/ops/projects/site%2Fweb', SCOPED_KEY)).status).toBe(200);
      expect((await request(ctx.h.app).get('/ops/deploys')).status).toBe(401);
    });
  });

  it('keeps DEPLOY_HISTORY_KEPT deploys per project; the project keeps its current deploy', async () => {
    await withWorker(
      async () => {
        const ids: string[] = [];
        for (const sha of ['ddd1', 'ddd2', 'ddd3']) {
          ids.push(await pushed('group/app', sha));
          await ended([ids.at(-1)!]);
        }
        const web = await pushed('site/web', 'ddd4');
        await ended([web], 'site/web');
        expect((await get('/ops/deploys?project=group%2Fapp')).body.deploys.map((d: { id: string }) => d.id)).toEqual([ids[2], ids[1]]);
        expect((await get(`/ops/deploys/${ids[0]}`)).status).toBe(404);
        // Another project's deploys are bounded on their own.
        expect((await get('/ops/deploys')).body.deploys.map((d: { id: string }) => d.id)).toEqual([web, ids[2], ids[1]]);
        expect((await get('/ops/projects/group%2Fapp')).body.refs[0].current.id).toBe(ids[2]);
      },
      { DEPLOY_HISTORY_KEPT: '2' },
    );
  });
});
