/**
 * What `make bench` (bench/run.ts), `make bench-scale` (bench/scale.ts) and `make bench-profile`
 * (bench/profile.ts) share: the repo's root, the chart's and the images' runtime settings, spawning
 * the servers and the worker, wrk, CPU and memory readings, queueing and draining jobs.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, readFileSync, readSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { StringDecoder } from 'node:string_decoder';
import type { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { defaultJobOptions, JOB } from '../src/shared/jobs.js';
import { freePort } from '../test/helpers/redis.js';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');

// Default: the chart's api.maxOldSpaceSizeMb, so the capped row is the API as the chart deploys it.
export const CHART_HEAP_CAP_MB = Number(
  /^api:[\s\S]*?^ {2}maxOldSpaceSizeMb:\s*(\d+)/m.exec(readFileSync(join(ROOT, 'charts/opsgate/values.yaml'), 'utf8'))?.[1] ?? 96,
);

export const CHART_SEMI_SPACE_MB = Number(
  /^api:[\s\S]*?^ {2}maxSemiSpaceSizeMb:\s*(\d+)/m.exec(readFileSync(join(ROOT, 'charts/opsgate/values.yaml'), 'utf8'))?.[1] ?? 0,
);

// The images' glibc setting (Dockerfile ENV), so every server here runs as it would in the image.
export const MALLOC_ARENA_MAX = /MALLOC_ARENA_MAX=(\d+)/.exec(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'))?.[1];

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export const log = (msg: string) => process.stderr.write(`[bench] ${msg}\n`);

export interface Proc {
  child: ChildProcess;
  onLine: (fn: (line: string) => void) => void;
  stop: () => Promise<void>;
}

/**
 * Spawns a node process. With `logFile`, its stdout goes straight to that file (as a container
 * runtime would take it): a pipe read by this process, which is also the load generator, would
 * throttle the server (Node writes to pipes synchronously) and measure our reading speed.
 */
export function spawnNode(
  script: string,
  env: Record<string, string>,
  name: string,
  opts: { nodeArgs?: string[]; logFile?: string } = {},
): Proc {
  const out = opts.logFile ? openSync(opts.logFile, 'w') : 'pipe';
  const child = spawn(process.execPath, [...(opts.nodeArgs ?? []), script], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', NODE_ENV: 'production', ...(MALLOC_ARENA_MAX ? { MALLOC_ARENA_MAX } : {}), ...env },
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

/** CPU time (user + sys) a process has used so far, in ms (/proc/<pid>/stat, clock ticks of 10 ms). */
export function processCpuMs(pid: number): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return (Number(fields[11]) + Number(fields[12])) * 10;
  } catch {
    return NaN;
  }
}

export const WRK_LUA = join(ROOT, 'bench/wrk.lua');

export function runWrk(
  url: string,
  env: Record<string, string>,
  connections: number,
  seconds: number,
): Promise<{
  requests: number;
  duration_us: number;
  socket_errors: number;
  non2xx: number;
  timeouts: number;
  p50_us: number;
  p99_us: number;
}> {
  return new Promise((resolvePromise, reject) => {
    execFile(
      'wrk',
      ['-t', String(Math.min(2, connections)), '-c', String(connections), '-d', `${seconds}s`, '--timeout', '10s', '-s', WRK_LUA, url],
      { env: { ...process.env, ...env }, maxBuffer: 1 << 20 },
      (err, stdout, stderr) => {
        if (err) return reject(new Error(`wrk failed: ${err.message}\n${stderr}`));
        const line = stdout.split('\n').find((l) => l.startsWith('WRKJSON '));
        if (!line) return reject(new Error(`wrk printed no summary:\n${stdout}\n${stderr}`));
        resolvePromise(JSON.parse(line.slice('WRKJSON '.length)) as Awaited<ReturnType<typeof runWrk>>);
      },
    );
  });
}

export function fmt(n: number, digits = 0): string {
  return Number.isFinite(n) ? n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits }) : 'n/a';
}

/**
 * Starts a server script (PORT = a free port) and waits until it answers HTTP on 127.0.0.1
 * (any status), at most 30 s; the process is added to `procs` so the caller stops it.
 */
export async function startServer(
  procs: Proc[],
  name: string,
  script: string,
  env: Record<string, string>,
  nodeArgs: string[] = [],
  logFile?: string,
): Promise<{ p: Proc; url: string }> {
  const port = await freePort();
  const p = spawnNode(join(ROOT, script), { PORT: String(port), ...env }, name, { nodeArgs, logFile });
  procs.push(p);
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (p.child.exitCode !== null) throw new Error(`${name} exited early`);
    try {
      await fetch(url + '/');
      break;
    } catch {
      if (Date.now() > deadline) throw new Error(`${name} not listening after 30 s`);
      await sleep(100);
    }
  }
  return { p, url };
}

/** The API's credentials under load (new each run): wrk sends SCM_SECRET as the webhook token. */
export const SCM_SECRET = 'bench-scm-secret-' + Math.random().toString(36).slice(2);
const API_KEY = 'bench-key-' + Math.random().toString(36).slice(2);

/**
 * The API's environment as the benchmarks run it: production settings, its metrics on a free
 * port, the credentials above, the rate limiter on at `rateLimitRps` (a limit never reached:
 * its cost without its refusals), the admin UI off (the chart's default); `extra` on top.
 */
export async function apiEnv(redisUrl: string, rateLimitRps: string, extra: Record<string, string> = {}): Promise<Record<string, string>> {
  return {
    REDIS_URL: redisUrl,
    METRICS_PORT: String(await freePort()),
    OPS_API_KEY_ROLES: `${API_KEY}:operator`,
    SCM_WEBHOOK_SECRET: SCM_SECRET,
    RATE_LIMIT_RPS: rateLimitRps,
    LOG_LEVEL: 'info',
    ADMIN_UI_ENABLED: 'false',
    ...extra,
  };
}

/** The API's node flags as the chart runs it (its api.maxOldSpaceSizeMb / api.maxSemiSpaceSizeMb). */
export function chartHeapArgs(oldMb: number, semiMb: number): string[] {
  return [`--max-old-space-size=${oldMb}`, ...(semiMb ? [`--max-semi-space-size=${semiMb}`] : [])];
}

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i]!;
}

export function countLines(file: string, needle?: string): number {
  // Read in chunks: a log of many rounds outgrows the longest string Node can hold.
  const fd = openSync(file, 'r');
  const buf = Buffer.alloc(1 << 20);
  const decoder = new StringDecoder('utf8');
  const counts = (line: string) => line !== '' && (!needle || line.includes(needle));
  let rest = '';
  let n = 0;
  try {
    for (let got = readSync(fd, buf); got > 0; got = readSync(fd, buf)) {
      const lines = (rest + decoder.write(buf.subarray(0, got))).split('\n');
      rest = lines.pop() ?? '';
      for (const line of lines) if (counts(line)) n++;
    }
  } finally {
    closeSync(fd);
  }
  return counts(rest + decoder.end()) ? n + 1 : n;
}

function rssMb(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : NaN;
  } catch {
    return NaN;
  }
}

/** A process's RSS sampled from /proc every 100 ms; stop() gives the max, in MB. */
export function rssSampler(pid: number) {
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

/**
 * Redis CPU (user + sys) in ms, from INFO cpu. (INFO commandstats would count a script twice:
 * its EVALSHA and every command it calls are listed with their own usec, so a path made of
 * scripts would look dearer than it is.)
 */
export async function redisCpuMs(r: Redis): Promise<number> {
  const text = await r.info('cpu');
  const user = Number(/used_cpu_user:([\d.]+)/.exec(text)?.[1] ?? NaN);
  const sys = Number(/used_cpu_sys:([\d.]+)/.exec(text)?.[1] ?? NaN);
  return (user + sys) * 1000;
}

/** The data of bench job `i`: a notify_oncall job (no NOTIFY_WEBHOOK_URLS: the cheapest real job). */
export function notifyData(i: number) {
  return {
    alertname: 'BenchNoop',
    annotations: { summary: `bench job ${i}` },
    fingerprint: `bench-${i}`,
    audit_id: `bench-${i}`,
    requested_by: 'bench',
  };
}

export const BENCH_JOB_OPTIONS = defaultJobOptions({ attempts: 5, backoffMs: 10000 });

/** Queues `count` notify_oncall jobs (data numbered from `from`) with Queue.addBulk, 1,000 per call. */
export async function addNotifyJobs(queue: Queue, from: number, count: number): Promise<void> {
  for (let i = 0; i < count; i += 1000) {
    const n = Math.min(1000, count - i);
    await queue.addBulk(
      Array.from({ length: n }, (_, k) => ({ name: JOB.notifyOncall, data: notifyData(from + i + k), opts: BENCH_JOB_OPTIONS })),
    );
  }
}

/** Jobs not finished yet: waiting, active, delayed, prioritized. */
export async function pendingJobs(queue: Queue): Promise<number> {
  const c = await queue.getJobCounts('waiting', 'active', 'delayed', 'prioritized');
  return Object.values(c).reduce((a, b) => a + (b ?? 0), 0);
}

export async function drainedWithin(queue: Queue, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while ((await pendingJobs(queue)) > 0) {
    if (Date.now() > deadline) throw new Error(`queue not drained within ${timeoutMs} ms`);
    await sleep(20);
  }
}

/** The worker's log line once it takes jobs (worker/index.ts READY_MESSAGE). */
export const WORKER_READY = '"msg":"worker ready"';
export const JOB_COMPLETED = '"msg":"job completed"';

/**
 * Starts the built worker (dist/worker/index.js) on `redisUrl`, its stdout to `logFile`, and
 * resolves once it logs that it is ready (30 s at most); the process is added to `procs` so the
 * caller stops it, ready or not.
 */
export async function startWorkerProcess(
  procs: Proc[],
  name: string,
  redisUrl: string,
  logFile: string,
  opts: { concurrency?: string; nodeArgs?: string[] } = {},
): Promise<Proc> {
  const env: Record<string, string> = {
    REDIS_URL: redisUrl,
    METRICS_PORT: String(await freePort()),
    LOG_LEVEL: 'info',
    JOB_ATTEMPTS: '5',
  };
  if (opts.concurrency) env.WORKER_CONCURRENCY = opts.concurrency;
  const worker = spawnNode(join(ROOT, 'dist/worker/index.js'), env, name, { logFile, nodeArgs: opts.nodeArgs });
  procs.push(worker);
  const readyBy = Date.now() + 30_000;
  while (!readFileSync(logFile, 'utf8').includes(WORKER_READY)) {
    if (Date.now() > readyBy || worker.child.exitCode !== null) throw new Error(`${name} not ready in 30 s`);
    await sleep(100);
  }
  return worker;
}
