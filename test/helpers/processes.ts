import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * Real opsgate processes for tests: spawns the built entry points (dist/src/server.js for the API,
 * dist/worker/index.js for the worker; the jest globalSetup builds them once per run), waits until
 * they are ready, collects their stdout lines for log assertions, signals them and waits for exit.
 *
 * Ready means: API -> GET http://127.0.0.1:$PORT/ready answers 200; worker -> it logged
 * {"msg":"worker ready"}.
 */
export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const DIST_DIR = process.env.OPSGATE_DIST_DIR ?? join(REPO_ROOT, 'dist');
export const API_ENTRY = join(DIST_DIR, 'src', 'server.js');
export const WORKER_ENTRY = join(DIST_DIR, 'worker', 'index.js');
export const WORKER_READY_MSG = 'worker ready';

export type LogLine = Record<string, unknown> & { msg?: string; level?: string };

export interface OpsProcess {
  readonly proc: ChildProcess;
  readonly pid: number;
  /** Every stdout line so far, raw. */
  readonly lines: string[];
  /** Every stderr line so far. */
  readonly stderr: string[];
  /** stdout lines that are JSON objects (the structured logs). */
  logs(): LogLine[];
  /** Resolves with the first (past or future) log line matching `pred`. */
  waitForLog(pred: (l: LogLine) => boolean, timeoutMs?: number): Promise<LogLine>;
  /** Sends a signal (no-op when already exited). */
  kill(signal?: NodeJS.Signals): void;
  /** Resolves when the process has exited. */
  waitExit(timeoutMs?: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  readonly exited: boolean;
  /** SIGKILL if still running, then wait (use in afterAll/afterEach). */
  stop(): Promise<void>;
}

export interface SpawnOptions {
  /** Environment of the child: only these variables plus PATH/HOME/NODE_* basics. */
  env: Record<string, string | undefined>;
  /** Inherit the whole parent environment under `env` (default false: a clean environment). */
  inheritEnv?: boolean;
  /** Echo the child's output to this process's stderr (debugging). */
  echo?: boolean;
}

function baseEnv(): Record<string, string> {
  const out: Record<string, string> = {};
  for (const k of ['PATH', 'HOME', 'TMPDIR', 'LANG', 'TZ', 'SYSTEMROOT']) {
    const v = process.env[k];
    if (v !== undefined) out[k] = v;
  }
  return out;
}

export function spawnNode(entry: string, opts: SpawnOptions): OpsProcess {
  if (!existsSync(entry)) {
    throw new Error(`${entry} does not exist: build first (make build; the jest globalSetup does it)`);
  }
  const env: Record<string, string> = { ...(opts.inheritEnv ? (process.env as Record<string, string>) : baseEnv()) };
  for (const [k, v] of Object.entries(opts.env)) {
    if (v === undefined) delete env[k];
    else env[k] = v;
  }
  const proc = spawn(process.execPath, [entry], { cwd: REPO_ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: string[] = [];
  const stderr: string[] = [];
  const parsed: LogLine[] = [];
  const waiters: Array<{ pred: (l: LogLine) => boolean; resolve: (l: LogLine) => void }> = [];
  let exitInfo: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  const exitWaiters: Array<(v: { code: number | null; signal: NodeJS.Signals | null }) => void> = [];

  const splitter = (sink: (line: string) => void) => {
    let buf = '';
    return (chunk: Buffer) => {
      buf += chunk.toString('utf8');
      let i: number;
      while ((i = buf.indexOf('\n')) >= 0) {
        sink(buf.slice(0, i));
        buf = buf.slice(i + 1);
      }
    };
  };
  proc.stdout.on(
    'data',
    splitter((line) => {
      lines.push(line);
      if (opts.echo) process.stderr.write(`[${proc.pid}] ${line}\n`);
      let obj: unknown;
      try {
        obj = JSON.parse(line);
      } catch {
        return;
      }
      if (!obj || typeof obj !== 'object' || Array.isArray(obj)) return;
      const l = obj as LogLine;
      parsed.push(l);
      for (const w of [...waiters]) {
        if (w.pred(l)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(l);
        }
      }
    }),
  );
  proc.stderr.on(
    'data',
    splitter((line) => {
      stderr.push(line);
      if (opts.echo) process.stderr.write(`[${proc.pid} stderr] ${line}\n`);
    }),
  );
  // 'close' (not 'exit'): fires once the process exited AND its stdout/stderr are fully read.
  proc.on('close', (code, signal) => {
    exitInfo = { code, signal };
    for (const w of exitWaiters.splice(0)) w(exitInfo);
  });
  proc.on('error', () => {});

  const handle: OpsProcess = {
    proc,
    pid: proc.pid ?? -1,
    lines,
    stderr,
    logs: () => [...parsed],
    get exited() {
      return exitInfo !== undefined;
    },
    waitForLog(pred, timeoutMs = 20000) {
      const found = parsed.find(pred);
      if (found) return Promise.resolve(found);
      return new Promise<LogLine>((resolvePromise, reject) => {
        const w = {
          pred,
          resolve: (l: LogLine) => {
            clearTimeout(t);
            resolvePromise(l);
          },
        };
        const t = setTimeout(() => {
          waiters.splice(waiters.indexOf(w), 1);
          reject(
            new Error(
              `no matching log line within ${timeoutMs} ms from pid ${proc.pid}${exitInfo ? ` (exited ${JSON.stringify(exitInfo)})` : ''}; ` +
                `last stdout: ${lines.slice(-5).join(' | ')}; stderr: ${stderr.slice(-5).join(' | ')}`,
            ),
          );
        }, timeoutMs);
        waiters.push(w);
      });
    },
    kill(signal = 'SIGTERM') {
      if (exitInfo === undefined) proc.kill(signal);
    },
    waitExit(timeoutMs = 30000) {
      if (exitInfo) return Promise.resolve(exitInfo);
      return new Promise((resolvePromise, reject) => {
        const t = setTimeout(() => reject(new Error(`pid ${proc.pid} did not exit within ${timeoutMs} ms`)), timeoutMs);
        exitWaiters.push((v) => {
          clearTimeout(t);
          resolvePromise(v);
        });
      });
    },
    async stop() {
      if (exitInfo !== undefined) return;
      proc.kill('SIGKILL');
      await handle.waitExit(10000).catch(() => undefined);
    },
  };
  return handle;
}

async function waitHttpReady(url: string, p: OpsProcess, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (p.exited) {
      throw new Error(`process exited before ready: ${JSON.stringify(await p.waitExit())}; stderr: ${p.stderr.join(' | ')}`);
    }
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(1000) });
      await res.arrayBuffer();
      if (res.status === 200) return;
    } catch {
      /* not listening yet */
    }
    if (Date.now() > deadline) {
      throw new Error(
        `${url} not ready within ${timeoutMs} ms; stdout: ${p.lines.slice(-5).join(' | ')}; stderr: ${p.stderr.slice(-5).join(' | ')}`,
      );
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Starts the API (dist/src/server.js); env must include PORT. Resolves once GET /ready is 200. */
export async function startApi(opts: SpawnOptions & { readyTimeoutMs?: number }): Promise<OpsProcess & { baseUrl: string }> {
  const port = opts.env.PORT;
  if (!port) throw new Error('startApi: env.PORT is required');
  const p = spawnNode(API_ENTRY, opts);
  const baseUrl = `http://127.0.0.1:${port}`;
  try {
    await waitHttpReady(`${baseUrl}/ready`, p, opts.readyTimeoutMs ?? 20000);
  } catch (err) {
    await p.stop();
    throw err;
  }
  return Object.assign(p, { baseUrl });
}

/** Starts the worker (dist/worker/index.js). Resolves once it logged {"msg":"worker ready"}. */
export async function startWorkerProcess(opts: SpawnOptions & { readyTimeoutMs?: number }): Promise<OpsProcess> {
  const p = spawnNode(WORKER_ENTRY, opts);
  let onExit: (() => void) | undefined;
  try {
    await Promise.race([
      p.waitForLog((l) => l.msg === WORKER_READY_MSG, opts.readyTimeoutMs ?? 20000),
      new Promise<never>((_, reject) => {
        onExit = () =>
          reject(
            new Error(`worker exited before ready (code ${p.proc.exitCode}, signal ${p.proc.signalCode}); stderr: ${p.stderr.join(' | ')}`),
          );
        p.proc.once('close', onExit);
      }),
    ]);
  } catch (err) {
    await p.stop();
    throw err;
  } finally {
    if (onExit) p.proc.off('close', onExit);
  }
  return p;
}
