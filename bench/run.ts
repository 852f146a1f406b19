/**
 * `make bench`: throughput, latency and memory of the real built processes on loopback, in one
 * run, printed as one table with a pass/fail mark per target. Not part of `make test`.
 *
 * Phases (one private redis-server for the whole run):
 * 1. Baseline: bench/bareExpress.ts (Express 5, express.json(), 202 + small JSON) under
 *    autocannon, BENCH_CONNECTIONS (64) connections for BENCH_DURATION (10) s after a warm-up.
 *    Baseline, unique and duplicate loads run interleaved BENCH_ROUNDS (3) times; the table shows
 *    medians and the median of the per-round ratios (the machine's load drifts between runs).
 * 2. The API (dist/src/server.js) measured the same way on POST /webhook/scm:
 *    - unique events: every request carries a new checkout_sha -> dedup key SET NX + one job;
 *    - duplicates: the same event every time -> dedup hit, nothing enqueued.
 *    The load generator builds every request through the same function in all three runs, so its
 *    own cost is the same. RSS of the server is sampled from /proc every 100 ms (max reported).
 *    The API runs with its production middleware, including the Redis-backed rate limiter
 *    (RATE_LIMIT_RPS=1000000: every request pays the limiter's round trip, none is refused).
 *    Its stdout goes to a file. The unique run is repeated against an API whose V8 old space is
 *    capped (BENCH_HEAP_CAP_MB, default the chart's api.maxOldSpaceSizeMb), as the chart deploys it: on a big host V8
 *    lets garbage accumulate and RSS says more about V8's heuristics than about the service.
 * 3. Worker (dist/worker/index.js): BENCH_JOBS (20,000) ops_worker.notify_oncall jobs with no
 *    NOTIFY_WEBHOOK_URLS (a real job that logs the alert and completes: the cheapest real job,
 *    no bench-only code path in the worker) are queued while the queue is paused, then the queue
 *    is resumed and the time until the queue holds no waiting/active job is the drain (then the
 *    worker's log must show every "job completed").
 *    Then 1,000 jobs are added one by one, paced, to an idle worker: enqueue-to-start latency
 *    is job.processedOn - job.timestamp (both ms clocks of this machine).
 */
import autocannon, { type Result } from 'autocannon';
import { Queue, Job } from 'bullmq';
import { Redis } from 'ioredis';
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { defaultJobOptions, JOB, QUEUE_NAME } from '../src/shared/jobs.js';
import { freePort, startRedis, type RedisServer } from '../test/helpers/redis.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
const DURATION = Number(process.env.BENCH_DURATION ?? 10);
const WARMUP = Number(process.env.BENCH_WARMUP ?? 3);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 64);
const JOBS = Number(process.env.BENCH_JOBS ?? 20000);
const LATENCY_JOBS = Number(process.env.BENCH_LATENCY_JOBS ?? 1000);
const RATE_LIMIT_RPS = process.env.BENCH_RATE_LIMIT_RPS ?? '1000000';
const WORKER_CONCURRENCY = process.env.BENCH_WORKER_CONCURRENCY; // unset: the worker's default
/** Extra node flags for the API process, e.g. "--cpu-prof --cpu-prof-dir=artifacts/prof" (profiling). */
const API_NODE_ARGS = (process.env.BENCH_API_NODE_ARGS ?? '').split(' ').filter(Boolean);
// Default: the chart's api.maxOldSpaceSizeMb, so the capped row is the API as the chart deploys it.
const CHART_HEAP_CAP_MB = Number(/^api:[\s\S]*?^  maxOldSpaceSizeMb:\s*(\d+)/m.exec(readFileSync(join(ROOT, 'charts/opsgate/values.yaml'), 'utf8'))?.[1] ?? 96);
const HEAP_CAP_MB = Number(process.env.BENCH_HEAP_CAP_MB ?? CHART_HEAP_CAP_MB);
const CHART_SEMI_SPACE_MB = Number(/^api:[\s\S]*?^  maxSemiSpaceSizeMb:\s*(\d+)/m.exec(readFileSync(join(ROOT, 'charts/opsgate/values.yaml'), 'utf8'))?.[1] ?? 0);
const SEMI_SPACE_MB = Number(process.env.BENCH_SEMI_SPACE_MB ?? CHART_SEMI_SPACE_MB);
const ROUNDS = Math.max(1, Number(process.env.BENCH_ROUNDS ?? 3));
const WORKER_NODE_ARGS = (process.env.BENCH_WORKER_NODE_ARGS ?? '').split(' ').filter(Boolean);

const SCM_SECRET = 'bench-scm-secret-' + Math.random().toString(36).slice(2);
const API_KEY = 'bench-key-' + Math.random().toString(36).slice(2);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const log = (msg: string) => process.stderr.write(`[bench] ${msg}\n`);

// ---------------------------------------------------------------- processes

interface Proc {
  child: ChildProcess;
  onLine: (fn: (line: string) => void) => void;
  stop: () => Promise<void>;
}

/**
 * Spawns a node process. With `logFile`, its stdout goes straight to that file (as a container
 * runtime would take it): a pipe read by this process, which is also the load generator, would
 * throttle the server (Node writes to pipes synchronously) and measure our reading speed.
 */
function spawnNode(script: string, env: Record<string, string>, name: string, opts: { nodeArgs?: string[]; logFile?: string } = {}): Proc {
  const out = opts.logFile ? openSync(opts.logFile, 'w') : 'pipe';
  const child = spawn(process.execPath, [...(opts.nodeArgs ?? []), script], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', NODE_ENV: 'production', ...env },
    stdio: ['ignore', out, 'pipe'],
  });
  if (typeof out === 'number') closeSync(out);
  const listeners: Array<(line: string) => void> = [];
  let rest = '';
  child.stdout?.setEncoding('utf8');
  child.stdout?.on('data', (chunk: string) => {
    const parts = (rest + chunk).split('\n');
    rest = parts.pop() ?? '';
    for (const p of parts) for (const l of listeners) l(p);
  });
  let errTail = '';
  child.stderr!.setEncoding('utf8');
  child.stderr!.on('data', (c: string) => (errTail = (errTail + c).slice(-4000)));
  child.on('exit', (code, signal) => {
    if (code !== 0 && signal !== 'SIGTERM' && signal !== 'SIGKILL') log(`${name} exited code=${code} signal=${signal}\n${errTail}`);
  });
  return {
    child,
    onLine: (fn) => listeners.push(fn),
    stop: () =>
      new Promise<void>((res) => {
        if (child.exitCode !== null || child.signalCode !== null) return res();
        const t = setTimeout(() => child.kill('SIGKILL'), 30_000);
        child.once('exit', () => {
          clearTimeout(t);
          res();
        });
        child.kill('SIGTERM');
      }),
  };
}

function countLines(file: string, needle?: string): number {
  let n = 0;
  for (const line of readFileSync(file, 'utf8').split('\n')) if (line && (!needle || line.includes(needle))) n++;
  return n;
}

async function waitHttp(url: string, proc: Proc, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (proc.child.exitCode !== null) throw new Error(`process for ${url} exited early`);
    try {
      const r = await fetch(url);
      if (r.ok) return;
    } catch {
      /* not yet */
    }
    await sleep(100);
  }
  throw new Error(`${url} not ready after ${timeoutMs} ms`);
}

function rssMb(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : NaN;
  } catch {
    return NaN;
  }
}

function rssSampler(pid: number) {
  let max = 0;
  const t = setInterval(() => {
    const v = rssMb(pid);
    if (v > max) max = v;
  }, 100);
  return {
    stop: () => {
      clearInterval(t);
      const v = rssMb(pid);
      return Math.max(max, Number.isNaN(v) ? 0 : v);
    },
  };
}

/** Peak V8 heap in use, from the process's own /metrics (prom-client default metrics), sampled each second. */
function heapSampler(metricsUrl: string) {
  let maxUsed = 0;
  let maxTotal = 0;
  const t = setInterval(() => {
    fetch(metricsUrl)
      .then((r) => r.text())
      .then((text) => {
        const used = Number(/^nodejs_heap_size_used_bytes (\S+)/m.exec(text)?.[1] ?? NaN) / 2 ** 20;
        const total = Number(/^nodejs_heap_size_total_bytes (\S+)/m.exec(text)?.[1] ?? NaN) / 2 ** 20;
        if (used > maxUsed) maxUsed = used;
        if (total > maxTotal) maxTotal = total;
      })
      .catch(() => undefined);
  }, 1000);
  return {
    stop: () => {
      clearInterval(t);
      return { usedMb: maxUsed, totalMb: maxTotal };
    },
  };
}

// ---------------------------------------------------------------- HTTP load

interface LoadFigures {
  rps: number;
  p50: number;
  p99: number;
  total: number;
  non2xx: number;
  errors: number;
  statuses: string;
  rssMb: number;
  heapUsedMb: number;
  heapTotalMb: number;
}

function scmBody(sha: string): string {
  return JSON.stringify({ ref: 'refs/heads/main', project: { path_with_namespace: 'bench/app' }, checkout_sha: sha });
}

let seq = 0;
/** The one request builder for all runs: unique events get a new sha each time; duplicates the same one. */
function builder(path: string, headers: Record<string, string>, unique: boolean, fixedSha: string) {
  return (req: { method?: string; path?: string; headers?: Record<string, string>; body?: string | Buffer }) => {
    const sha = unique ? `${fixedSha}-${(++seq).toString(16)}` : fixedSha;
    req.method = 'POST';
    req.path = path;
    req.headers = headers;
    req.body = scmBody(sha);
    return req;
  };
}

async function load(name: string, url: string, path: string, headers: Record<string, string>, unique: boolean, pid: number, metricsUrl?: string, warm = true): Promise<LoadFigures> {
  const fixed = `${name}-${Date.now().toString(16)}`;
  const opts = (duration: number) => ({
    url,
    connections: CONNECTIONS,
    duration,
    timeout: 10,
    requests: [{ setupRequest: builder(path, headers, unique, fixed) }],
  });
  if (warm) {
    log(`${name}: warm-up ${WARMUP}s`);
    await autocannon(opts(WARMUP));
  }
  log(`${name}: ${DURATION}s at ${CONNECTIONS} connections`);
  const rss = rssSampler(pid);
  const heap = metricsUrl ? heapSampler(metricsUrl) : undefined;
  const r: Result = await autocannon(opts(DURATION));
  const maxRss = rss.stop();
  const heapPeak = heap?.stop();
  const statuses = Object.entries(r.statusCodeStats ?? {})
    .map(([code, s]) => `${code}x${s.count}`)
    .join(' ');
  return {
    rps: r.requests.average,
    p50: r.latency.p50,
    p99: r.latency.p99,
    total: r.requests.total,
    non2xx: r.non2xx,
    errors: r.errors + r.timeouts,
    statuses,
    rssMb: maxRss,
    heapUsedMb: heapPeak?.usedMb ?? NaN,
    heapTotalMb: heapPeak?.totalMb ?? NaN,
  };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** Median of every figure over the rounds (statuses/errors summed). */
function medianFigures(runs: LoadFigures[]): LoadFigures {
  return {
    rps: median(runs.map((f) => f.rps)),
    p50: median(runs.map((f) => f.p50)),
    p99: median(runs.map((f) => f.p99)),
    total: runs.reduce((a, f) => a + f.total, 0),
    non2xx: runs.reduce((a, f) => a + f.non2xx, 0),
    errors: runs.reduce((a, f) => a + f.errors, 0),
    statuses: runs.map((f) => f.statuses).join(', '),
    rssMb: Math.max(...runs.map((f) => f.rssMb)),
    heapUsedMb: Math.max(...runs.map((f) => f.heapUsedMb)),
    heapTotalMb: Math.max(...runs.map((f) => f.heapTotalMb)),
  };
}

// ---------------------------------------------------------------- worker

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i]!;
}

function notifyData(i: number) {
  return {
    alertname: 'BenchNoop',
    annotations: { summary: `bench job ${i}` },
    fingerprint: `bench-${i}`,
    audit_id: `bench-${i}`,
    requested_by: 'bench',
  };
}

async function workerBench(redis: RedisServer) {
  const conn = new Redis(redis.url, { maxRetriesPerRequest: null });
  const queue = new Queue(QUEUE_NAME, { connection: conn });
  await conn.flushall();
  await queue.pause();
  const opts = defaultJobOptions({ attempts: 5, backoffMs: 10000 });
  log(`worker: queueing ${JOBS} notify_oncall jobs (queue paused)`);
  for (let i = 0; i < JOBS; i += 1000) {
    const n = Math.min(1000, JOBS - i);
    await queue.addBulk(Array.from({ length: n }, (_, k) => ({ name: JOB.notifyOncall, data: notifyData(i + k), opts })));
  }

  const env: Record<string, string> = {
    REDIS_URL: redis.url,
    METRICS_PORT: String(await freePort()),
    LOG_LEVEL: 'info',
    JOB_ATTEMPTS: '5',
  };
  if (WORKER_CONCURRENCY) env.WORKER_CONCURRENCY = WORKER_CONCURRENCY;
  const workerLog = join(ROOT, 'artifacts/bench-worker.log');
  const worker = spawnNode(join(ROOT, 'dist/worker/index.js'), env, 'worker', { logFile: workerLog, nodeArgs: WORKER_NODE_ARGS });
  const pending = async () => {
    const c = await queue.getJobCounts('waiting', 'active', 'delayed', 'prioritized');
    return Object.values(c).reduce((a, b) => a + (b ?? 0), 0);
  };
  const drainedWithin = async (timeoutMs: number) => {
    const deadline = Date.now() + timeoutMs;
    while ((await pending()) > 0) {
      if (Date.now() > deadline) throw new Error(`queue not drained within ${timeoutMs} ms`);
      await sleep(20);
    }
  };
  const readyBy = Date.now() + 30_000;
  while (!readFileSync(workerLog, 'utf8').includes('"msg":"worker ready"')) {
    if (Date.now() > readyBy || worker.child.exitCode !== null) throw new Error('worker not ready in 30 s');
    await sleep(100);
  }
  const rss = rssSampler(worker.child.pid!);
  log('worker: ready; resuming the queue');
  const t0 = performance.now();
  await queue.resume();
  await drainedWithin(600_000);
  const drainSeconds = (performance.now() - t0) / 1000;
  const counts = await queue.getJobCounts('failed', 'wait', 'active', 'delayed');

  log(`worker: enqueue-to-start latency over ${LATENCY_JOBS} paced jobs`);
  const ids: string[] = [];
  for (let i = 0; i < LATENCY_JOBS; i++) {
    const job = await queue.add(JOB.notifyOncall, notifyData(JOBS + i), opts);
    ids.push(job.id!);
    await sleep(2);
  }
  await drainedWithin(120_000);
  const workerRss = rss.stop();
  const lat: number[] = [];
  for (const id of ids) {
    const j = await Job.fromId(queue, id);
    if (j?.processedOn && j.timestamp) lat.push(j.processedOn - j.timestamp);
  }
  lat.sort((a, b) => a - b);
  await worker.stop();
  const completedLogged = countLines(workerLog, '"msg":"job completed"');
  await queue.close();
  conn.disconnect();
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
}

// ---------------------------------------------------------------- main

function fmt(n: number, digits = 0): string {
  return Number.isFinite(n) ? n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits }) : 'n/a';
}

async function main() {
  const load0 = os.loadavg();
  const started = new Date();
  mkdirSync(join(ROOT, 'artifacts'), { recursive: true });
  const redis = await startRedis();
  const results: Record<string, unknown> = {};
  const procs: Proc[] = [];
  try {
    // 1+2. bare Express and the API, both up for the whole HTTP part; the three loads are run
    // interleaved, ROUNDS times, and the medians reported: on a shared machine the load drifts
    // between runs, and a ratio is only meaningful between runs made close together.
    const barePort = await freePort();
    const bare = spawnNode(join(ROOT, 'dist/bench/bench/bareExpress.js'), { PORT: String(barePort) }, 'bare-express');
    procs.push(bare);
    const bareUrl = `http://127.0.0.1:${barePort}`;
    await new Promise<void>((res, rej) => {
      bare.onLine((l) => l.includes('listening') && res());
      bare.child.once('exit', () => rej(new Error('bare express exited')));
    });
    const apiLog = join(ROOT, 'artifacts/bench-api.log');
    const scmHeaders = { 'content-type': 'application/json', 'x-scm-event': 'Push Hook', 'x-scm-token': SCM_SECRET };
    const startApi = async (nodeArgs: string[], logFile: string) => {
      const port = await freePort();
      const metricsPort = await freePort();
      const p = spawnNode(
        join(ROOT, 'dist/src/server.js'),
        {
          REDIS_URL: redis.url,
          PORT: String(port),
          METRICS_PORT: String(metricsPort),
          OPS_API_KEY_ROLES: `${API_KEY}:operator`,
          SCM_WEBHOOK_SECRET: SCM_SECRET,
          RATE_LIMIT_RPS,
          LOG_LEVEL: 'info',
          ADMIN_UI_ENABLED: 'false',
        },
        'api',
        { nodeArgs, logFile },
      );
      procs.push(p);
      const url = `http://127.0.0.1:${port}`;
      await waitHttp(`${url}/health`, p);
      return { p, url, metrics: `http://127.0.0.1:${metricsPort}/metrics` };
    };
    const api = await startApi(API_NODE_ARGS, apiLog);
    const bareRuns: LoadFigures[] = [];
    const uniqueRuns: LoadFigures[] = [];
    const dupRuns: LoadFigures[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      log(`round ${r + 1}/${ROUNDS}`);
      bareRuns.push(await load('bare-express', bareUrl, '/webhook/bare', { 'content-type': 'application/json' }, true, bare.child.pid!, undefined, r === 0));
      uniqueRuns.push(await load('scm-unique', api.url, '/webhook/scm', scmHeaders, true, api.p.child.pid!, api.metrics, r === 0));
      dupRuns.push(await load('scm-duplicate', api.url, '/webhook/scm', scmHeaders, false, api.p.child.pid!, api.metrics, r === 0));
    }
    await bare.stop();
    const apiRss = Math.max(...uniqueRuns.map((f) => f.rssMb), ...dupRuns.map((f) => f.rssMb), rssMb(api.p.child.pid!) || 0);
    await api.p.stop();
    const bareFig = medianFigures(bareRuns);
    const uniqueFig = medianFigures(uniqueRuns);
    const dupFig = medianFigures(dupRuns);
    const ratioU = median(uniqueRuns.map((f, i) => f.rps / bareRuns[i]!.rps));
    const ratioD = median(dupRuns.map((f, i) => f.rps / bareRuns[i]!.rps));
    const perRound = (runs: LoadFigures[]) => runs.map((f) => fmt(f.rps)).join(' / ');
    // The same unique-event load against an API whose V8 old space is capped at HEAP_CAP_MB, as a
    // container memory limit would size it (the chart's API limit is 384 MiB): on this 24 GB host
    // V8's default heap limit is several GB and it lets garbage pile up before collecting.
    const capped = await startApi([`--max-old-space-size=${HEAP_CAP_MB}`, ...(SEMI_SPACE_MB ? [`--max-semi-space-size=${SEMI_SPACE_MB}`] : []), ...API_NODE_ARGS], join(ROOT, 'artifacts/bench-api-capped.log'));
    const cappedFig = await load(`scm-unique-heap${HEAP_CAP_MB}`, capped.url, '/webhook/scm', scmHeaders, true, capped.p.child.pid!, capped.metrics);
    await capped.p.stop();
    const apiLogLines = countLines(apiLog);

    // 3. worker
    const w = await workerBench(redis);
    const load1 = os.loadavg();

    // ------------------------------------------------------------ table
    const pf = (ok: boolean) => (ok ? 'PASS' : 'FAIL');
    const rows: Array<[string, string, string, string]> = [
      ['bare Express 202 (baseline)', `${fmt(bareFig.rps)} req/s  p50 ${fmt(bareFig.p50, 1)} ms  p99 ${fmt(bareFig.p99, 1)} ms  RSS ${fmt(bareFig.rssMb)} MB`, '-', '-'],
      ['scm intake, unique events', `${fmt(uniqueFig.rps)} req/s = ${fmt(ratioU * 100, 1)}% of bare`, '>= 50% of bare', pf(ratioU >= 0.5)],
      ['scm intake, unique: latency', `p50 ${fmt(uniqueFig.p50, 1)} ms  p99 ${fmt(uniqueFig.p99, 1)} ms`, `p99 < 20 ms @${CONNECTIONS} conn`, pf(uniqueFig.p99 < 20)],
      ['scm intake, duplicates', `${fmt(dupFig.rps)} req/s = ${fmt(ratioD * 100, 1)}% of bare`, '>= 50% of bare', pf(ratioD >= 0.5)],
      ['scm intake, duplicates: latency', `p50 ${fmt(dupFig.p50, 1)} ms  p99 ${fmt(dupFig.p99, 1)} ms`, `p99 < 20 ms @${CONNECTIONS} conn`, pf(dupFig.p99 < 20)],
      ['API RSS under load (max)', `${fmt(apiRss)} MB (V8 heap peak: used ${fmt(Math.max(uniqueFig.heapUsedMb, dupFig.heapUsedMb))} MB of ${fmt(Math.max(uniqueFig.heapTotalMb, dupFig.heapTotalMb))} MB)`, '< 150 MB', pf(apiRss < 150)],
      [`  as deployed (V8 old ${HEAP_CAP_MB} / semi ${SEMI_SPACE_MB} MB)`, `${fmt(cappedFig.rssMb)} MB at ${fmt(cappedFig.rps)} req/s unique (${fmt((cappedFig.rps / bareFig.rps) * 100, 1)}% of bare), p99 ${fmt(cappedFig.p99, 1)} ms; heap peak ${fmt(cappedFig.heapUsedMb)} MB`, '< 150 MB', pf(cappedFig.rssMb < 150)],
      ['worker drain', `${fmt(w.drainRate)} jobs/s (${fmt(JOBS)} jobs in ${fmt(w.drainSeconds, 2)} s)`, '>= 2,000 jobs/s', pf(w.drainRate >= 2000 && w.failed === 0 && w.leftover === 0 && w.completedLogged === JOBS + LATENCY_JOBS)],
      ['enqueue-to-start latency', `p50 ${fmt(w.p50)} ms  p99 ${fmt(w.p99)} ms (${w.latencySamples} paced jobs)`, '-', '-'],
      ['worker RSS (max)', `${fmt(w.rssMb)} MB`, '-', '-'],
    ];
    if (ROUNDS > 1) {
      rows.splice(
        1,
        0,
        ['  per round (req/s)', `bare ${perRound(bareRuns)}`, '-', '-'],
        ['', `unique ${perRound(uniqueRuns)}`, '-', '-'],
        ['', `duplicates ${perRound(dupRuns)}`, '-', '-'],
      );
    }
    const checks = [
      `responses: bare ${bareFig.statuses}; unique ${uniqueFig.statuses}; duplicates ${dupFig.statuses}`,
      `errors/timeouts: bare ${bareFig.errors}, unique ${uniqueFig.errors}, duplicates ${dupFig.errors}; non-2xx: ${bareFig.non2xx}/${uniqueFig.non2xx}/${dupFig.non2xx}`,
      `worker: ${w.completedLogged} "job completed" log lines (expected ${JOBS + LATENCY_JOBS}), failed jobs ${w.failed}, left in queue ${w.leftover}; API log lines during the run ${apiLogLines} (stdout to a file, as a container runtime takes it)`,
      `machine: ${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? '?'}), node ${process.version}, load average before ${load0.map((x) => x.toFixed(2)).join('/')} after ${load1.map((x) => x.toFixed(2)).join('/')}`,
      `settings: ${CONNECTIONS} connections, ${DURATION} s per run after ${WARMUP} s warm-up, ${ROUNDS} interleaved rounds (medians; ratios per round), RATE_LIMIT_RPS=${RATE_LIMIT_RPS}, WORKER_CONCURRENCY=${WORKER_CONCURRENCY ?? 'default'}, load generator (autocannon) on the same machine`,
    ];
    const w0 = Math.max(...rows.map((r) => r[0].length));
    const w1 = Math.max(...rows.map((r) => r[1].length));
    const w2 = Math.max(...rows.map((r) => r[2].length));
    const line = `+${'-'.repeat(w0 + 2)}+${'-'.repeat(w1 + 2)}+${'-'.repeat(w2 + 2)}+------+`;
    const out: string[] = [];
    out.push(`opsgate bench, ${started.toISOString()}`);
    out.push(line);
    out.push(`| ${'measure'.padEnd(w0)} | ${'measured'.padEnd(w1)} | ${'target'.padEnd(w2)} | ok?  |`);
    out.push(line);
    for (const r of rows) out.push(`| ${r[0].padEnd(w0)} | ${r[1].padEnd(w1)} | ${r[2].padEnd(w2)} | ${r[3].padEnd(4)} |`);
    out.push(line);
    for (const c of checks) out.push(`  ${c}`);
    process.stdout.write(out.join('\n') + '\n');

    Object.assign(results, { started: started.toISOString(), rounds: { bare: bareRuns, unique: uniqueRuns, duplicate: dupRuns }, ratios: { unique: ratioU, duplicate: ratioD }, bare: bareFig, unique: uniqueFig, duplicate: dupFig, uniqueHeapCapped: cappedFig, apiRssMb: apiRss, worker: w, loadavg: { before: load0, after: load1 }, settings: { CONNECTIONS, DURATION, WARMUP, RATE_LIMIT_RPS, WORKER_CONCURRENCY: WORKER_CONCURRENCY ?? null } });
    mkdirSync(join(ROOT, 'artifacts'), { recursive: true });
    writeFileSync(join(ROOT, 'artifacts/bench.json'), JSON.stringify(results, null, 2) + '\n');
    writeFileSync(join(ROOT, 'artifacts/bench.txt'), out.join('\n') + '\n');
    const failed = rows.some((r) => r[3] === 'FAIL');
    if (failed && process.env.BENCH_STRICT === '1') process.exitCode = 1;
  } finally {
    for (const p of procs) await p.stop();
    await redis.destroy();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench failed: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  process.exit(1);
});
