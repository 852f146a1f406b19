import { afterAll, describe, expect, jest, test } from '@jest/globals';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import {
  CHART,
  LOCAL_IMAGES,
  getJson,
  helm,
  http,
  kubectl,
  list,
  ok,
  podReady,
  serviceUrl,
  waitFor,
  type Obj,
} from '../../helpers/nodeSupport.js';

/**
 * The chart's redis.architecture=replication on the real node : 3 pods, each a
 * Redis node and a Sentinel, from the test image (Debian's redis-server). With
 * config.redisMinReplicasAck=1: alerts answered 202 and run by the worker; then the primary pod is
 * deleted (--grace-period=0 --force) under steady load: the sentinels promote a replica, the API
 * answers 202 again without any API or worker restart, and every event answered 202 has exactly
 * one job. Prints the failover figures. Its own release and namespace, uninstalled at the end.
 */
jest.setTimeout(600_000);

const RELEASE = 'ha';
const NS = 'e2e-ha';
const MASTER = 'opsgate';
const TOKEN = `e2e-alerts-${randomBytes(16).toString('hex')}`;
const RO_KEY = `e2e-ro-${randomBytes(12).toString('hex')}`;
/** The chart's default down-after-milliseconds: what a user gets. */
const DOWN_AFTER_MS = 5000;
/** Intake must be back within the failover time plus this much. */
const RECOVERY_DEADLINE_MS = 90_000;

const values = {
  redis: { architecture: 'replication' },
  config: { redisMinReplicasAck: 1, rateLimitRps: 100000 },
  secrets: { alertsWebhookToken: TOKEN, apiKeyRoles: `${RO_KEY}:readonly` },
};

function valuesFile(v: unknown): string {
  const f = join(mkdtempSync(join(tmpdir(), 'opsgate-e2e-ha-')), 'values.yaml');
  writeFileSync(f, stringify(v), { mode: 0o600 });
  return f;
}

const releasePods = (component: string) =>
  list('pods', NS, `app.kubernetes.io/instance=${RELEASE},app.kubernetes.io/component=${component}`);
const redisPod = (i: number) => `${RELEASE}-opsgate-redis-${i}`;

/** Ask the sentinel of pod i (kubectl exec: REDISCLI_AUTH is in the container's environment). */
async function sentinel(i: number, ...args: string[]): Promise<string[] | undefined> {
  const r = await kubectl(
    ['-n', NS, 'exec', redisPod(i), '-c', 'sentinel', '--', 'redis-cli', '-p', '26379', '--no-auth-warning', ...args],
    undefined,
    15_000,
  );
  return r.code === 0 ? r.stdout.trim().split('\n') : undefined;
}

/** The pod index the sentinel of pod i names as the primary. */
async function primaryPer(i: number): Promise<number | undefined> {
  const out = await sentinel(i, 'sentinel', 'get-master-addr-by-name', MASTER);
  const m = out && /^[\w-]+-redis-(\d)\./.exec(out[0] ?? '');
  return m ? Number(m[1]) : undefined;
}

async function sentinelMaster(i: number): Promise<Record<string, string>> {
  const out = (await sentinel(i, 'sentinel', 'master', MASTER)) ?? [];
  const o: Record<string, string> = {};
  for (let k = 0; k + 1 < out.length; k += 2) o[out[k]!] = out[k + 1]!;
  return o;
}

/** What a failed failover step leaves to read: the API/worker pods' last log lines, the sentinels' view, the API's endpoints. */
async function diagnostics(): Promise<string> {
  const out: string[] = [];
  for (const component of ['api', 'worker']) {
    for (const p of await releasePods(component)) {
      const r = await kubectl(['-n', NS, 'logs', p.metadata.name as string, '--tail=60'], undefined, 15_000);
      out.push(`--- logs ${p.metadata.name as string} (ready ${String(podReady(p))})`, r.stdout.trim());
    }
  }
  for (const i of [1, 2]) out.push(`--- sentinel ${i}: primary pod ${String(await primaryPer(i))}`);
  const ep = await kubectl(['-n', NS, 'get', 'endpoints', '-o', 'wide'], undefined, 15_000);
  out.push('--- endpoints', ep.stdout.trim());
  return out.join('\n');
}

/** The job a fingerprint's deduplication record names, read on the primary pod (BullMQ's record, for the report only). */
async function dedupJobOf(primary: number, fingerprint: string): Promise<string | undefined> {
  const r = await kubectl(
    ['-n', NS, 'exec', redisPod(primary), '-c', 'redis', '--', 'redis-cli', '--no-auth-warning', 'GET', `bull:ops:de:alert:${fingerprint}`],
    undefined,
    15_000,
  );
  const v = r.code === 0 ? r.stdout.trim() : '';
  return v === '' ? undefined : v;
}

/**
 * What the worker's log says of jobs run again after the failover: the jobs the stall check moved
 * back to waiting, and the jobs completed more than once (a completion the promoted replica never
 * received).
 */
async function reruns(): Promise<string> {
  const stalled = new Set<string>();
  const completions = new Map<string, number>();
  for (const p of await releasePods('worker')) {
    const r = await kubectl(['-n', NS, 'logs', p.metadata.name as string], undefined, 30_000);
    for (const line of r.stdout.split('\n')) {
      let l: { msg?: string; job_id?: string };
      try {
        l = JSON.parse(line) as typeof l;
      } catch {
        continue;
      }
      if (!l.job_id) continue;
      if (l.msg?.startsWith('job stalled')) stalled.add(l.job_id);
      if (l.msg === 'job completed') completions.set(l.job_id, (completions.get(l.job_id) ?? 0) + 1);
    }
  }
  const twice = [...completions.values()].filter((n) => n > 1).length;
  return `worker log: ${stalled.size} job(s) found stalled and run again, ${twice} job(s) completed more than once`;
}

/**
 * Where every event's job is when they are not all completed: the count of each state, then each
 * event whose job is not completed (or has none, or two) with the job's state, attempts and reason,
 * and the answers its sender got: a lost job, a doubled one, one left active by a completion the
 * old primary took with it, or one merely slow.
 */
async function jobsReport(api: string, events: readonly Sent[], primary: number): Promise<string> {
  const out: string[] = [];
  const counts: Record<string, number | string> = {};
  for (const state of ['completed', 'failed', 'waiting', 'active', 'delayed']) {
    const r = await http('GET', `${api}/ops/jobs?state=${state}&limit=1`, { headers: { 'X-API-Key': RO_KEY } });
    counts[state] = r.status === 200 ? (r.body.total as number) : `HTTP ${r.status}`;
  }
  out.push(`job states: ${JSON.stringify(counts)}; ${events.length} load events`);
  let listed = 0;
  for (const e of events) {
    const ids = e.jobIds.length > 0 ? e.jobIds : [await dedupJobOf(primary, e.fingerprint)];
    const views: string[] = [];
    let odd = ids.length !== 1 || ids[0] === undefined;
    for (const id of ids) {
      if (id === undefined) {
        views.push('no job (no deduplication record)');
        continue;
      }
      const r = await http('GET', `${api}/ops/jobs/${encodeURIComponent(id)}`, { headers: { 'X-API-Key': RO_KEY } });
      const b = r.body as Record<string, unknown>;
      if (r.status !== 200 || b.state !== 'completed') odd = true;
      views.push(
        r.status === 200
          ? `${id} ${String(b.state)} attempts ${String(b.attempts_made)} processed ${String(b.processed_at)} finished ${String(b.finished_at)} reason ${JSON.stringify(b.failed_reason)}`
          : `${id} HTTP ${r.status}`,
      );
    }
    if (!odd) continue;
    if (++listed > 25) continue;
    const answers = e.attempts.map(([sent, got, status]) => `${new Date(sent).toISOString()}+${got - sent}ms ${status}`).join(', ');
    out.push(`event ${e.fingerprint}: ${views.join(' | ')}; answers: ${answers}; last detail ${JSON.stringify(e.lastDetail ?? null)}`);
  }
  out.push(`${listed} event(s) whose job is not exactly one completed job${listed > 25 ? ' (first 25 listed)' : ''}`);
  return out.join('\n');
}

interface Sent {
  fingerprint: string;
  jobIds: string[];
  /** Every answer of this event's attempts: [sent at, answered at, status or error]. */
  attempts: Array<[number, number, string]>;
  /** The last failed attempt's answer detail or error (for a failure message). */
  lastDetail?: string;
}

describe('charts/opsgate redis.architecture=replication on a real node', () => {
  let api = '';
  const alertsHeaders = { 'Content-Type': 'application/json', Authorization: `Bearer ${TOKEN}` };

  /** One alert event, sent until it is answered 202 (as Alertmanager does), bounded. */
  async function send(fingerprint: string, deadline: number, abandoned: () => boolean = () => false): Promise<Sent> {
    const s: Sent = { fingerprint, jobIds: [], attempts: [] };
    const body = JSON.stringify({
      alerts: [{ status: 'firing', fingerprint, labels: { alertname: 'E2eFailover' }, annotations: { summary: fingerprint } }],
    });
    for (;;) {
      const t0 = Date.now();
      let status: string;
      try {
        const r = await http('POST', `${api}/webhook/alerts`, { headers: alertsHeaders, body, timeoutMs: 5000 });
        status = String(r.status);
        if (r.status !== 202) s.lastDetail = String(r.body.detail ?? r.text.slice(0, 200));
        if (r.status === 202) s.jobIds.push(...((r.body.job_ids as string[] | undefined) ?? []));
      } catch (e) {
        status = (e as Error).name;
        const cause = (e as { cause?: { code?: string; message?: string } }).cause;
        s.lastDetail = `${(e as Error).message} ${cause?.code ?? cause?.message ?? ''}`;
      }
      s.attempts.push([t0, Date.now(), status]);
      if (status === '202' || abandoned()) return s;
      if (Date.now() > deadline)
        throw new Error(`event ${fingerprint} never answered 202: ${JSON.stringify(s.attempts.slice(-5))}; last: ${s.lastDetail}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  async function jobCount(state: string): Promise<number> {
    const r = await http('GET', `${api}/ops/jobs?state=${state}&limit=1`, { headers: { 'X-API-Key': RO_KEY } });
    expect(r.status).toBe(200);
    return r.body.total as number;
  }

  afterAll(async () => {
    await helm(['uninstall', RELEASE, '-n', NS, '--ignore-not-found', '--wait', '--timeout', '2m']);
    await kubectl(['delete', 'namespace', NS, '--ignore-not-found', '--wait=false']);
  });

  test('install: 3 Redis pods and 3 sentinels Ready, one primary with 2 replicas; signed alerts answered 202 and their jobs completed', async () => {
    await waitFor(`namespace ${NS} gone`, async () => !(await getJson('namespace', NS)), 120_000, 1000);
    const t0 = Date.now();
    ok(
      await helm([
        'install',
        RELEASE,
        CHART,
        '-n',
        NS,
        '--create-namespace',
        '-f',
        LOCAL_IMAGES,
        '-f',
        valuesFile(values),
        '--wait',
        '--timeout',
        '6m',
      ]),
      'helm install --wait',
    );
    process.stderr.write(`[e2e-ha] helm install --wait (replication): ${Date.now() - t0} ms\n`);
    const redis = await releasePods('redis');
    expect(redis.map((p) => p.metadata.name).sort()).toEqual([0, 1, 2].map(redisPod));
    for (const p of redis) {
      expect(podReady(p)).toBe(true);
      expect((p.status.containerStatuses as Obj[]).map((c) => [c.name, c.ready]).sort()).toEqual([
        ['redis', true],
        ['sentinel', true],
      ]);
    }
    // Every sentinel agrees on pod 0, sees 2 replicas and the 2 other sentinels.
    for (const i of [0, 1, 2]) {
      await waitFor(
        `sentinel ${i} sees the primary, 2 replicas, 2 other sentinels`,
        async () => {
          const m = await sentinelMaster(i);
          return (
            /-redis-0\./.test(m.ip ?? '') && m['num-slaves'] === '2' && m['num-other-sentinels'] === '2' && !/down/.test(m.flags ?? '')
          );
        },
        60_000,
        1000,
      );
    }
    api = await serviceUrl(`${RELEASE}-opsgate-api`, NS);
    const sent = await Promise.all(Array.from({ length: 10 }, (_, i) => send(`before-${i}`, Date.now() + 30_000)));
    // Each answered 202 in the end; on the way only a 503 (a replica not acknowledging within
    // REDIS_ACK_TIMEOUT_MS on the freshly started node). The 503's write was taken back, and the
    // retry queued the one job; or a worker had taken the job before the take-back, which leaves
    // it accepted, and the retry is its duplicate (202, no new job). One job per event either way:
    // the completed count below.
    let duplicatesAfter503 = 0;
    for (const s of sent) {
      expect(s.attempts.at(-1)![2]).toBe('202');
      for (const a of s.attempts.slice(0, -1)) expect(a[2]).toBe('503');
      if (s.jobIds.length === 0) {
        expect(s.attempts.length).toBeGreaterThan(1);
        duplicatesAfter503++;
      } else expect(s.jobIds).toHaveLength(1);
    }
    const retried = sent.reduce((n, s) => n + s.attempts.length - 1, 0);
    process.stderr.write(
      `[e2e-ha] 10 events before the failover: all 202, ${retried} 503 answers on the way (retried), ` +
        `${duplicatesAfter503} retries answered as the duplicate of a job a worker had already taken\n`,
    );
    await waitFor('the 10 jobs completed by the worker', async () => (await jobCount('completed')) === 10, 60_000, 1000);
    for (const s of ['failed', 'waiting', 'active', 'delayed']) expect([s, await jobCount(s)]).toEqual([s, 0]);
  });

  test('delete the primary pod (--grace-period=0 --force) under load: a replica is promoted, intake answers 202 again with no API/worker restart, every 202 has exactly one job', async () => {
    const workloads = async () =>
      Object.fromEntries(
        (await Promise.all(['api', 'worker'].map(releasePods)))
          .flat()
          .map((p) => [p.metadata.name, (p.status.containerStatuses as Obj[]).reduce((a, c) => a + (c.restartCount as number), 0)]),
      );
    const before = await workloads();
    const old = await primaryPer(1);
    expect(old).toBe(0);

    // Steady load: 4 senders, each a new event at a time, every event sent until 202.
    let stop = false;
    const events: Sent[] = [];
    let n = 0;
    let abandon = false;
    const senderErrors: unknown[] = [];
    const senders = Array.from({ length: 4 }, async () => {
      try {
        while (!stop) events.push(await send(`load-${n++}`, Date.now() + RECOVERY_DEADLINE_MS + 30_000, () => abandon));
      } catch (err) {
        senderErrors.push(err);
      }
    });
    // However the steps below end, the senders stop before this test does (a sender still
    // retrying after a failure would fail whichever test file runs next).
    const stopSenders = async (giveUp = false) => {
      stop = true;
      abandon = giveUp;
      await Promise.all(senders);
    };
    let promoted: { p: number; at: number };
    let killedAt: number;
    try {
      await waitFor('load running', async () => events.length >= 20, 30_000, 200);

      killedAt = Date.now();
      ok(await kubectl(['-n', NS, 'delete', 'pod', redisPod(0), '--grace-period=0', '--force']), 'kubectl delete pod (primary)');
      promoted = await waitFor(
        'a surviving sentinel names a new primary',
        async () => {
          for (const i of [1, 2]) {
            const p = await primaryPer(i);
            if (p !== undefined && p !== 0) return { p, at: Date.now() };
          }
          return undefined;
        },
        RECOVERY_DEADLINE_MS,
        250,
      );
      // Intake back: a request sent after the promotion answered 202 at the first try; then 5 s more load.
      await waitFor(
        'a first-try 202 after the promotion',
        async () => events.some((e) => e.attempts.length === 1 && e.attempts[0]![0] > promoted.at),
        RECOVERY_DEADLINE_MS,
        200,
      );
      const moreUntil = Date.now() + 5000;
      await waitFor('5 s more load', async () => Date.now() > moreUntil, 10_000, 200);
    } catch (err) {
      await stopSenders(true);
      process.stderr.write(`[e2e-ha] failover step failed: ${(err as Error).message}\n${await diagnostics()}\n`);
      throw err;
    }
    await stopSenders();
    if (senderErrors.length) {
      process.stderr.write(
        `[e2e-ha] ${senderErrors.length} sender(s) failed: ${(senderErrors[0] as Error).message}\n${await diagnostics()}\n`,
      );
      throw senderErrors[0] as Error;
    }

    const answers = events.flatMap((e) => e.attempts).filter((a) => a[0] >= killedAt);
    const failed = answers.filter((a) => a[2] !== '202');
    const lastFailure = failed.length ? Math.max(...failed.map((a) => a[1])) - killedAt : 0;
    const firstAfterPromotion =
      Math.min(
        ...events
          .flatMap((e) => e.attempts)
          .filter((a) => a[2] === '202' && a[0] > promoted.at)
          .map((a) => a[1]),
      ) - killedAt;
    const statuses: Record<string, number> = {};
    for (const a of failed) statuses[a[2]] = (statuses[a[2]] ?? 0) + 1;
    process.stderr.write(
      `[e2e-ha] primary pod ${redisPod(0)} deleted; pod ${promoted.p} promoted ${promoted.at - killedAt} ms after the kill (down-after ${DOWN_AFTER_MS} ms); ` +
        `first 202 to a request sent after the promotion at +${firstAfterPromotion} ms; last non-202 answer at +${lastFailure} ms; ` +
        `${answers.length} answers after the kill, non-202: ${JSON.stringify(statuses)}; ${events.length} events, all answered 202 in the end\n`,
    );
    expect(promoted.p === 1 || promoted.p === 2).toBe(true);
    expect(lastFailure).toBeLessThan(promoted.at - killedAt + 30_000);

    // No API or worker pod restarted or replaced: they followed the failover.
    expect(await workloads()).toEqual(before);

    // Exactly once: every event answered 202 has its job, and there is one job per event.
    const total = 10 + events.length;
    let completed = -1;
    await waitFor(`all ${total} jobs completed`, async () => (completed = await jobCount('completed')) === total, 120_000, 1000).catch(
      async (e: Error) => {
        process.stderr.write(`[e2e-ha] ${await jobsReport(api, events, promoted.p)}\n${await diagnostics()}\n`);
        throw new Error(`${e.message}: ${completed} completed (a lost or doubled job; the report above names each)`);
      },
    );
    // How much of the deadline the completions took: a job completed on the deleted primary whose
    // completion had not reached the replica runs again after the stall check finds it.
    process.stderr.write(`[e2e-ha] all ${total} jobs completed ${Date.now() - killedAt!} ms after the kill; ${await reruns()}\n`);
    for (const s of ['failed', 'waiting', 'active', 'delayed']) expect([s, await jobCount(s)]).toEqual([s, 0]);
    const ids = events.flatMap((e) => e.jobIds);
    expect(new Set(ids).size).toBe(ids.length);
    // Each job read as a client of the contract would: a 503 (the API's connection passing through
    // a reconnect while the old primary's pod comes back) is a "retry later", asked again within a
    // deadline; any other answer is final. The 503s are counted and shown.
    const unavailable: Record<string, number> = {};
    for (const id of ids) {
      const r = await waitFor(
        `GET /ops/jobs/${id} answered other than 503`,
        async () => {
          const a = await http('GET', `${api}/ops/jobs/${encodeURIComponent(id)}`, { headers: { 'X-API-Key': RO_KEY } });
          if (a.status !== 503) return a;
          const code = String(a.body.code);
          unavailable[code] = (unavailable[code] ?? 0) + 1;
          return undefined;
        },
        60_000,
        1000,
      );
      expect([id, r.status, r.body.state]).toEqual([id, 200, 'completed']);
    }
    process.stderr.write(`[e2e-ha] ${ids.length} jobs read back; 503s asked again: ${JSON.stringify(unavailable)}\n`);

    // The deleted pod is back as a replica of the new primary (never an empty primary).
    await waitFor(
      `${redisPod(0)} Ready again`,
      async () => {
        const p = await getJson('pod', redisPod(0), NS);
        return p && podReady(p);
      },
      180_000,
      1000,
    );
    await waitFor(
      'pod 0 a replica of the new primary, 2 replicas again',
      async () => {
        const m = await sentinelMaster(promoted.p);
        return new RegExp(`-redis-${promoted.p}\\.`).test(m.ip ?? '') && m['num-slaves'] === '2' && (await primaryPer(0)) === promoted.p;
      },
      120_000,
      1000,
    );
  });

  test('helm uninstall leaves nothing of the release', async () => {
    ok(await helm(['uninstall', RELEASE, '-n', NS, '--wait', '--timeout', '3m']), 'helm uninstall');
    await waitFor(
      'the release pods gone',
      async () => (await list('pods', NS, `app.kubernetes.io/instance=${RELEASE}`)).length === 0,
      120_000,
      1000,
    );
    const left: string[] = [];
    for (const kind of ['all', 'configmap', 'secret', 'pdb', 'networkpolicy', 'serviceaccount', 'role', 'rolebinding', 'pvc']) {
      const r = await kubectl(['get', kind, '-n', NS, '-o', 'name']);
      for (const n of r.stdout.trim().split('\n').filter(Boolean))
        if (!n.includes('kube-root-ca') && !/serviceaccount\/default$/.test(n)) left.push(n);
    }
    expect(left).toEqual([]);
    ok(await kubectl(['delete', 'namespace', NS, '--wait=true', '--timeout=120s']), 'delete namespace');
  });
});
