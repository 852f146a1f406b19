import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Queue, type Job } from 'bullmq';
import { loadWorkerConfig, type WorkerConfig } from '../../src/shared/config.js';
import { createLogger, type Logger } from '../../src/shared/logger.js';
import { createMetrics } from '../../src/shared/metrics.js';

/**
 * Shared pieces of the worker integration tests: a real local HTTP receiver (the chat/paging
 * endpoint notify_oncall posts to), a log collector, config from an env map and job-state polling.
 */
export interface ReceivedRequest {
  method: string;
  path: string;
  headers: IncomingMessage['headers'];
  body: string;
  /** The client went away before the answer was sent (e.g. the worker aborted the request). */
  aborted: boolean;
}

/** How to answer one request: status (and optional delay before answering). */
export type Reply = { status: number; delayMs?: number; body?: string };

export interface Receiver {
  readonly server: Server;
  readonly port: number;
  url(path: string): string;
  /** Requests received on a path, in order. */
  requests(path: string): ReceivedRequest[];
  /** Answers for a path: the n-th request gets replies[n] (the last one repeats). Default 200. */
  script(path: string, replies: Reply[]): void;
  /** Resolves once `count` requests reached `path`. */
  waitForRequests(path: string, count: number, timeoutMs?: number): Promise<ReceivedRequest[]>;
  close(): Promise<void>;
}

export async function startReceiver(): Promise<Receiver> {
  const got = new Map<string, ReceivedRequest[]>();
  const scripts = new Map<string, Reply[]>();
  const waiters: Array<() => void> = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = new URL(req.url ?? '/', 'http://x').pathname;
      const list = got.get(path) ?? [];
      const entry: ReceivedRequest = {
        method: req.method ?? '',
        path,
        headers: req.headers,
        body: Buffer.concat(chunks).toString('utf8'),
        aborted: false,
      };
      list.push(entry);
      got.set(path, list);
      for (const w of waiters.splice(0)) w();
      const replies = scripts.get(path) ?? [{ status: 200 }];
      const reply = replies[Math.min(list.length - 1, replies.length - 1)] ?? { status: 200 };
      res.on('close', () => {
        if (!res.writableFinished) entry.aborted = true;
      });
      const answer = () => {
        if (res.destroyed) return;
        res.writeHead(reply.status, { 'content-type': 'application/json' });
        res.end(reply.body ?? JSON.stringify({ ok: reply.status < 300 }));
      };
      if (reply.delayMs) setTimeout(answer, reply.delayMs).unref();
      else answer();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  const receiver: Receiver = {
    server,
    port,
    url: (path) => `http://127.0.0.1:${port}${path}`,
    requests: (path) => [...(got.get(path) ?? [])],
    script: (path, replies) => scripts.set(path, replies),
    waitForRequests: (path, count, timeoutMs = 20000) =>
      new Promise((resolve, reject) => {
        const deadline = setTimeout(
          () => reject(new Error(`${path}: ${receiver.requests(path).length} of ${count} requests within ${timeoutMs} ms`)),
          timeoutMs,
        );
        const check = () => {
          const list = receiver.requests(path);
          if (list.length >= count) {
            clearTimeout(deadline);
            resolve(list);
          } else waiters.push(check);
        };
        check();
      }),
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  return receiver;
}

export interface LogCollector {
  logger: Logger;
  lines: string[];
  records(): Array<Record<string, unknown>>;
  find(msg: string): Array<Record<string, unknown>>;
}

/** A logger that keeps its lines. No secret redaction: tests prove the code never logs secrets itself. */
export function collectLogs(): LogCollector {
  const lines: string[] = [];
  const logger = createLogger({ level: 'debug', write: (l) => lines.push(l) });
  const records = () => lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  return { logger, lines, records, find: (msg) => records().filter((r) => r.msg === msg) };
}

export function workerConfig(env: Record<string, string>): WorkerConfig {
  return loadWorkerConfig({ JOB_ATTEMPTS: '3', JOB_BACKOFF_MS: '100', WORKER_SHUTDOWN_GRACE_SECONDS: '5', ...env });
}

export function testMetrics() {
  return createMetrics('worker', 'test', { defaults: false });
}

export async function metricValue(metrics: ReturnType<typeof testMetrics>, name: string, labels: Record<string, string>): Promise<number> {
  const json = await metrics.registry.getMetricsAsJSON();
  const m = json.find((x) => x.name === name);
  if (!m) return 0;
  let total = 0;
  for (const v of m.values as Array<{ value: number; labels: Record<string, string | number>; metricName?: string }>) {
    if (v.metricName && v.metricName !== name && !v.metricName.endsWith('_count')) continue;
    if (Object.entries(labels).every(([k, val]) => v.labels[k] === val)) total += v.value;
  }
  return total;
}

export type FinalState = 'completed' | 'failed';

/** Polls until the job is completed or failed (dead-lettered); returns the fresh job. */
export async function waitForFinal(queue: Queue, id: string, timeoutMs = 25000): Promise<{ state: FinalState; job: Job }> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const job = await queue.getJob(id);
    if (job) {
      const state = await job.getState();
      if (state === 'completed' || state === 'failed') return { state, job: (await queue.getJob(id))! };
    }
    if (Date.now() > deadline)
      throw new Error(`job ${id} not finished within ${timeoutMs} ms (state ${job ? await job.getState() : 'missing'})`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Polls until the job reaches one of `states`. */
export async function waitForState(queue: Queue, id: string, states: string[], timeoutMs = 20000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const job = await queue.getJob(id);
    const state = job ? await job.getState() : 'missing';
    if (states.includes(state)) return state;
    if (Date.now() > deadline) throw new Error(`job ${id} is ${state}, not ${states.join('/')} within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export const audit = { audit_id: 'test-audit-0001', requested_by: 'test' };
