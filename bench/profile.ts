/**
 * `make bench-profile`: where each server's CPU goes per request, by feature, so a missed target
 * comes with the profile that says where the time goes.
 *
 * One server at a time, each under `node --cpu-prof`, loaded by wrk as `make bench` loads it
 * (bench/wrk.lua, PROFILE_CONNECTIONS (64) connections, PROFILE_MODE unique (default) or dup
 * push events, or alerts: BENCH_ALERTS-alert payloads one at a time): bare Express, the spec-minimum
 * control, the public-API floor (bench/publicFloor.ts: one Queue#add / Queue#addBulk with
 * deduplication) and the API as the chart runs it (its heap caps, the images' MALLOC_ARENA_MAX, the
 * rate limiter on with a limit never reached).
 * Only the samples taken during the measured PROFILE_SECONDS (10) count (not start-up or
 * warm-up); each is charged to a feature by bench/attribution.ts. Printed as one table of
 * microseconds of main-thread time per request, plus each process's whole CPU per request
 * (/proc, every thread: GC helpers included) and its req/s under the profiler (slower than
 * without it: compare rows, not these rates with `make bench`).
 * The API's intake is an installation past version 0.1's window (PROFILE_INTAKE=steady, the
 * default), or inside it (PROFILE_INTAKE=upgrade: the 25 h after an upgrade, when each event's
 * version 0.1 record is read too; src/domain/intake.ts).
 * Results: artifacts/bench-profile.{txt,json}; the profiles in artifacts/profile/<server>/.
 */
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { LEGACY_WINDOW_MS } from '../src/domain/intake.js';
import { INTAKE_SINCE_KEY } from '../src/shared/keys.js';
import { startRedis } from '../test/helpers/redis.js';
import { attribute, type CpuProfile } from './attribution.js';
import {
  apiEnv,
  CHART_HEAP_CAP_MB,
  CHART_SEMI_SPACE_MB,
  chartHeapArgs,
  fmt,
  log,
  processCpuMs,
  ROOT,
  runWrk,
  SCM_SECRET,
  startServer,
  type Proc,
} from './support.js';

const MODE = process.env.PROFILE_MODE ?? 'unique';
const SECONDS = Number(process.env.PROFILE_SECONDS ?? 10);
/** Alert payloads go one at a time (the latency of one payload is what their target is about). */
const CONNECTIONS = MODE === 'alerts' ? 1 : Number(process.env.PROFILE_CONNECTIONS ?? 64);
const ALERTS_PER_PAYLOAD = Number(process.env.BENCH_ALERTS ?? 1000);
/** The API's heap as `make bench` sets it: the chart's values unless BENCH_HEAP_CAP_MB / BENCH_SEMI_SPACE_MB say otherwise. */
const HEAP_CAP_MB = Number(process.env.BENCH_HEAP_CAP_MB ?? CHART_HEAP_CAP_MB);
const SEMI_SPACE_MB = Number(process.env.BENCH_SEMI_SPACE_MB ?? CHART_SEMI_SPACE_MB);
const WARMUP = 2;
const INTAKE = process.env.PROFILE_INTAKE ?? 'steady';

interface Measured {
  key: string;
  label: string;
  requests: number;
  rps: number;
  /** The process's CPU (user + sys, every thread) per request, us. */
  processUsPerReq: number;
  /** Main-thread busy time per request, us, by feature. */
  features: Map<string, number>;
}

const monotonicUs = () => Number(process.hrtime.bigint() / 1000n);

async function main() {
  if (!['unique', 'dup', 'alerts'].includes(MODE)) throw new Error(`PROFILE_MODE must be unique, dup or alerts, not ${MODE}`);
  if (!['steady', 'upgrade'].includes(INTAKE)) throw new Error(`PROFILE_INTAKE must be steady or upgrade, not ${INTAKE}`);
  const load0 = os.loadavg();
  const redis = await startRedis();
  const admin = new Redis(redis.url);
  const outDir = join(ROOT, 'artifacts/profile');
  rmSync(outDir, { recursive: true, force: true });
  const results: Measured[] = [];
  try {
    const servers: Array<{ key: string; label: string; script: string; env: Record<string, string>; args: string[]; token: string }> = [
      { key: 'bare', label: 'bare Express', script: 'dist/bench/bench/bareExpress.js', env: {}, args: [], token: '' },
      {
        key: 'control',
        label: 'spec minimum',
        script: 'dist/bench/bench/specMinimum.js',
        env: { REDIS_URL: redis.url },
        args: [],
        token: '',
      },
      {
        key: 'floor',
        label: 'public-API floor',
        script: 'dist/bench/bench/publicFloor.js',
        env: { REDIS_URL: redis.url },
        args: [],
        token: '',
      },
      {
        key: 'api',
        label: `opsgate API (heap: old ${HEAP_CAP_MB} / semi ${SEMI_SPACE_MB} MB${INTAKE === 'upgrade' ? ', upgrade window' : ''})`,
        script: 'dist/src/server.js',
        env: await apiEnv(redis.url, '1000000'),
        args: chartHeapArgs(HEAP_CAP_MB, SEMI_SPACE_MB),
        token: SCM_SECRET,
      },
    ];
    for (const sv of servers) {
      const dir = join(outDir, sv.key);
      mkdirSync(dir, { recursive: true });
      const procs: Proc[] = [];
      const { p, url } = await startServer(
        procs,
        sv.key,
        sv.script,
        sv.env,
        [...sv.args, '--cpu-prof', `--cpu-prof-dir=${dir}`],
        join(dir, 'stdout.log'),
      );
      const env = {
        BENCH_MODE: MODE,
        BENCH_PREFIX: `${sv.key}-${Date.now().toString(36)}`,
        BENCH_TOKEN: sv.token,
        BENCH_ALERTS: String(ALERTS_PER_PAYLOAD),
      };
      // The intake's state, read once per process at its first push (see above).
      if (sv.key === 'api') {
        await admin.set(INTAKE_SINCE_KEY, String(INTAKE === 'upgrade' ? Date.now() : Date.now() - LEGACY_WINDOW_MS - 3600_000));
      }
      log(`${sv.key}: warm-up ${WARMUP}s`);
      await runWrk(url, env, CONNECTIONS, WARMUP);
      await admin.flushall();
      if (MODE === 'dup') await runWrk(url, env, 1, 1);
      log(`${sv.key}: ${SECONDS}s under the profiler`);
      const cpu0 = processCpuMs(p.child.pid!);
      const t0 = monotonicUs();
      const r = await runWrk(url, env, CONNECTIONS, SECONDS);
      const t1 = monotonicUs();
      const cpu1 = processCpuMs(p.child.pid!);
      await p.stop(); // the profile is written at exit
      if (r.requests === 0 || r.non2xx > 0) throw new Error(`${sv.key}: ${r.requests} requests, ${r.non2xx} non-2xx`);
      const file = readdirSync(dir).find((f) => f.endsWith('.cpuprofile'));
      if (!file) throw new Error(`${sv.key}: no .cpuprofile written in ${dir}`);
      const profile = JSON.parse(readFileSync(join(dir, file), 'utf8')) as CpuProfile;
      const features = new Map([...attribute(profile, [t0, t1])].map(([k, us]) => [k, us / r.requests]));
      if (features.size === 0) throw new Error(`${sv.key}: no samples inside the measured window (clock mismatch?)`);
      results.push({
        key: sv.key,
        label: sv.label,
        requests: r.requests,
        rps: r.requests / (r.duration_us / 1e6),
        processUsPerReq: ((cpu1 - cpu0) / r.requests) * 1000,
        features,
      });
    }
  } finally {
    admin.disconnect();
    await redis.destroy();
  }
  const load1 = os.loadavg();

  const api = results.find((m) => m.key === 'api')!;
  const names = [...new Set(results.flatMap((m) => [...m.features.keys()]))].sort(
    (a, b) => (api.features.get(b) ?? 0) - (api.features.get(a) ?? 0),
  );
  const head = [`main-thread us per ${MODE === 'alerts' ? 'payload' : 'request'}, by feature`, ...results.map((m) => m.label)];
  const sum = (m: Measured) => [...m.features.values()].reduce((a, b) => a + b, 0);
  const rows = [
    ...names.map((n) => [n, ...results.map((m) => (m.features.has(n) ? fmt(m.features.get(n)!, 1) : '-'))]),
    ['= main thread, busy', ...results.map((m) => fmt(sum(m), 1))],
    ['process CPU, every thread (/proc)', ...results.map((m) => fmt(m.processUsPerReq, 0))],
    ['req/s under the profiler', ...results.map((m) => fmt(m.rps, 0))],
  ];
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) =>
    '| ' + cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join(' | ') + ' |';
  const rule = '+' + widths.map((w) => '-'.repeat(w + 2)).join('+') + '+';
  const text = [
    `opsgate bench-profile, ${new Date().toISOString()}: ${MODE === 'alerts' ? `${fmt(ALERTS_PER_PAYLOAD)}-alert payloads (a request is one payload)` : `${MODE} push events`}, API intake ${INTAKE === 'upgrade' ? 'in the upgrade window (version 0.1 records read)' : 'past the upgrade window'}, wrk ${CONNECTIONS} connections, ${SECONDS} s per server under node --cpu-prof`,
    rule,
    line(head),
    rule,
    ...rows.slice(0, names.length).map(line),
    rule,
    ...rows.slice(names.length).map(line),
    rule,
    "  Each sample is charged to the innermost frame of ours (or of Express's router dispatch) on its stack: library work counts for the feature that called it (pino under the audit line, BullMQ and ioredis under the producer). Socket writes made inside a feature are that feature's.",
    `  machine: ${os.cpus().length} CPUs, node ${process.version}, load average before ${load0.map((x) => x.toFixed(2)).join('/')} after ${load1.map((x) => x.toFixed(2)).join('/')}`,
  ].join('\n');
  process.stdout.write(text + '\n');
  writeFileSync(join(ROOT, 'artifacts/bench-profile.txt'), text + '\n');
  writeFileSync(
    join(ROOT, 'artifacts/bench-profile.json'),
    JSON.stringify(
      {
        mode: MODE,
        seconds: SECONDS,
        connections: CONNECTIONS,
        loadavg: { before: load0, after: load1 },
        servers: results.map((m) => ({ ...m, features: Object.fromEntries(m.features) })),
      },
      null,
      2,
    ),
  );
}

main().catch((err: unknown) => {
  process.stderr.write(`bench-profile failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exitCode = 1;
});
