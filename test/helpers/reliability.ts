/**
 * Shared pieces of the reliability and fuzz suites: configured secrets, environments for the
 * real API/worker processes, a local notification receiver (the observable side effect of
 * notify_oncall), a bounded-concurrency runner and queue inspection.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Queue, type Job } from 'bullmq';
import { Redis } from 'ioredis';
import { QUEUE_NAME } from '../../src/shared/jobs.js';
import { freePort } from './redis.js';

/** Distinctive secrets, so a leak is found by plain substring search in any output. */
export function makeSecrets(tag: string) {
  const rnd = () => Math.random().toString(36).slice(2, 10);
  return {
    operatorKey: `opk-${tag}-${rnd()}-SECRETOPERATOR`,
    readonlyKey: `rok-${tag}-${rnd()}-SECRETREADONLY`,
    /** A key containing colons (the role is the text after the last one). */
    colonKey: `col:${tag}:${rnd()}:SECRETCOLON`,
    bearer: `brr-${tag}-${rnd()}-SECRETBEARER`,
    scm: `scm-${tag}-${rnd()}-SECRETSCM`,
    github: `ghs-${tag}-${rnd()}-SECRETGITHUB`,
    alerts: `alt-${tag}-${rnd()}-SECRETALERTS`,
  };
}
export type Secrets = ReturnType<typeof makeSecrets>;

export function secretValues(s: Secrets): string[] {
  return Object.values(s);
}

export async function apiEnv(redisUrl: string, s: Secrets, extra: Record<string, string | undefined> = {}) {
  return {
    REDIS_URL: redisUrl,
    PORT: String(await freePort()),
    METRICS_PORT: String(await freePort()),
    OPS_API_KEY_ROLES: `${s.operatorKey}:operator,${s.readonlyKey}:readonly,${s.colonKey}:operator`,
    OPS_BEARER_TOKEN: s.bearer,
    SCM_WEBHOOK_SECRET: s.scm,
    GITHUB_WEBHOOK_SECRET: s.github,
    LOG_LEVEL: 'info',
    RATE_LIMIT_RPS: '0',
    ...extra,
  };
}

export async function workerEnv(redisUrl: string, extra: Record<string, string | undefined> = {}) {
  return {
    REDIS_URL: redisUrl,
    METRICS_PORT: String(await freePort()),
    LOG_LEVEL: 'info',
    // No cluster in these suites unless a test points KUBECONFIG somewhere on purpose.
    KUBECONFIG: '/nonexistent/opsgate-test-kubeconfig',
    ...extra,
  };
}

/** A local HTTP endpoint standing in for a chat/paging webhook: records every POST body. */
export interface Receiver {
  url: string;
  posts: Array<{ at: number; body: Record<string, unknown> }>;
  /** Status to answer with, decided per request (default 200); a promise delays the answer. */
  status: (body: Record<string, unknown>) => number | Promise<number>;
  close(): Promise<void>;
}

export async function startReceiver(): Promise<Receiver> {
  const rec: Receiver = {
    url: '',
    posts: [],
    status: () => 200,
    close: async () => {},
  };
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      let body: Record<string, unknown>;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
      } catch {
        body = { unparsable: true };
      }
      rec.posts.push({ at: Date.now(), body });
      void Promise.resolve(rec.status(body)).then((code) => {
        if (res.destroyed) return;
        res.statusCode = code;
        res.setHeader('content-type', 'application/json');
        res.end('{}');
      });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  rec.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks/oncall`;
  rec.close = () =>
    new Promise<void>((r) => {
      server.close(() => r());
      server.closeAllConnections();
    });
  return rec;
}

/** Runs `tasks` with at most `limit` in flight. */
export async function pool<T>(tasks: Array<() => Promise<T>>, limit: number): Promise<T[]> {
  const out: T[] = new Array(tasks.length);
  let next = 0;
  const runners = Array.from({ length: Math.min(limit, tasks.length) }, async () => {
    for (;;) {
      const i = next++;
      if (i >= tasks.length) return;
      out[i] = await tasks[i]!();
    }
  });
  await Promise.all(runners);
  return out;
}

export function shuffle<T>(xs: T[], seed = 42): T[] {
  let s = seed >>> 0;
  const rand = () => (s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32;
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [xs[i], xs[j]] = [xs[j]!, xs[i]!];
  }
  return xs;
}

export { waitFor } from './waitFor.js';

/** A read-side view of the real "ops" queue. */
export function inspectQueue(redisUrl: string) {
  const conn = new Redis(redisUrl, { maxRetriesPerRequest: null });
  conn.on('error', () => {});
  const queue = new Queue(QUEUE_NAME, { connection: conn });
  queue.on('error', () => {});
  return {
    queue,
    conn,
    counts: async () => {
      const c = await queue.getJobCounts('waiting', 'active', 'delayed', 'completed', 'failed', 'prioritized', 'waiting-children');
      return {
        waiting: c.waiting ?? 0,
        active: c.active ?? 0,
        delayed: c.delayed ?? 0,
        completed: c.completed ?? 0,
        failed: c.failed ?? 0,
        prioritized: c.prioritized ?? 0,
      };
    },
    /** Every job in any state. */
    all: async (): Promise<Job[]> =>
      queue.getJobs(['waiting', 'active', 'delayed', 'completed', 'failed', 'prioritized', 'waiting-children'], 0, -1),
    close: async () => {
      await queue.close().catch(() => undefined);
      conn.disconnect();
    },
  };
}

export async function post(url: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, text, json: json as Record<string, unknown> | undefined };
}

export const scmPush = (project: string, sha: string, ref = 'refs/heads/main') => ({
  ref,
  project: { path_with_namespace: project },
  checkout_sha: sha,
});

export const alertPayload = (alerts: Array<{ status?: string; alertname?: string; fingerprint?: string; summary?: string }>) => ({
  version: '4',
  status: 'firing',
  alerts: alerts.map((a) => ({
    status: a.status ?? 'firing',
    labels: { alertname: a.alertname ?? 'TestAlert', severity: 'page' },
    annotations: { summary: a.summary ?? 'something is on fire' },
    ...(a.fingerprint !== undefined ? { fingerprint: a.fingerprint } : {}),
  })),
});
