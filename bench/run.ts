/**
 * `make bench`: throughput, latency and memory of the real built processes on loopback, in one
 * run, printed as one table plus the targets. Not part of `make test`.
 *
 * Load: wrk (C; bench/wrk.lua builds every request, the same stream for every server). The
 * servers are up for the whole HTTP part and measured interleaved, BENCH_ROUNDS (3) times, and
 * the table shows medians (ratios: the median of the per-round ratios, as the machine's load
 * drifts between rounds):
 * - bare Express 5 (bench/bareExpress.ts): express.json() and a 202;
 * - the spec-minimum control (bench/specMinimum.ts): Express + SET NX EX + BullMQ Queue.add,
 *   nothing else, from the same libraries (context: the cheapest intake in two round trips);
 * - the public-API floor (bench/publicFloor.ts): Express + one BullMQ Queue#add with
 *   deduplication per push, one Queue#addBulk with per-fingerprint deduplication per alert
 *   payload; no auth, audit, metrics or limiter: the cheapest intake on BullMQ's public API, the
 *   figure the intake targets are ratios to;
 * - the API (dist/src/server.js) as the chart runs it: the chart's api.maxOldSpaceSizeMb and
 *   api.maxSemiSpaceSizeMb, its production middleware, the rate limiter on with a limit never
 *   reached (RATE_LIMIT_RPS=1000000), stdout to a file as a container runtime takes it;
 * - the same API with REDIS_MIN_REPLICAS_ACK=1 (the cost of "acknowledged means replicated"), with one local replica of the bench's Redis (redis-server --replicaof on
 *   127.0.0.1, started and stopped here; FLUSHALL replicates, so it is flushed with the primary);
 *   unique pushes and alert payloads only (a duplicate writes nothing, so it has nothing to WAIT for);
 * - the same API in the upgrade window: the 25 h after an upgrade from version 0.1, when the intake
 *   also reads that version's record of each event (src/domain/intake.ts); its own row, not a target.
 * - with BENCH_BASELINE (`make bench-compare BASE=<commit>`): the API built from another commit, in the
 *   same rounds, unique pushes and duplicates: the change of the push path's cost between the two,
 *   measured as one run's per-round ratios rather than two runs' (the machine's load moves between runs).
 * Every API is given its intake's state before its first push: the rows above are an installation
 * past that window (the state it spends all but its first day in), the upgrade row one inside it.
 * Scenarios: unique push events (a new checkout_sha per request), duplicates (one event), and
 * payloads of BENCH_ALERTS (1000) firing alerts with new fingerprints (BENCH_ALERT_CONNECTIONS
 * connections, and one at a time: the latency of one payload, which the alert targets are about).
 * In each round, right after the one-at-a-time alert runs, BullMQ's Queue.addBulk of the same
 * jobs from this process, nothing else: the addBulk floor under the alert target, measured beside it.
 * Redis is flushed before each run; Redis cost = Redis CPU (INFO cpu) per 1,000 requests;
 * RSS sampled from /proc every 100 ms (max).
 * Worker (dist/worker/index.js): BENCH_JOBS (20,000) notify_oncall jobs (no NOTIFY_WEBHOOK_URLS:
 * the cheapest real job) are queued while the queue is paused, then resumed: the drain rate.
 * Then 1,000 paced jobs: enqueue-to-start latency (job.processedOn - job.timestamp).
 *
 * Targets, each against a figure measured in the same run (a fixed figure would move with the
 * machine and its load; the floor and addBulk on the same machine and Redis move with them):
 * - unique intake req/s >= 0.75 x the public-API floor's; duplicates >= 0.75 x the floor's;
 * - p99 at BENCH_CONNECTIONS <= 2 x the floor's p99 in the same round, unique and duplicates;
 * - a BENCH_ALERTS-alert payload one at a time: API p50 <= 1.5 x addBulk's p50, per round;
 * - API RSS <= 150 MB under each load (unique, duplicates, alert payloads at BENCH_ALERT_CONNECTIONS)
 *   with the chart's heap settings;
 * - every server answered in every run; the worker drains >= 4,000 jobs/s, all completed.
 * BENCH_STRICT=1: exit non-zero when one is missed.
 */
import { Queue, Job } from 'bullmq';
import { Redis } from 'ioredis';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join, relative, resolve } from 'node:path';
import { JOB, QUEUE_NAME } from '../src/shared/jobs.js';
import { INTAKE_SINCE_KEY } from '../src/shared/keys.js';
import { LEGACY_WINDOW_MS } from '../src/domain/intake.js';
import { startRedis, type RedisServer } from '../test/helpers/redis.js';
import { startReplica } from '../test/helpers/redisTopology.js';
import {
  addNotifyJobs,
  apiEnv,
  BENCH_JOB_OPTIONS,
  CHART_HEAP_CAP_MB,
  CHART_SEMI_SPACE_MB,
  chartHeapArgs,
  countLines,
  drainedWithin,
  fmt,
  JOB_COMPLETED,
  log,
  MALLOC_ARENA_MAX,
  median,
  notifyData,
  percentile,
  processCpuMs,
  redisCpuMs,
  ROOT,
  rssSampler,
  runWrk,
  SCM_SECRET,
  sleep,
  startWorkerProcess,
  startServer as startServer_,
  type Proc,
} from './support.js';

const DURATION = Number(process.env.BENCH_DURATION ?? 8);
const ALERTS_PER_PAYLOAD = Number(process.env.BENCH_ALERTS ?? 1000);
const ALERT_CONNECTIONS = Number(process.env.BENCH_ALERT_CONNECTIONS ?? 2);
const WARMUP = Number(process.env.BENCH_WARMUP ?? 2);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 64);
const JOBS = Number(process.env.BENCH_JOBS ?? 20000);
const LATENCY_JOBS = Number(process.env.BENCH_LATENCY_JOBS ?? 1000);
const RATE_LIMIT_RPS = process.env.BENCH_RATE_LIMIT_RPS ?? '1000000';
const WORKER_CONCURRENCY = process.env.BENCH_WORKER_CONCURRENCY; // unset: the worker's default
/** Extra node flags for the API process, e.g. "--cpu-prof --cpu-prof-dir=artifacts/prof" (profiling). */
const API_NODE_ARGS = (process.env.BENCH_API_NODE_ARGS ?? '').split(' ').filter(Boolean);
const HEAP_CAP_MB = Number(process.env.BENCH_HEAP_CAP_MB ?? CHART_HEAP_CAP_MB);
const SEMI_SPACE_MB = Number(process.env.BENCH_SEMI_SPACE_MB ?? CHART_SEMI_SPACE_MB);
const ROUNDS = Math.max(1, Number(process.env.BENCH_ROUNDS ?? 3));
/** A checkout of another commit, built (its dist/src/server.js), its name for the table. */
const BASELINE = process.env.BENCH_BASELINE;
const BASELINE_NAME = process.env.BENCH_BASELINE_NAME ?? 'baseline';
const WORKER_NODE_ARGS = (process.env.BENCH_WORKER_NODE_ARGS ?? '').split(' ').filter(Boolean);

// ---------------------------------------------------------------- HTTP load (wrk)

interface LoadFigures {
  rps: number;
  p50: number;
  p99: number;
  total: number;
  non2xx: number;
  errors: number;
  rssMb: number;
  /** Redis CPU per 1,000 requests (ms), from INFO cpu. */
  redisMsPer1k: number;
  /** The server process's own CPU (user + sys, every thread) per request, in us: what a request costs it, whatever else loads the machine. */
  cpuUsPerReq: number;
}

/** alerts1: the same alert payloads, one at a time (one connection): the latency of one payload. */
type Mode = 'unique' | 'dup' | 'alerts' | 'alerts1';

async function load(
  name: string,
  url: string,
  mode: Mode,
  pid: number,
  admin: Redis,
  token: string,
  opts: { warm: boolean; connections: number; seconds: number },
): Promise<LoadFigures> {
  const env = {
    BENCH_MODE: mode === 'alerts1' ? 'alerts' : mode,
    BENCH_PREFIX: `${name}-${Date.now().toString(36)}`,
    BENCH_TOKEN: token,
    BENCH_ALERTS: String(ALERTS_PER_PAYLOAD),
  };
  if (opts.warm) {
    log(`${name} ${mode}: warm-up ${WARMUP}s`);
    await runWrk(url, env, opts.connections, WARMUP);
  }
  await admin.flushall(); // every run starts from an empty Redis (the queue would grow by ~1M jobs otherwise)
  if (mode === 'dup') await runWrk(url, env, 1, 1); // the event is seen before the measured run
  log(`${name} ${mode}: ${opts.seconds}s at ${opts.connections} connections`);
  const cpu0 = await redisCpuMs(admin);
  const own0 = processCpuMs(pid);
  const rss = rssSampler(pid);
  const r = await runWrk(url, env, opts.connections, opts.seconds);
  const maxRss = rss.stop();
  const own1 = processCpuMs(pid);
  const cpu1 = await redisCpuMs(admin);
  // No answer within the run: no figures (never a flattering 0 ms).
  const none = r.requests === 0;
  return {
    rps: r.requests / (r.duration_us / 1e6),
    p50: none ? NaN : r.p50_us / 1000,
    p99: none ? NaN : r.p99_us / 1000,
    total: r.requests,
    non2xx: r.non2xx,
    errors: r.socket_errors + r.timeouts,
    rssMb: maxRss,
    redisMsPer1k: r.requests > 0 ? ((cpu1 - cpu0) / r.requests) * 1000 : NaN,
    cpuUsPerReq: r.requests > 0 ? ((own1 - own0) / r.requests) * 1000 : NaN,
  };
}

/** Median of every figure over the rounds (counts summed, RSS max). */
function medianFigures(runs: LoadFigures[]): LoadFigures {
  return {
    rps: median(runs.map((f) => f.rps)),
    p50: median(runs.map((f) => f.p50)),
    p99: median(runs.map((f) => f.p99)),
    total: runs.reduce((a, f) => a + f.total, 0),
    non2xx: runs.reduce((a, f) => a + f.non2xx, 0),
    errors: runs.reduce((a, f) => a + f.errors, 0),
    rssMb: Math.max(...runs.map((f) => f.rssMb)),
    redisMsPer1k: median(runs.map((f) => f.redisMsPer1k)),
    cpuUsPerReq: median(runs.map((f) => f.cpuUsPerReq)),
  };
}

// ---------------------------------------------------------------- worker

/** One round of the addBulk floor: wall time per batch (p50, p99, max), req/s = batches per second of wall time, CPU per batch. */
interface BulkRound {
  rps: number;
  p50: number;
  p99: number;
  max: number;
  /** This process's CPU per batch (ms): BullMQ building and sending the jobs. */
  nodeCpuMs: number;
  /** Redis CPU per batch (ms), from INFO cpu. */
  redisCpuMs: number;
  batches: number;
}

/**
 * The addBulk floor under the alert-payload target: BullMQ's own Queue.addBulk of BENCH_ALERTS
 * notify_oncall jobs (one pipeline, the cheapest way BullMQ offers to add that many jobs), with
 * nothing else (no HTTP, no parsing, no dedup records), one batch at a time from this process.
 * Run in every round right after the alerts1 runs, so a drift of the machine's load hits it and
 * the API alike, with as many batches as the API answered payloads in that run (at least 10), so
 * the queue grows as it did under the API. Redis is flushed first, as before every run; one
 * unmeasured batch first (BullMQ loads its scripts on a new connection).
 */
async function addBulkRound(queue: Queue, admin: Redis, batches: number, firstJob: number): Promise<BulkRound> {
  await admin.flushall();
  const walls: number[] = [];
  const nodeCpu: number[] = [];
  const redisCpu: number[] = [];
  for (let b = 0; b <= batches; b++) {
    const jobs = Array.from({ length: ALERTS_PER_PAYLOAD }, (_, i) => ({
      name: JOB.notifyOncall,
      data: notifyData(firstJob + b * ALERTS_PER_PAYLOAD + i),
      opts: BENCH_JOB_OPTIONS,
    }));
    const r0 = await redisCpuMs(admin);
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    await queue.addBulk(jobs);
    const wall = performance.now() - t0;
    const c = process.cpuUsage(c0);
    const r1 = await redisCpuMs(admin);
    if (b === 0) continue;
    walls.push(wall);
    nodeCpu.push((c.user + c.system) / 1000);
    redisCpu.push(r1 - r0);
  }
  const sorted = [...walls].sort((x, y) => x - y);
  return {
    rps: walls.length / (walls.reduce((x, y) => x + y, 0) / 1000),
    p50: median(walls),
    p99: percentile(sorted, 99),
    max: sorted[sorted.length - 1]!,
    nodeCpuMs: median(nodeCpu),
    redisCpuMs: median(redisCpu),
    batches: walls.length,
  };
}

async function workerBench(redis: RedisServer, procs: Proc[]) {
  const conn = new Redis(redis.url, { maxRetriesPerRequest: null });
  const queue = new Queue(QUEUE_NAME, { connection: conn });
  try {
    await conn.flushall();
    await queue.pause();
    log(`worker: queueing ${JOBS} notify_oncall jobs (queue paused)`);
    await addNotifyJobs(queue, 0, JOBS);

    const workerLog = join(ROOT, 'artifacts/bench-worker.log');
    const worker = await startWorkerProcess(procs, 'worker', redis.url, workerLog, {
      concurrency: WORKER_CONCURRENCY,
      nodeArgs: WORKER_NODE_ARGS,
    });
    const rss = rssSampler(worker.child.pid!);
    log('worker: ready; resuming the queue');
    const t0 = performance.now();
    await queue.resume();
    await drainedWithin(queue, 600_000);
    const drainSeconds = (performance.now() - t0) / 1000;
    const counts = await queue.getJobCounts('failed', 'wait', 'active', 'delayed');

    log(`worker: enqueue-to-start latency over ${LATENCY_JOBS} paced jobs`);
    const ids: string[] = [];
    for (let i = 0; i < LATENCY_JOBS; i++) {
      const job = await queue.add(JOB.notifyOncall, notifyData(JOBS + i), BENCH_JOB_OPTIONS);
      ids.push(job.id!);
      await sleep(2);
    }
    await drainedWithin(queue, 120_000);
    const workerRss = rss.stop();
    const lat: number[] = [];
    for (const id of ids) {
      const j = await Job.fromId(queue, id);
      if (j?.processedOn && j.timestamp) lat.push(j.processedOn - j.timestamp);
    }
    lat.sort((a, b) => a - b);
    await worker.stop();
    const completedLogged = countLines(workerLog, JOB_COMPLETED);
    return {
      completedLogged,
      drainRate: JOBS / drainSeconds,
      drainSeconds,
      failed: counts.failed ?? 0,
      leftover: (counts.wait ?? 0) + (counts.active ?? 0) + (counts.delayed ?? 0),
      p50: percentile(lat, 50),
      p99: percentile(lat, 99),
      latencySamples: lat.length,
      rssMb: workerRss,
    };
  } finally {
    await queue.close();
    conn.disconnect();
  }
}

// ---------------------------------------------------------------- main

async function main() {
  const load0 = os.loadavg();
  const started = new Date();
  mkdirSync(join(ROOT, 'artifacts'), { recursive: true });
  const redis = await startRedis();
  const admin = new Redis(redis.url);
  let replica: Awaited<ReturnType<typeof startReplica>> | undefined;
  let bulkConn: Redis | undefined;
  let bulkQueue: Queue | undefined;
  const results: Record<string, unknown> = {};
  const procs: Proc[] = [];
  try {
    const startServer = (name: string, script: string, env: Record<string, string>, nodeArgs: string[] = [], logFile?: string) =>
      startServer_(procs, name, script, env, nodeArgs, logFile);
    // The servers, up for the whole HTTP part.
    const bare = await startServer('bare-express', 'dist/bench/bench/bareExpress.js', {});
    const control = await startServer('spec-minimum', 'dist/bench/bench/specMinimum.js', { REDIS_URL: redis.url });
    const publicFloor = await startServer('public-floor', 'dist/bench/bench/publicFloor.js', { REDIS_URL: redis.url });
    // The API as the chart runs it: the chart's heap caps, the rate limiter on with a limit never reached.
    const startApi = async (name: string, extraEnv: Record<string, string>, logName: string, script = 'dist/src/server.js') =>
      startServer(
        name,
        script,
        await apiEnv(redis.url, RATE_LIMIT_RPS, extraEnv),
        [...chartHeapArgs(HEAP_CAP_MB, SEMI_SPACE_MB), ...API_NODE_ARGS],
        join(ROOT, `artifacts/${logName}`),
      );
    const api = await startApi('api', {}, 'bench-api.log');
    // The same API waiting for one local replica before each 202.
    replica = await startReplica(redis.port);
    const apiAck = await startApi('api-ack', { REDIS_MIN_REPLICAS_ACK: '1' }, 'bench-api-ack.log');
    // The intake's state, set before an API's first push (it is read once per process):
    // steady: an installation past version 0.1's window (its records are not read);
    // upgrade: the 25 h after an upgrade from version 0.1, which read them with each event.
    const steady = () => Date.now() - LEGACY_WINDOW_MS - 3600_000;
    const upgrade = () => Date.now();
    const apiUpgrade = await startApi('api-upgrade', {}, 'bench-api-upgrade.log');
    const apiBase = BASELINE
      ? await startApi('api-baseline', {}, 'bench-api-baseline.log', relative(ROOT, join(resolve(BASELINE), 'dist/src/server.js')))
      : undefined;
    const servers: ReadonlyArray<{
      key: string;
      label: string;
      s: typeof bare;
      token: string;
      only?: readonly Mode[];
      intakeSince?: () => number;
    }> = [
      { key: 'bare', label: 'bare Express', s: bare, token: '' },
      { key: 'control', label: 'spec minimum (SET NX + Queue.add)', s: control, token: '' },
      { key: 'floor', label: 'public-API floor (Queue#add / addBulk with deduplication)', s: publicFloor, token: '' },
      {
        key: 'api',
        label: `opsgate API (${HEAP_CAP_MB === CHART_HEAP_CAP_MB && SEMI_SPACE_MB === CHART_SEMI_SPACE_MB ? 'chart' : 'heap'}: old ${HEAP_CAP_MB} / semi ${SEMI_SPACE_MB} MB, rate limit on)`,
        s: api,
        token: SCM_SECRET,
        intakeSince: steady,
      },
      {
        key: 'apiAck',
        label: 'opsgate API, REDIS_MIN_REPLICAS_ACK=1 (one local replica)',
        s: apiAck,
        token: SCM_SECRET,
        only: ['unique', 'alerts'],
        intakeSince: steady,
      },
      {
        key: 'apiUpgrade',
        label: 'opsgate API, upgrade window (reads version 0.1 records)',
        s: apiUpgrade,
        token: SCM_SECRET,
        only: ['unique', 'dup', 'alerts1'],
        intakeSince: upgrade,
      },
      ...(apiBase
        ? [
            {
              key: 'apiBase',
              label: `opsgate API built from ${BASELINE_NAME} (BENCH_BASELINE)`,
              s: apiBase,
              token: SCM_SECRET,
              only: ['unique', 'dup'] as const,
              intakeSince: steady,
            },
          ]
        : []),
    ];
    const runsMode = (sv: (typeof servers)[number], m: Mode) => !sv.only || sv.only.includes(m);
    const modes: Array<{ mode: Mode; label: string; connections: number; seconds: number }> = [
      { mode: 'unique', label: 'unique push events', connections: CONNECTIONS, seconds: DURATION },
      { mode: 'dup', label: 'duplicate push events', connections: CONNECTIONS, seconds: DURATION },
      {
        mode: 'alerts',
        label: `${fmt(ALERTS_PER_PAYLOAD)}-alert payloads (${ALERT_CONNECTIONS} connections)`,
        connections: ALERT_CONNECTIONS,
        seconds: DURATION,
      },
      { mode: 'alerts1', label: `${fmt(ALERTS_PER_PAYLOAD)}-alert payloads, one at a time`, connections: 1, seconds: DURATION },
    ];
    const runs: Record<string, LoadFigures[]> = {};
    const bulkRounds: BulkRound[] = [];
    bulkConn = new Redis(redis.url, { maxRetriesPerRequest: null });
    bulkQueue = new Queue(QUEUE_NAME, { connection: bulkConn });
    for (let r = 0; r < ROUNDS; r++) {
      log(`round ${r + 1}/${ROUNDS}`);
      for (const m of modes) {
        for (const sv of servers) {
          if (!runsMode(sv, m.mode)) continue;
          const k = `${sv.key}:${m.mode}`;
          if (r === 0 && m === modes.find((x) => runsMode(sv, x.mode)) && sv.intakeSince) {
            await admin.set(INTAKE_SINCE_KEY, String(sv.intakeSince()));
          }
          (runs[k] ??= []).push(
            await load(sv.key, sv.s.url, m.mode, sv.s.p.child.pid!, admin, sv.token, {
              warm: r === 0,
              connections: m.connections,
              seconds: m.seconds,
            }),
          );
        }
        if (m.mode === 'alerts1') {
          const batches = Math.max(10, runs['api:alerts1']![r]!.total);
          log(`addBulk floor: ${batches} batches of ${ALERTS_PER_PAYLOAD} jobs, one at a time`);
          bulkRounds.push(await addBulkRound(bulkQueue, admin, batches, r * 1e8));
        }
      }
    }
    await bulkQueue.close();
    bulkConn.disconnect();
    bulkQueue = bulkConn = undefined;
    for (const sv of servers) await sv.s.p.stop();
    await replica.destroy();
    replica = undefined;

    // The hand-written limiter against rate-limiter-flexible (Redis store +
    // in-memory insurance limiter), each alone in front of the smallest handler, interleaved.
    const limiters = [
      {
        key: 'hand',
        label: 'hand-written (src/middleware/rateLimit.ts)',
        s: await startServer('limiter-hand', 'dist/bench/bench/limiterApp.js', { REDIS_URL: redis.url, LIMITER: 'hand' }),
      },
      {
        key: 'rlf',
        label: 'rate-limiter-flexible (RateLimiterRedis + memory insurance)',
        s: await startServer('limiter-rlf', 'dist/bench/bench/limiterApp.js', { REDIS_URL: redis.url, LIMITER: 'rlf' }),
      },
    ];
    const limiterRuns: Record<string, LoadFigures[]> = {};
    for (let r = 0; r < ROUNDS; r++) {
      for (const l of limiters) {
        (limiterRuns[l.key] ??= []).push(
          await load(`limiter-${l.key}`, l.s.url, 'unique', l.s.p.child.pid!, admin, '', {
            warm: r === 0,
            connections: CONNECTIONS,
            seconds: DURATION,
          }),
        );
      }
    }
    for (const l of limiters) await l.s.p.stop();
    const apiLogLines = countLines(join(ROOT, 'artifacts/bench-api.log'));

    const w = await workerBench(redis, procs);
    const load1 = os.loadavg();

    // ------------------------------------------------------------ table
    const fig = (k: string) => medianFigures(runs[k]!);
    /** Median over rounds of the per-round ratio of a figure (the machine's load drifts between rounds); NaN when a round has none. */
    const medianRatio = (xs: number[], ys: number[]) => {
      const rs = xs.map((x, i) => x / ys[i]!);
      return rs.every(Number.isFinite) ? median(rs) : NaN;
    };
    const ratio = (a: string, b: string, pick: (f: LoadFigures) => number = (f) => f.rps) =>
      medianRatio(runs[a]!.map(pick), runs[b]!.map(pick));
    const bulk = {
      rps: median(bulkRounds.map((f) => f.rps)),
      p50: median(bulkRounds.map((f) => f.p50)),
      p99: median(bulkRounds.map((f) => f.p99)),
      max: Math.max(...bulkRounds.map((f) => f.max)),
      nodeCpuMs: median(bulkRounds.map((f) => f.nodeCpuMs)),
      redisCpuMs: median(bulkRounds.map((f) => f.redisCpuMs)),
      batches: bulkRounds.reduce((a, f) => a + f.batches, 0),
    };
    const bulkLabel = 'BullMQ Queue.addBulk alone (this process: no HTTP, no dedup)';
    const table: string[][] = [
      [
        'scenario',
        'server',
        'req/s',
        'x bare',
        'x control',
        'x floor',
        'p50 ms',
        'p99 ms',
        'RSS MB',
        'server CPU us/req',
        'Redis ms/1k req',
      ],
    ];
    for (const m of modes) {
      for (const sv of servers) {
        if (!runsMode(sv, m.mode)) continue;
        const k = `${sv.key}:${m.mode}`;
        const f = fig(k);
        table.push([
          m.label,
          sv.label,
          fmt(f.rps),
          sv.key === 'bare' ? '1.00' : fmt(ratio(k, `bare:${m.mode}`), 2),
          sv.key === 'bare' ? '-' : sv.key === 'control' ? '1.00' : fmt(ratio(k, `control:${m.mode}`), 2),
          sv.key === 'bare' || sv.key === 'control' ? '-' : sv.key === 'floor' ? '1.00' : fmt(ratio(k, `floor:${m.mode}`), 2),
          fmt(f.p50, 1),
          fmt(f.p99, 1),
          fmt(f.rssMb),
          fmt(f.cpuUsPerReq),
          sv.key === 'bare' ? '-' : fmt(f.redisMsPer1k, 1),
        ]);
      }
      if (m.mode === 'alerts1') {
        // Its "requests" are batches of the same jobs, its server CPU this process's per batch.
        table.push([
          m.label,
          bulkLabel,
          fmt(bulk.rps),
          '-',
          '-',
          '-',
          fmt(bulk.p50, 1),
          fmt(bulk.p99, 1),
          '-',
          fmt(bulk.nodeCpuMs * 1000),
          fmt(bulk.redisCpuMs * 1000, 1),
        ]);
      }
    }
    const vsFloor = (m: Mode) => ratio(`api:${m}`, `floor:${m}`);
    const p99VsFloor = (m: Mode) => ratio(`api:${m}`, `floor:${m}`, (f) => f.p99);
    // One payload's latency, so the runs that send one at a time (with two in flight, each would
    // also wait for the other's CPU on 2 cores); against addBulk's p50 in the same round.
    const alertsP50VsBulk = medianRatio(
      runs['api:alerts1']!.map((f) => f.p50),
      bulkRounds.map((f) => f.p50),
    );
    const heapOverridden = HEAP_CAP_MB !== CHART_HEAP_CAP_MB || SEMI_SPACE_MB !== CHART_SEMI_SPACE_MB;
    const heap = heapOverridden
      ? `heap old ${HEAP_CAP_MB} / semi ${SEMI_SPACE_MB} MB from BENCH_HEAP_CAP_MB / BENCH_SEMI_SPACE_MB, not the chart's ${CHART_HEAP_CAP_MB} / ${CHART_SEMI_SPACE_MB} MB`
      : `heap as the chart sets it: old ${HEAP_CAP_MB} / semi ${SEMI_SPACE_MB} MB`;
    const rssTarget = (m: Mode, what: string): [string, string, boolean] => {
      const v = fig(`api:${m}`).rssMb;
      return [`API RSS <= 150 MB, ${what} (${heap})`, `${fmt(v)} MB (max over rounds)`, v <= 150];
    };
    const vs = (r: number, a: number, b: number, unit: string, names = ['API', 'floor']) =>
      `${fmt(r, 2)} x (${names[0]} ${fmt(a, unit === 'ms' ? 1 : 0)} ${unit}, ${names[1]} ${fmt(b, unit === 'ms' ? 1 : 0)} ${unit})`;
    const runsWithoutAnswers = Object.entries(runs)
      .filter(([, rs]) => rs.some((f) => f.total === 0))
      .map(([k]) => k);
    const alerts = `${fmt(ALERTS_PER_PAYLOAD)}-alert payload one at a time`;
    const targets: Array<[string, string, boolean]> = [
      [
        `unique intake >= 0.75 x the public-API floor's req/s (${CONNECTIONS} connections)`,
        vs(vsFloor('unique'), fig('api:unique').rps, fig('floor:unique').rps, 'req/s'),
        vsFloor('unique') >= 0.75,
      ],
      [
        `duplicate intake >= 0.75 x the floor's req/s (${CONNECTIONS} connections)`,
        vs(vsFloor('dup'), fig('api:dup').rps, fig('floor:dup').rps, 'req/s'),
        vsFloor('dup') >= 0.75,
      ],
      [
        `API p99 <= 2 x the floor's p99 (unique, ${CONNECTIONS} connections)`,
        vs(p99VsFloor('unique'), fig('api:unique').p99, fig('floor:unique').p99, 'ms'),
        p99VsFloor('unique') <= 2,
      ],
      [
        `API p99 <= 2 x the floor's p99 (duplicates, ${CONNECTIONS} connections)`,
        vs(p99VsFloor('dup'), fig('api:dup').p99, fig('floor:dup').p99, 'ms'),
        p99VsFloor('dup') <= 2,
      ],
      [
        `${alerts}: API p50 <= 1.5 x Queue.addBulk p50 of the same ${fmt(ALERTS_PER_PAYLOAD)} jobs`,
        vs(alertsP50VsBulk, fig('api:alerts1').p50, bulk.p50, 'ms', ['API p50', 'addBulk p50']),
        alertsP50VsBulk <= 1.5,
      ],
      rssTarget('unique', `unique pushes at ${CONNECTIONS} connections`),
      rssTarget('dup', `duplicates at ${CONNECTIONS} connections`),
      rssTarget('alerts', `${fmt(ALERTS_PER_PAYLOAD)}-alert payloads at ${ALERT_CONNECTIONS} connections`),
      [
        'every server answered in every run',
        runsWithoutAnswers.length ? `none from ${runsWithoutAnswers.join(', ')}` : 'yes',
        runsWithoutAnswers.length === 0,
      ],
      [
        'worker drain >= 4,000 jobs/s',
        `${fmt(w.drainRate)} jobs/s (${fmt(JOBS)} in ${fmt(w.drainSeconds, 2)} s)`,
        w.drainRate >= 4000 && w.failed === 0 && w.leftover === 0 && w.completedLogged === JOBS + LATENCY_JOBS,
      ],
    ];
    const widths = table[0]!.map((_, i) => Math.max(...table.map((r) => r[i]!.length)));
    const row = (r: string[]) => '| ' + r.map((c, i) => (i >= 2 ? c.padStart(widths[i]!) : c.padEnd(widths[i]!))).join(' | ') + ' |';
    const sep = '+' + widths.map((wd) => '-'.repeat(wd + 2)).join('+') + '+';
    const out: string[] = [];
    out.push(
      `opsgate bench, ${started.toISOString()} (wrk, ${ROUNDS} interleaved rounds, medians; ratios are medians of per-round ratios)`,
    );
    out.push(sep, row(table[0]!), sep, ...table.slice(1).map(row), sep);
    out.push(
      `  ${bulkLabel}: the addBulk floor under the alert target, ${fmt(ALERTS_PER_PAYLOAD)} notify_oncall jobs per batch, one batch at a time, in each round right after the one-at-a-time alert runs (as many batches as the API answered payloads there, at least 10): p50 ${fmt(bulk.p50, 1)} ms, p99 ${fmt(bulk.p99, 1)} ms, max ${fmt(bulk.max, 1)} ms, per batch ${fmt(bulk.nodeCpuMs, 1)} ms Node CPU + ${fmt(bulk.redisCpuMs, 1)} ms Redis CPU (medians over rounds; ${bulk.batches} batches)`,
    );
    const lt: string[][] = [['rate limiter alone (unique pushes)', 'req/s', 'p50 ms', 'p99 ms', 'RSS MB', 'Redis ms/1k req']];
    for (const l of limiters) {
      const f = medianFigures(limiterRuns[l.key]!);
      lt.push([l.label, fmt(f.rps), fmt(f.p50, 1), fmt(f.p99, 1), fmt(f.rssMb), fmt(f.redisMsPer1k, 1)]);
    }
    const lw = lt[0]!.map((_, i) => Math.max(...lt.map((r) => r[i]!.length)));
    const lrow = (r: string[]) => '| ' + r.map((c, i) => (i >= 1 ? c.padStart(lw[i]!) : c.padEnd(lw[i]!))).join(' | ') + ' |';
    const lsep = '+' + lw.map((wd) => '-'.repeat(wd + 2)).join('+') + '+';
    const handVsRlf = median(limiterRuns.hand!.map((f, i) => f.rps / limiterRuns.rlf![i]!.rps));
    out.push('', lsep, lrow(lt[0]!), lsep, ...lt.slice(1).map(lrow), lsep);
    out.push(
      `  hand-written / rate-limiter-flexible: ${fmt(handVsRlf, 2)} x req/s (median of per-round ratios). Each is one Redis round trip of its own per request, in front of the routes.`,
    );
    out.push('', 'targets (ratio: median of the per-round ratios; figures: medians over rounds):');
    for (const [name, measured, ok] of targets) out.push(`  ${ok ? 'PASS' : 'FAIL'}  ${name}: ${measured}`);
    // What the intake ratios are made of: on a shared machine req/s follows the CPU a request costs
    // the server and Redis together, and a payload's p99 addBulk's own tail.
    const cpuPerReq = (f: LoadFigures) => f.cpuUsPerReq + f.redisMsPer1k;
    out.push(
      '',
      'context (not targets; same rounds):',
      ...(['unique', 'dup'] as const).flatMap((m) => {
        const what = m === 'unique' ? 'unique pushes' : 'duplicates';
        const to = (key: 'floor' | 'control', name: string) =>
          `${name} ${fmt(ratio(`api:${m}`, `${key}:${m}`, cpuPerReq), 2)} x (API ${fmt(cpuPerReq(fig(`api:${m}`)))} us, ${name} ${fmt(cpuPerReq(fig(`${key}:${m}`)))} us)`;
        return [
          `  ${what}: API / spec-minimum control: req/s ${vs(ratio(`api:${m}`, `control:${m}`), fig(`api:${m}`).rps, fig(`control:${m}`).rps, 'req/s', ['API', 'control'])}; p99 ${vs(
            ratio(`api:${m}`, `control:${m}`, (f) => f.p99),
            fig(`api:${m}`).p99,
            fig(`control:${m}`).p99,
            'ms',
            ['API', 'control'],
          )}`,
          `  ${what}: CPU per request, server + Redis, API / ${to('floor', 'floor')}; API / ${to('control', 'control')}`,
        ];
      }),
      `  ${alerts}: API p99 / Queue.addBulk's p50: ${vs(
        medianRatio(
          runs['api:alerts1']!.map((f) => f.p99),
          bulkRounds.map((f) => f.p50),
        ),
        fig('api:alerts1').p99,
        bulk.p50,
        'ms',
        ['API p99', 'addBulk p50'],
      )}; API p50 / the floor's p50 (one Queue#addBulk with deduplication behind Express): ${vs(
        ratio('api:alerts1', 'floor:alerts1', (f) => f.p50),
        fig('api:alerts1').p50,
        fig('floor:alerts1').p50,
        'ms',
        ['API p50', 'floor p50'],
      )}`,
      `  ${alerts}: API p99 / Queue.addBulk's own p99: ${vs(
        medianRatio(
          runs['api:alerts1']!.map((f) => f.p99),
          bulkRounds.map((f) => f.p99),
        ),
        fig('api:alerts1').p99,
        bulk.p99,
        'ms',
        ['API p99', 'addBulk p99'],
      )}; addBulk's own p99 / its p50: ${fmt(bulk.p99 / bulk.p50, 2)} x`,
    );
    out.push(
      '',
      `  worker: drain ${fmt(w.drainRate)} jobs/s, enqueue-to-start p50 ${fmt(w.p50)} ms p99 ${fmt(w.p99)} ms (${w.latencySamples} paced jobs), RSS ${fmt(w.rssMb)} MB; ${w.completedLogged} "job completed" lines (expected ${JOBS + LATENCY_JOBS}), failed ${w.failed}, left ${w.leftover}`,
      ...modes
        .filter((m) => runs[`apiAck:${m.mode}`])
        .map((m) => {
          const a = fig(`apiAck:${m.mode}`);
          const p = fig(`api:${m.mode}`);
          return `  REDIS_MIN_REPLICAS_ACK=1 cost (${m.label}): ${fmt(ratio(`apiAck:${m.mode}`, `api:${m.mode}`), 2)} x the plain API's req/s (${fmt(p.rps)} -> ${fmt(a.rps)}), p50 ${fmt(p.p50, 1)} -> ${fmt(a.p50, 1)} ms, p99 ${fmt(p.p99, 1)} -> ${fmt(a.p99, 1)} ms; ${a.non2xx} non-2xx (503: WAIT timed out)`;
        }),
      // The 25 h after an upgrade from version 0.1: one more read (MGET) with each event, not a target.
      ...(['unique', 'dup'] as const).map(
        (m) =>
          `  upgrade window (version 0.1 records read), ${m === 'unique' ? 'unique pushes' : 'duplicates'}: ${vs(ratio(`apiUpgrade:${m}`, `floor:${m}`), fig(`apiUpgrade:${m}`).rps, fig(`floor:${m}`).rps, 'req/s', ['API', 'floor'])} the floor's req/s; ${fmt(ratio(`apiUpgrade:${m}`, `api:${m}`), 2)} x the steady API's; CPU per request, server + Redis, ${fmt(cpuPerReq(fig(`apiUpgrade:${m}`)))} us (steady API ${fmt(cpuPerReq(fig(`api:${m}`)))} us); RSS ${fmt(fig(`apiUpgrade:${m}`).rssMb)} MB`,
      ),
      // The same API built from another commit, in the same rounds: each round's ratio, so the spread shows.
      ...(runs['apiBase:unique']
        ? (['unique', 'dup'] as const).map((m) => {
            const per = (pick: (f: LoadFigures) => number) => runs[`api:${m}`]!.map((f, i) => pick(f) / pick(runs[`apiBase:${m}`]![i]!));
            const spread = (xs: number[]) => `${fmt(median(xs), 2)} x (rounds ${xs.map((x) => fmt(x, 2)).join(', ')})`;
            return `  this API / the API built from ${BASELINE_NAME}, ${m === 'unique' ? 'unique pushes' : 'duplicates'}: req/s ${spread(per((f) => f.rps))}; CPU per request, server + Redis, ${spread(per(cpuPerReq))} (${fmt(cpuPerReq(fig(`api:${m}`)))} us vs ${fmt(cpuPerReq(fig(`apiBase:${m}`)))} us); RSS ${fmt(fig(`api:${m}`).rssMb)} vs ${fmt(fig(`apiBase:${m}`).rssMb)} MB`;
          })
        : []),
      `  upgrade window, ${alerts}: API p50 / addBulk p50 ${vs(
        medianRatio(
          runs['apiUpgrade:alerts1']!.map((f) => f.p50),
          bulkRounds.map((f) => f.p50),
        ),
        fig('apiUpgrade:alerts1').p50,
        bulk.p50,
        'ms',
        ['API p50', 'addBulk p50'],
      )}`,
      `  errors/timeouts/non-2xx: ${servers
        .map(
          (sv) =>
            `${sv.key} ${modes
              .filter((m) => runsMode(sv, m.mode))
              .map((m) => {
                const f = fig(`${sv.key}:${m.mode}`);
                return `${f.errors}/${f.non2xx}`;
              })
              .join(',')}`,
        )
        .join('; ')}; API log lines ${apiLogLines}`,
      `  machine: ${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? '?'}), node ${process.version}, uptime load average before ${load0.map((x) => x.toFixed(2)).join('/')} after ${load1.map((x) => x.toFixed(2)).join('/')}`,
      `  settings: wrk ${CONNECTIONS} connections (${ALERT_CONNECTIONS}, and 1, for alert payloads), ${DURATION} s per run after ${WARMUP} s warm-up, RATE_LIMIT_RPS=${RATE_LIMIT_RPS}, MALLOC_ARENA_MAX=${MALLOC_ARENA_MAX ?? 'unset'} (the images' ENV) for every server, Redis flushed before each run; Redis ms/1k req = Redis CPU (INFO cpu, user+sys) per 1,000 requests; server CPU us/req = the server process's CPU (/proc, all threads) per request`,
    );
    process.stdout.write(out.join('\n') + '\n');
    Object.assign(results, {
      started: started.toISOString(),
      runs,
      limiterRuns,
      targets,
      addBulkFloor: { ...bulk, rounds: bulkRounds },
      worker: w,
      loadavg: { before: load0, after: load1 },
      settings: { CONNECTIONS, ALERT_CONNECTIONS, DURATION, WARMUP, ROUNDS, RATE_LIMIT_RPS, HEAP_CAP_MB, SEMI_SPACE_MB },
    });
    writeFileSync(join(ROOT, 'artifacts/bench.json'), JSON.stringify(results, null, 2) + '\n');
    writeFileSync(join(ROOT, 'artifacts/bench.txt'), out.join('\n') + '\n');
    if (targets.some((t) => !t[2]) && process.env.BENCH_STRICT === '1') process.exitCode = 1;
  } finally {
    for (const p of procs) await p.stop();
    await replica?.destroy();
    await bulkQueue?.close();
    bulkConn?.disconnect();
    admin.disconnect();
    await redis.destroy();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
