/**
 * Deploys in order, as a black box: the built API and two built workers (WORKER_CONCURRENCY=8
 * each) on a real redis-server and the shared real control plane (kube-apiserver and
 * kube-controller-manager, no kubelet). 50 projects, each its own concurrency group, get 5 signed
 * pushes each through POST /webhook/scm, in a random order from a printed seed
 * (BLACKBOX_SEED=<n> repeats one). One worker is SIGKILLed while it waits for deploy Jobs and is
 * started again; the deploys it held come back through BullMQ's stalled-job check.
 *
 * The test plays the kubelet: the real job controller creates each deploy Job's pod, and the test
 * ends the pod's run a short random time later by writing its status (phase Succeeded), so the
 * job controller completes the Job. One watch of the Jobs, in the apiserver's order of writes,
 * gives each group's Jobs: a Job created while another of its group is not yet complete is an
 * overlap.
 *
 * Per group: never two deploy Jobs active at once, the Jobs start in the order the API accepted
 * their deploys, and the last succeeded deploy (GET /ops/projects/{project}, the history and the
 * last Job to complete) is the newest accepted push. Every accepted deploy ends (succeeded or
 * superseded), none twice in Kubernetes. The counts are printed (docs/deploys.md reports them).
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { useCluster, kubectl, ok } from '../../helpers/cluster.js';
import { adminKubeConfig, createNamespaces, deleteNamespaces } from '../../helpers/controlPlaneFixtures.js';
import { startApi, startWorkerProcess, type OpsProcess } from '../../helpers/processes.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { apiEnv, inspectQueue, makeSecrets, pool, shuffle, waitFor, workerEnv } from '../../helpers/reliability.js';
import { pushHeaders, pushSources } from '../../helpers/senders.js';

const NS = 'bbox-deploy';
const PROJECTS = 50;
const PUSHES = 5;
const REF = 'refs/heads/main';
const SEED = Number(process.env.BLACKBOX_SEED ?? Math.floor(Math.random() * 2 ** 31));
const FINAL = new Set(['succeeded', 'failed', 'superseded', 'cancelled', 'rejected']);

/** mulberry32: a small seeded generator, so a seed repeats the pushes' order, commits and pod run times. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

const projectName = (i: number) => `bbox/p${String(i).padStart(2, '0')}`;

interface Push {
  project: string;
  sha: string;
  jobId?: string;
  acceptedAt?: number;
}

/** A deploy Job as the watch saw it: when it appeared and when it completed, in the apiserver's order of writes. */
interface SeenJob {
  name: string;
  project: string;
  commit: string;
  queueJob: string;
  createdSeq: number;
  doneSeq?: number;
  succeeded?: boolean;
  createdAt: number;
  doneAt?: number;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;

/** Whether acceptance a came after b: by time, then by job id (numerically for BullMQ's numeric ids). */
function acceptedAfter(a: { at: number; id: string }, b: { at: number; id: string }): boolean {
  if (a.at !== b.at) return a.at > b.at;
  if (/^\d+$/.test(a.id) && /^\d+$/.test(b.id)) return Number(a.id) > Number(b.id);
  return a.id > b.id;
}

describe('deploys in order: 2 workers, 50 groups x 5 pushes, a worker SIGKILLed', () => {
  let cluster: Awaited<ReturnType<typeof useCluster>>;
  let admin: k8s.KubeConfig;
  let redis: RedisServer;
  let api: OpsProcess & { baseUrl: string };
  const workers: OpsProcess[] = [];
  let dir: string;
  const aborts: AbortController[] = [];
  let stopping = false;
  const secrets = makeSecrets('bbox');

  beforeAll(async () => {
    cluster = await useCluster();
    admin = adminKubeConfig(cluster);
    await createNamespaces(cluster, [NS]);
    // the deploy pods run as it, and the ServiceAccount admission refuses a pod whose account is missing
    ok(await kubectl(cluster.kubeconfigPath, ['-n', NS, 'create', 'serviceaccount', 'deployer']), 'create deployer SA');
    redis = await startRedis();
    dir = mkdtempSync(join(tmpdir(), 'opsgate-bbox-'));
    const projects: Record<string, unknown> = {};
    for (let i = 0; i < PROJECTS; i++) {
      projects[projectName(i)] = {
        namespace: NS,
        serviceAccountName: 'deployer',
        image: 'registry.example.com/deploy:1',
        activeDeadlineSeconds: 120,
      };
    }
    writeFileSync(join(dir, 'inventory.json'), JSON.stringify({ hosts: {}, projects }));
  }, 240_000);

  afterAll(async () => {
    stopping = true;
    for (const a of aborts) a.abort();
    await api?.stop();
    for (const w of workers) await w.stop();
    await redis?.destroy();
    if (dir) rmSync(dir, { recursive: true, force: true });
    if (cluster) {
      await deleteNamespaces(cluster, [NS]);
      await cluster.release();
    }
  }, 60_000);

  it('runs one deploy Job at a time per group, the newest accepted last, and loses none', async () => {
    process.stderr.write(`\n[deployBlackBox] seed ${SEED} (BLACKBOX_SEED=${SEED} repeats this order)\n`);
    const random = rng(SEED);
    const t0 = Date.now();
    const inventoryFile = join(dir, 'inventory.json');

    // ---- the test's kubelet: every deploy pod ends Succeeded 0.3 to 1.5 s after it appears
    const core = admin.makeApiClient(k8s.CoreV1Api);
    const ending = new Set<string>();
    const podErrors: string[] = [];
    const endPod = (name: string) => {
      ending.add(name);
      const delay = 300 + Math.floor(random() * 1200);
      setTimeout(() => {
        if (stopping) return;
        core
          .patchNamespacedPodStatus(
            { name, namespace: NS, body: { status: { phase: 'Succeeded' } } },
            k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
          )
          .catch((err: unknown) => podErrors.push(`${name}: ${(err as Error).message}`));
      }, delay).unref();
    };

    // ---- one watch of the Jobs (and one of the pods), from an empty namespace
    const watch = new k8s.Watch(admin);
    const seen = new Map<string, SeenJob>();
    const active = new Map<string, Set<string>>();
    const maxActive = new Map<string, number>();
    const overlaps: string[] = [];
    const watchErrors: string[] = [];
    let seq = 0;
    const onJob = (type: string, j: k8s.V1Job) => {
      const name = j.metadata?.name;
      if (!name || type === 'BOOKMARK') return;
      const project = j.metadata?.annotations?.['opsgate.io/project'] ?? '?';
      let s = seen.get(name);
      if (!s) {
        s = {
          name,
          project,
          commit: j.metadata?.annotations?.['opsgate.io/commit-sha'] ?? '',
          queueJob: j.metadata?.annotations?.['opsgate.io/queue-job-id'] ?? '',
          createdSeq: ++seq,
          createdAt: Date.now(),
        };
        seen.set(name, s);
        const group = active.get(project) ?? new Set<string>();
        if (group.size > 0) overlaps.push(`${project}: ${name} created while ${[...group].join(', ')} active`);
        group.add(name);
        active.set(project, group);
        maxActive.set(project, Math.max(maxActive.get(project) ?? 0, group.size));
      }
      const conds = (j.status?.conditions ?? []).filter((c) => c.status === 'True').map((c) => c.type);
      const done = conds.includes('Complete') ? true : conds.includes('Failed') ? false : undefined;
      if (done !== undefined && s.doneSeq === undefined) {
        s.doneSeq = ++seq;
        s.doneAt = Date.now();
        s.succeeded = done;
        active.get(project)?.delete(name);
      }
    };
    const startWatch = async (path: string, rv: string, handle: (type: string, obj: never) => void) => {
      let last = rv;
      const go = async (): Promise<void> => {
        aborts.push(
          await watch.watch(
            path,
            { resourceVersion: last, allowWatchBookmarks: true },
            (type, obj: { metadata?: { resourceVersion?: string } }) => {
              if (obj.metadata?.resourceVersion) last = obj.metadata.resourceVersion;
              handle(type, obj as never);
            },
            (err: unknown) => {
              if (stopping) return;
              if (err) watchErrors.push(err instanceof Error ? err.message : JSON.stringify(err));
              // the apiserver closes watches after a while: go on from the last write seen
              void go();
            },
          ),
        );
      };
      await go();
    };
    const batch = admin.makeApiClient(k8s.BatchV1Api);
    const jobsRv = (await batch.listNamespacedJob({ namespace: NS })).metadata!.resourceVersion!;
    await startWatch(`/apis/batch/v1/namespaces/${NS}/jobs`, jobsRv, onJob);
    const podsRv = (await core.listNamespacedPod({ namespace: NS })).metadata!.resourceVersion!;
    await startWatch(`/api/v1/namespaces/${NS}/pods`, podsRv, (type: string, p: k8s.V1Pod) => {
      const name = p.metadata?.name;
      if (!name || type === 'DELETED' || type === 'BOOKMARK' || ending.has(name)) return;
      if (p.metadata?.labels?.['job-name'] && (p.status?.phase ?? 'Pending') === 'Pending') endPod(name);
    });

    // ---- the processes: the API, two workers (the admin kubeconfig: RBAC is worker.test.ts's subject)
    const workerOpts = async () => ({
      env: await workerEnv(redis.url, {
        OPS_INVENTORY_FILE: inventoryFile,
        KUBECONFIG: cluster.kubeconfigPath,
        WORKER_CONCURRENCY: '8',
        ROLLOUT_POLL_INTERVAL_MS: '250',
        JOB_TIMEOUT_SECONDS: '60',
        // a dead worker's deploys come back within seconds (BullMQ's floor for the check is 500 ms)
        WORKER_LOCK_DURATION_MS: '4000',
        WORKER_STALLED_INTERVAL_MS: '1000',
      }),
      readyTimeoutMs: 30_000,
    });
    const [apiProc, w1, w2] = await Promise.all([
      apiEnv(redis.url, secrets, { OPS_INVENTORY_FILE: inventoryFile }).then((env) => startApi({ env, readyTimeoutMs: 30_000 })),
      workerOpts().then((o) => startWorkerProcess(o)),
      workerOpts().then((o) => startWorkerProcess(o)),
    ]);
    api = apiProc;
    workers.push(w1, w2);
    const tReady = Date.now();

    // ---- the pushes: 5 commits per project, all shuffled, 8 deliveries in flight
    const scm = pushSources().find((s) => s.name === 'scm')!;
    const hex = () => Array.from({ length: 40 }, () => '0123456789abcdef'[Math.floor(random() * 16)]).join('');
    const pushes: Push[] = [];
    for (let i = 0; i < PROJECTS; i++) for (let k = 0; k < PUSHES; k++) pushes.push({ project: projectName(i), sha: hex() });
    shuffle(pushes, SEED);

    // SIGKILL worker 1 once it has deploy Jobs created and not yet ended (it holds their turns)
    const killed = (async () => {
      const inFlight = () => {
        const created = new Set<unknown>();
        const ended = new Set<unknown>();
        for (const l of w1.logs()) {
          if (l.msg === 'deploy job created' || l.msg === 'deploy job already exists (created by an earlier attempt)')
            created.add(l.job_id);
          if (l.msg === 'change outcome') ended.add(l.job_id);
        }
        return [...created].filter((id) => !ended.has(id));
      };
      const held = await waitFor('worker 1 to wait for 3 deploy Jobs', () => inFlight().length >= 3 && inFlight(), 60_000, 20);
      w1.kill('SIGKILL');
      await w1.waitExit(10_000);
      return held;
    })();

    await pool(
      pushes.map((p) => async () => {
        const body = JSON.stringify({ object_kind: 'push', ref: REF, checkout_sha: p.sha, project: { path_with_namespace: p.project } });
        const res = await fetch(`${api.baseUrl}/webhook/scm`, {
          method: 'POST',
          headers: pushHeaders(scm, secrets.scm, body),
          body,
        });
        const answer = (await res.json()) as { accepted?: boolean; job_id?: string };
        expect({ status: res.status, accepted: answer.accepted }).toEqual({ status: 202, accepted: true });
        p.jobId = answer.job_id;
      }),
      8,
    );
    const tPushed = Date.now();

    const heldByKilled = await killed;
    const tKilled = Date.now();
    // started again: the one left and the new one share the recovery and the rest of the work
    const w1b = await startWorkerProcess(await workerOpts());
    workers.push(w1b);

    // ---- every accepted deploy ends
    const q = inspectQueue(redis.url);
    try {
      for (const p of pushes) {
        const job = await q.queue.getJob(p.jobId!);
        expect(job).toBeDefined();
        p.acceptedAt = job!.timestamp;
      }
      const history = async (project: string) => {
        const res = await fetch(`${api.baseUrl}/ops/deploys?project=${encodeURIComponent(project)}&limit=100`, {
          headers: { 'X-API-Key': secrets.readonlyKey },
        });
        expect(res.status).toBe(200);
        return ((await res.json()) as { deploys: Array<Record<string, string | null>> }).deploys;
      };
      const byProject = new Map<string, Array<Record<string, string | null>>>();
      await waitFor(
        'every accepted deploy to reach a final state',
        async () => {
          const c = await q.counts();
          if (c.waiting + c.active + c.delayed + c.prioritized > 0) return false;
          for (let i = 0; i < PROJECTS; i++) {
            const list = await history(projectName(i));
            if (list.length < PUSHES || list.some((d) => !FINAL.has(String(d.state)))) return false;
            byProject.set(projectName(i), list);
          }
          return true;
        },
        90_000,
        500,
      );
      const tDone = Date.now();
      // the last Jobs' completions reach the watch within the same second
      await waitFor('the watch to see every Job end', () => [...seen.values()].every((s) => s.doneSeq !== undefined), 10_000, 50);

      // ---- the counts
      const all = [...byProject.values()].flat();
      const states = (s: string) => all.filter((d) => d.state === s).length;
      const stalled = workers.flatMap((w) => w.logs()).filter((l) => String(l.msg).startsWith('job stalled')).length;
      const retried = workers
        .flatMap((w) => w.logs())
        .filter((l) => l.msg === 'deploy job already exists (created by an earlier attempt)').length;
      const counts = {
        seed: SEED,
        accepted: pushes.length,
        succeeded: states('succeeded'),
        superseded: states('superseded'),
        failed: states('failed'),
        kubernetesJobs: seen.size,
        killedWorkerHeld: heldByKilled.length,
        stalled,
        resumedOnTheirJob: retried,
        maxActivePerGroup: Math.max(...maxActive.values()),
        // from a Job's creation to its Complete condition, as the watch saw them
        jobSecondsMedian: median([...seen.values()].map((s) => (s.doneAt! - s.createdAt) / 1000)),
        wallSeconds: {
          setUp: (tReady - t0) / 1000,
          pushes: (tPushed - tReady) / 1000,
          killAfterStart: (tKilled - tReady) / 1000,
          allEnded: (tDone - tReady) / 1000,
        },
      };
      process.stderr.write(`[deployBlackBox] ${JSON.stringify(counts)}\n`);

      // ---- nothing lost, nothing run twice
      expect(all.length).toBe(PROJECTS * PUSHES);
      expect(new Set(all.map((d) => d.job_id))).toEqual(new Set(pushes.map((p) => p.jobId)));
      expect(counts.failed).toBe(0);
      expect(counts.succeeded + counts.superseded).toBe(pushes.length);
      expect((await q.counts()).failed).toBe(0);
      // the killed worker's deploys came back through the stalled-job check, each to its own Job
      expect(stalled).toBeGreaterThanOrEqual(1);
      expect(retried).toBeGreaterThanOrEqual(1);
      expect(seen.size).toBe(counts.succeeded);
      expect(new Set([...seen.values()].map((s) => s.queueJob)).size).toBe(seen.size);
      expect(watchErrors).toEqual([]);
      expect(podErrors).toEqual([]);

      // ---- per group
      expect(overlaps).toEqual([]);
      expect([...maxActive.values()].every((n) => n === 1)).toBe(true);
      const byJobId = new Map(pushes.map((p) => [p.jobId!, p]));
      for (let i = 0; i < PROJECTS; i++) {
        const project = projectName(i);
        const mine = pushes.filter((p) => p.project === project);
        const newest = mine.reduce((a, b) =>
          acceptedAfter({ at: b.acceptedAt!, id: b.jobId! }, { at: a.acceptedAt!, id: a.jobId! }) ? b : a,
        );
        // the Jobs of the group, in the order the apiserver wrote them: each after the one before
        // ended, each accepted after the one before, the newest last
        const jobs = [...seen.values()].filter((s) => s.project === project).sort((a, b) => a.createdSeq - b.createdSeq);
        expect(jobs.length).toBeGreaterThanOrEqual(1);
        for (let k = 1; k < jobs.length; k++) {
          expect(jobs[k]!.createdSeq).toBeGreaterThan(jobs[k - 1]!.doneSeq!);
          const prev = byJobId.get(jobs[k - 1]!.queueJob)!;
          const next = byJobId.get(jobs[k]!.queueJob)!;
          expect(acceptedAfter({ at: next.acceptedAt!, id: next.jobId! }, { at: prev.acceptedAt!, id: prev.jobId! })).toBe(true);
        }
        const last = jobs[jobs.length - 1]!;
        expect({ project, commit: last.commit, queueJob: last.queueJob, succeeded: last.succeeded }).toEqual({
          project,
          commit: newest.sha,
          queueJob: newest.jobId,
          succeeded: true,
        });

        // what the API says runs now: the newest accepted, nothing running
        const res = await fetch(`${api.baseUrl}/ops/projects/${encodeURIComponent(project)}`, {
          headers: { 'X-API-Key': secrets.readonlyKey },
        });
        expect(res.status).toBe(200);
        const view = (await res.json()) as { refs: Array<{ ref: string; current: Record<string, string> | null; running: unknown }> };
        const main = view.refs.find((r) => r.ref === REF)!;
        expect({ project, job: main.current?.job_id, commit: main.current?.commit, running: main.running }).toEqual({
          project,
          job: newest.jobId,
          commit: newest.sha,
          running: null,
        });
        // the history: newest accepted first, the newest succeeded, every other superseded or succeeded before it
        const list = byProject.get(project)!;
        expect(list[0]).toMatchObject({ job_id: newest.jobId, commit: newest.sha, state: 'succeeded' });
        for (const d of list.slice(1)) {
          expect(['superseded', 'succeeded']).toContain(d.state);
          if (d.state === 'succeeded') expect(Date.parse(d.finished_at!)).toBeLessThanOrEqual(Date.parse(list[0]!.started_at!));
          if (d.state === 'superseded') {
            // named: a deploy of the same group, accepted after it
            const self = byJobId.get(d.job_id!)!;
            const by = byJobId.get(d.superseded_by!);
            expect({ id: d.job_id, by: by?.project }).toEqual({ id: d.job_id, by: project });
            expect(acceptedAfter({ at: by!.acceptedAt!, id: by!.jobId! }, { at: self.acceptedAt!, id: self.jobId! })).toBe(true);
          }
        }
      }
      expect(Date.now() - t0).toBeLessThan(180_000);
    } finally {
      await q.close();
    }
  });
});
