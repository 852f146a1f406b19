/**
 * What `make bench` (bench/run.ts) and `make bench-profile` (bench/profile.ts) share: the repo's
 * root, the chart's and the images' runtime settings, spawning the servers, wrk, CPU readings.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
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
