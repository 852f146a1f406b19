/**
 * `make bench-scale`: how intake and the worker scale with processes on one Redis, and what a deep
 * queue costs, printed as one table (also artifacts/bench-scale.{txt,json}). Not part of `make test`.
 *
 * - Intake: unique push events (bench/wrk.lua, as `make bench`) to 1, 2 and 4 APIs
 *   (BENCH_SCALE_APIS) as the chart runs them (its heap caps, the images' MALLOC_ARENA_MAX, the
 *   rate limiter on with a limit never reached), 64 connections in all. wrk drives one host:port,
 *   so N APIs get N wrk processes at once, one per API, with 64/N connections each (at least 8):
 *   req/s summed, p50/p99 the max of theirs. Plus the APIs' own CPU (/proc, every thread) per
 *   request and Redis CPU per 1,000 requests.
 * - Worker drain: BENCH_JOBS notify_oncall jobs queued while the queue is paused, then 1 and 2
 *   worker processes (BENCH_SCALE_WORKERS; dist/worker/index.js) and the queue resumed: jobs/s
 *   to empty, every job completed (their log lines), none failed.
 * - A deep queue: BENCH_SCALE_WAITING (100,000) notify_oncall jobs waiting in the paused queue:
 *   Redis memory per waiting job (INFO memory used_memory, after - before, / jobs); one API's
 *   intake with them waiting against the same API's on an empty queue measured right before;
 *   then the same number of jobs drained by one worker.
 * Redis is flushed between parts and before each measured run; every process is stopped in a
 * finally, each stop bounded. Knobs: BENCH_DURATION, BENCH_WARMUP, BENCH_JOBS,
 * BENCH_SCALE_WAITING (0: no deep-queue part), BENCH_SCALE_APIS, BENCH_SCALE_WORKERS (empty: no such part).
 * The load generator shares the machine with the APIs, the workers and Redis: on two cores more
 * processes compete for the same cores, so the table says what the machine gives, not a node each.
 */
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { QUEUE_NAME } from '../src/shared/jobs.js';
import { withTimeout } from '../src/shared/timeout.js';
import { startRedis } from '../test/helpers/redis.js';
import {
  addNotifyJobs,
  apiEnv,
  CHART_HEAP_CAP_MB,
  CHART_SEMI_SPACE_MB,
  chartHeapArgs,
  countLines,
  drainedWithin,
  fmt,
  JOB_COMPLETED,
  log,
  MALLOC_ARENA_MAX,
  processCpuMs,
  redisCpuMs,
  ROOT,
  runWrk,
  SCM_SECRET,
  sleep,
  startServer,
  startWorkerProcess,
  type Proc,
} from './support.js';

const DURATION = Number(process.env.BENCH_DURATION ?? 8);
const WARMUP = Number(process.env.BENCH_WARMUP ?? 2);
const JOBS = Number(process.env.BENCH_JOBS ?? 20000);
const WAITING = Number(process.env.BENCH_SCALE_WAITING ?? 100000);
const CONNECTIONS = 64;
const MIN_CONNECTIONS_PER_API = 8;
const RATE_LIMIT_RPS = '1000000';

function counts(name: string, fallback: string): number[] {
  const raw = process.env[name] ?? fallback;
  const xs = raw
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean)
    .map(Number);
  if (xs.some((x) => !Number.isInteger(x) || x < 1))
    throw new Error(`${name} must be a comma-separated list of positive integers, not "${raw}"`);
  return xs;
}
const APIS = counts('BENCH_SCALE_APIS', '1,2,4');
const WORKERS = counts('BENCH_SCALE_WORKERS', '1,2');

/** Waits for `p` at most `ms`, logging instead of throwing: a stop that hangs must not keep the bench (and what it started) from finishing. */
const bounded = (p: Promise<unknown>, ms: number, what: string): Promise<unknown> =>
  withTimeout(p, ms, what).catch((err: unknown) => log(`${what}: ${err instanceof Error ? err.message : String(err)}`));

const stopAll = async (ps: Proc[]) => {
  for (const p of ps) await bounded(p.stop(), 35_000, `stopping pid ${p.child.pid}`);
};

async function redisUsedMemory(r: Redis): Promise<number> {
  return Number(/used_memory:(\d+)/.exec(await r.info('memory'))?.[1] ?? NaN);
}

interface Intake {
  rps: number;
  /** The max of the wrk processes' p50 / p99. */
  p50: number;
  p99: number;
  requests: number;
  perApiRps: number[];
  connectionsEach: number;
  non2xx: number;
  errors: number;
  /** Every wrk process had at least one answer. */
  allAnswered: boolean;
  /** The APIs' CPU (user + sys, every thread) per request, us: what one request costs an API. */
  cpuUsPerReq: number;
  redisMsPer1k: number;
}

type Api = { p: Proc; url: string };

/**
 * wrk stops with requests in flight and the APIs finish them after it exits: waits until Redis's
 * key count holds still for 250 ms (at most 5 s), so their jobs land before the next flush or count.
 */
async function settled(admin: Redis): Promise<void> {
  const deadline = Date.now() + 5000;
  let last = await admin.dbsize();
  for (;;) {
    await sleep(250);
    const n = await admin.dbsize();
    if (n === last || Date.now() > deadline) return;
    last = n;
  }
}

/** Unique pushes to every API at once, one wrk per API, CONNECTIONS in all. */
async function intake(apis: Api[], admin: Redis, label: string, seconds: number, measured: boolean): Promise<Intake> {
  const each = Math.max(MIN_CONNECTIONS_PER_API, Math.round(CONNECTIONS / apis.length));
  const tag = `${label}-${Date.now().toString(36)}`;
  const env = (i: number) => ({ BENCH_MODE: 'unique', BENCH_PREFIX: `${tag}-${i}`, BENCH_TOKEN: SCM_SECRET, BENCH_ALERTS: '1' });
  log(`${label}: ${measured ? '' : 'warm-up '}${seconds}s, ${apis.length} x wrk at ${each} connections`);
  const cpu0 = apis.map((a) => processCpuMs(a.p.child.pid!));
  const r0 = await redisCpuMs(admin);
  const rs = await Promise.all(apis.map((a, i) => runWrk(a.url, env(i), each, seconds)));
  const r1 = await redisCpuMs(admin);
  const cpu = apis.reduce((sum, a, i) => sum + processCpuMs(a.p.child.pid!) - cpu0[i]!, 0);
  await settled(admin);
  const requests = rs.reduce((a, r) => a + r.requests, 0);
  const allAnswered = rs.every((r) => r.requests > 0);
  const perApiRps = rs.map((r) => r.requests / (r.duration_us / 1e6));
  return {
    rps: perApiRps.reduce((a, x) => a + x, 0),
    p50: allAnswered ? Math.max(...rs.map((r) => r.p50_us / 1000)) : NaN,
    p99: allAnswered ? Math.max(...rs.map((r) => r.p99_us / 1000)) : NaN,
    requests,
    perApiRps,
    connectionsEach: each,
    non2xx: rs.reduce((a, r) => a + r.non2xx, 0),
    errors: rs.reduce((a, r) => a + r.socket_errors + r.timeouts, 0),
    allAnswered,
    cpuUsPerReq: requests > 0 ? (cpu / requests) * 1000 : NaN,
    redisMsPer1k: requests > 0 ? ((r1 - r0) / requests) * 1000 : NaN,
  };
}

interface Drain {
  jobs: number;
  workers: number;
  rate: number;
  seconds: number;
  completedLogged: number;
  failed: number;
  /** The workers' CPU (user + sys, every thread) per job, us. */
  cpuUsPerJob: number;
  redisMsPer1k: number;
}

/** `jobs` already waiting in the paused queue; `n` workers started, then the queue resumed and timed to empty. */
async function drain(queue: Queue, admin: Redis, redisUrl: string, procs: Proc[], jobs: number, n: number, tag: string): Promise<Drain> {
  const logs = Array.from({ length: n }, (_, i) => join(ROOT, `artifacts/bench-scale-${tag}-worker-${i + 1}.log`));
  const workers: Proc[] = [];
  try {
    for (let i = 0; i < n; i++) workers.push(await startWorkerProcess(procs, `worker-${i + 1}`, redisUrl, logs[i]!));
    log(`${tag}: ${n} worker(s) ready; resuming the queue (${fmt(jobs)} jobs)`);
    const cpu0 = workers.map((w) => processCpuMs(w.child.pid!));
    const r0 = await redisCpuMs(admin);
    const t0 = performance.now();
    await queue.resume();
    await drainedWithin(queue, 600_000 + jobs * 10);
    const seconds = (performance.now() - t0) / 1000;
    const r1 = await redisCpuMs(admin);
    const cpu = workers.reduce((sum, w, i) => sum + processCpuMs(w.child.pid!) - cpu0[i]!, 0);
    const failed = (await queue.getJobCounts('failed')).failed ?? 0;
    await stopAll(workers);
    return {
      jobs,
      workers: n,
      rate: jobs / seconds,
      seconds,
      completedLogged: logs.reduce((a, f) => a + countLines(f, JOB_COMPLETED), 0),
      failed,
      cpuUsPerJob: (cpu / jobs) * 1000,
      redisMsPer1k: ((r1 - r0) / jobs) * 1000,
    };
  } finally {
    await stopAll(workers);
  }
}

async function main() {
  const load0 = os.loadavg();
  const started = new Date();
  mkdirSync(join(ROOT, 'artifacts'), { recursive: true });
  const redis = await startRedis();
  const admin = new Redis(redis.url);
  const conn = new Redis(redis.url, { maxRetriesPerRequest: null });
  const queue = new Queue(QUEUE_NAME, { connection: conn });
  const procs: Proc[] = [];
  try {
    const startApis = async (n: number, tag: string): Promise<Api[]> => {
      const apis: Api[] = [];
      for (let i = 0; i < n; i++) {
        apis.push(
          await startServer(
            procs,
            `api-${i + 1}`,
            'dist/src/server.js',
            await apiEnv(redis.url, RATE_LIMIT_RPS),
            chartHeapArgs(CHART_HEAP_CAP_MB, CHART_SEMI_SPACE_MB),
            join(ROOT, `artifacts/bench-scale-${tag}-api-${i + 1}.log`),
          ),
        );
      }
      return apis;
    };
    /** Warm-up, then Redis flushed, then the measured run: every measured run starts from an empty Redis. */
    const measureIntake = async (apis: Api[], label: string) => {
      await intake(apis, admin, label, WARMUP, false);
      await admin.flushall();
      return intake(apis, admin, label, DURATION, true);
    };

    // 1. intake with N APIs
    const apiRuns: Array<{ apis: number; r: Intake }> = [];
    for (const n of APIS) {
      await admin.flushall();
      const apis = await startApis(n, `apis${n}`);
      try {
        apiRuns.push({ apis: n, r: await measureIntake(apis, `${n} API(s)`) });
      } finally {
        await stopAll(apis.map((a) => a.p));
      }
    }

    // 2. drain with N workers
    const workerRuns: Drain[] = [];
    for (const n of WORKERS) {
      await admin.flushall();
      await queue.pause();
      log(`workers ${n}: queueing ${fmt(JOBS)} notify_oncall jobs (queue paused)`);
      await addNotifyJobs(queue, 0, JOBS);
      workerRuns.push(await drain(queue, admin, redis.url, procs, JOBS, n, `workers${n}`));
    }

    // 3. the queue at WAITING waiting jobs
    let deep:
      | {
          memBefore: number;
          memAfter: number;
          bytesPerJob: number;
          fillRate: number;
          counted: number;
          empty: Intake;
          waiting: Intake;
          drain: Drain;
        }
      | undefined;
    if (WAITING > 0) {
      await admin.flushall();
      const apis = await startApis(1, 'waiting');
      let empty: Intake, waiting: Intake, memBefore: number, memAfter: number, fillSeconds: number, counted: number;
      try {
        empty = await measureIntake(apis, 'empty queue');
        await admin.flushall();
        await queue.pause();
        memBefore = await redisUsedMemory(admin);
        log(`waiting: queueing ${fmt(WAITING)} notify_oncall jobs (queue paused)`);
        const t0 = performance.now();
        await addNotifyJobs(queue, 0, WAITING);
        fillSeconds = (performance.now() - t0) / 1000;
        memAfter = await redisUsedMemory(admin);
        counted = (await queue.getJobCounts('waiting')).waiting ?? 0;
        waiting = await intake(apis, admin, `${fmt(WAITING)} waiting`, DURATION, true);
      } finally {
        await stopAll(apis.map((a) => a.p));
      }
      // The intake run added its own jobs (deploy pipelines): the drain gets exactly the bench's jobs again.
      await admin.flushall();
      await queue.pause();
      log(`waiting: queueing ${fmt(WAITING)} notify_oncall jobs again for the drain`);
      await addNotifyJobs(queue, 0, WAITING);
      const d = await drain(queue, admin, redis.url, procs, WAITING, 1, 'waiting');
      deep = {
        memBefore,
        memAfter,
        bytesPerJob: (memAfter - memBefore) / WAITING,
        fillRate: WAITING / fillSeconds,
        counted,
        empty,
        waiting,
        drain: d,
      };
    }
    const load1 = os.loadavg();

    // ------------------------------------------------------------ table
    const knobs = (apis: string, workers: string, waiting: number, extra = '') =>
      `BENCH_SCALE_APIS=${apis} BENCH_SCALE_WORKERS=${workers} BENCH_SCALE_WAITING=${waiting}${extra} make bench-scale`;
    const timing = ` BENCH_DURATION=${DURATION} BENCH_WARMUP=${WARMUP}`;
    const rows: string[][] = [
      ['measure', 'processes', 'result', 'x base', 'p99 ms', 'process CPU us/req', 'Redis ms/1k', 'reproduce (env)'],
    ];
    const plural = (n: number, what: string) => `${n} ${what}${n === 1 ? '' : 's'}`;
    const baseApi = apiRuns[0];
    for (const { apis, r } of apiRuns) {
      rows.push([
        `intake, unique pushes, ${CONNECTIONS} connections in all`,
        plural(apis, 'API'),
        `${fmt(r.rps)} req/s`,
        fmt(r.rps / baseApi!.r.rps, 2),
        fmt(r.p99, 1),
        fmt(r.cpuUsPerReq),
        fmt(r.redisMsPer1k, 1),
        knobs(apis === baseApi!.apis ? String(apis) : `${baseApi!.apis},${apis}`, '', 0, timing),
      ]);
    }
    const baseWorker = workerRuns[0];
    for (const d of workerRuns) {
      rows.push([
        `worker drain, ${fmt(JOBS)} notify_oncall jobs`,
        plural(d.workers, 'worker'),
        `${fmt(d.rate)} jobs/s`,
        fmt(d.rate / baseWorker!.rate, 2),
        '-',
        fmt(d.cpuUsPerJob),
        fmt(d.redisMsPer1k, 1),
        knobs('', d.workers === baseWorker!.workers ? String(d.workers) : `${baseWorker!.workers},${d.workers}`, 0, ` BENCH_JOBS=${JOBS}`),
      ]);
    }
    if (deep) {
      const cmd = knobs('', '', WAITING, timing);
      rows.push(
        [
          `Redis memory per waiting notify_oncall job (${fmt(WAITING)} waiting)`,
          '-',
          `${fmt(deep.bytesPerJob)} B/job`,
          '-',
          '-',
          '-',
          '-',
          cmd,
        ],
        [
          'intake, unique pushes, empty queue',
          '1 API',
          `${fmt(deep.empty.rps)} req/s`,
          '1.00',
          fmt(deep.empty.p99, 1),
          fmt(deep.empty.cpuUsPerReq),
          fmt(deep.empty.redisMsPer1k, 1),
          cmd,
        ],
        [
          `intake, unique pushes, ${fmt(WAITING)} jobs waiting`,
          '1 API',
          `${fmt(deep.waiting.rps)} req/s`,
          fmt(deep.waiting.rps / deep.empty.rps, 2),
          fmt(deep.waiting.p99, 1),
          fmt(deep.waiting.cpuUsPerReq),
          fmt(deep.waiting.redisMsPer1k, 1),
          cmd,
        ],
        [
          `worker drain of the ${fmt(WAITING)} waiting jobs`,
          '1 worker',
          `${fmt(deep.drain.rate)} jobs/s`,
          '-',
          '-',
          fmt(deep.drain.cpuUsPerJob),
          fmt(deep.drain.redisMsPer1k, 1),
          cmd,
        ],
      );
    }
    const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
    const right = new Set([2, 3, 4, 5, 6]);
    const row = (r: string[]) => '| ' + r.map((c, i) => (right.has(i) ? c.padStart(widths[i]!) : c.padEnd(widths[i]!))).join(' | ') + ' |';
    const sep = '+' + widths.map((wd) => '-'.repeat(wd + 2)).join('+') + '+';

    const intakes = [...apiRuns.map((a) => a.r), ...(deep ? [deep.empty, deep.waiting] : [])];
    const drains = [...workerRuns, ...(deep ? [deep.drain] : [])];
    const checks: Array<[string, string, boolean]> = [
      [
        'every API answered in every run',
        `${intakes.filter((r) => r.allAnswered).length} of ${intakes.length} runs; ${intakes.reduce((a, r) => a + r.non2xx, 0)} non-2xx, ${intakes.reduce((a, r) => a + r.errors, 0)} socket errors/timeouts`,
        intakes.every((r) => r.allAnswered && r.non2xx === 0 && r.errors === 0),
      ],
      [
        'every drain completed every job, none failed',
        drains.map((d) => `${d.workers}w: ${fmt(d.completedLogged)} of ${fmt(d.jobs)} completed, ${d.failed} failed`).join('; ') ||
          'no drain',
        drains.every((d) => d.completedLogged === d.jobs && d.failed === 0),
      ],
      ...(deep
        ? [
            [`${fmt(WAITING)} jobs waiting before the deep-queue intake run`, `${fmt(deep.counted)} counted`, deep.counted === WAITING] as [
              string,
              string,
              boolean,
            ],
          ]
        : []),
    ];

    const out: string[] = [
      `opsgate bench-scale, ${started.toISOString()} (wrk; one run per row; one Redis)`,
      sep,
      row(rows[0]!),
      sep,
      ...rows.slice(1).map(row),
      sep,
      `  intake: N APIs get N wrk processes at once (wrk drives one host:port), one per API, ${CONNECTIONS}/N connections each (at least ${MIN_CONNECTIONS_PER_API}: ${apiRuns.map((a) => `${a.apis} API${a.apis === 1 ? '' : 's'} x ${a.r.connectionsEach}`).join(', ') || 'none run'}); req/s summed over them, p99 the max of theirs; each API's req/s: ${apiRuns.map((a) => `${a.apis}: ${a.r.perApiRps.map((x) => fmt(x)).join('/')}`).join('; ') || '-'}`,
      `  x base: to the first row of its part (the fewest APIs, the fewest workers, the empty queue). process CPU us/req: all the APIs' (or workers') own CPU (/proc, all threads) over all the requests (or jobs); Redis ms/1k: Redis CPU (INFO cpu) per 1,000 requests (or jobs)`,
      ...(deep
        ? [
            `  deep queue: used_memory ${fmt(deep.memBefore / 1048576, 1)} -> ${fmt(deep.memAfter / 1048576, 1)} MB for ${fmt(WAITING)} jobs (BullMQ's job hashes, the wait list and its events stream, capped), queued with addBulk in 1,000s at ${fmt(deep.fillRate)} jobs/s; the drain got the same number of jobs queued again (the intake run adds deploy jobs of its own)`,
          ]
        : []),
      '',
      'checks:',
      ...checks.map(([name, measured, ok]) => `  ${ok ? 'PASS' : 'FAIL'}  ${name}: ${measured}`),
      '',
      `  machine: ${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? '?'}), node ${process.version}, load average before ${load0.map((x) => x.toFixed(2)).join('/')} after ${load1.map((x) => x.toFixed(2)).join('/')}`,
      `  settings: ${DURATION} s per measured run after ${WARMUP} s warm-up, Redis flushed before each; APIs as the chart runs them (V8 old ${CHART_HEAP_CAP_MB} / semi ${CHART_SEMI_SPACE_MB} MB, RATE_LIMIT_RPS=${RATE_LIMIT_RPS}), MALLOC_ARENA_MAX=${MALLOC_ARENA_MAX ?? 'unset'} for every process; workers with their default concurrency`,
    ];
    process.stdout.write(out.join('\n') + '\n');
    writeFileSync(join(ROOT, 'artifacts/bench-scale.txt'), out.join('\n') + '\n');
    writeFileSync(
      join(ROOT, 'artifacts/bench-scale.json'),
      JSON.stringify(
        {
          started: started.toISOString(),
          apiRuns,
          workerRuns,
          deep,
          checks,
          rows,
          loadavg: { before: load0, after: load1 },
          settings: { DURATION, WARMUP, JOBS, WAITING, APIS, WORKERS, CONNECTIONS, CHART_HEAP_CAP_MB, CHART_SEMI_SPACE_MB },
        },
        null,
        2,
      ) + '\n',
    );
    if (checks.some((c) => !c[2])) process.exitCode = 1;
  } finally {
    await stopAll(procs);
    await bounded(queue.close(), 10_000, 'closing the queue');
    conn.disconnect();
    admin.disconnect();
    await bounded(redis.destroy(), 10_000, 'stopping redis-server');
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench-scale failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
