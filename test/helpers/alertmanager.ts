import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { freePort } from './redis.js';
import { waitFor } from './waitFor.js';

/**
 * A real Debian prometheus-alertmanager on 127.0.0.1 for a test file: its own temp config and
 * storage, no cluster peers. With `webhook` it delivers every group to that URL (the opsgate API
 * under test) with a bearer token, `send_resolved: true`, and short group_wait / group_interval /
 * repeat_interval, so a test sees a notification within a second or two of pushing an alert.
 * Alerts are pushed with its API v2 (POST /api/v2/alerts), as Prometheus does.
 */
export const ALERTMANAGER_BIN = ['/usr/bin/prometheus-alertmanager', '/usr/bin/alertmanager'].find((b) => existsSync(b));

export interface Alertmanager {
  url: string;
  /** Pushes alerts as Prometheus does; `endsAt` in the past resolves one. */
  push(
    alerts: Array<{ labels: Record<string, string>; annotations?: Record<string, string>; startsAt?: string; endsAt?: string }>,
  ): Promise<void>;
  /** Resolves an alert (endsAt now). */
  resolve(labels: Record<string, string>, startsAt?: string): Promise<void>;
  /** The silences it holds. */
  silences(): Promise<Array<{ id: string; status: { state: string }; endsAt: string; comment: string; matchers: unknown[] }>>;
  stop(): Promise<void>;
}

export interface AlertmanagerOptions {
  /** Where the webhook receiver posts (e.g. http://127.0.0.1:<port>/webhook/alerts); absent: a receiver that sends nothing. */
  webhook?: string;
  token?: string;
  /** send_resolved of the receiver (true): false, as a receiver that leaves resolution to the API v2. */
  sendResolved?: boolean;
  groupWait?: string;
  groupInterval?: string;
  repeatInterval?: string;
}

export async function startAlertmanager(opts: AlertmanagerOptions = {}): Promise<Alertmanager> {
  if (!ALERTMANAGER_BIN) throw new Error('prometheus-alertmanager is not installed (/usr/bin/prometheus-alertmanager)');
  const dir = mkdtempSync(join(tmpdir(), 'opsgate-am-'));
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const receiver = opts.webhook
    ? {
        name: 'opsgate',
        webhook_configs: [
          {
            url: opts.webhook,
            send_resolved: opts.sendResolved ?? true,
            max_alerts: 500,
            ...(opts.token ? { http_config: { authorization: { type: 'Bearer', credentials: opts.token } } } : {}),
          },
        ],
      }
    : { name: 'opsgate' };
  writeFileSync(
    join(dir, 'alertmanager.yml'),
    stringify({
      route: {
        receiver: 'opsgate',
        group_by: ['...'],
        group_wait: opts.groupWait ?? '1s',
        group_interval: opts.groupInterval ?? '1s',
        repeat_interval: opts.repeatInterval ?? '1h',
      },
      receivers: [receiver],
    }),
  );
  const proc: ChildProcess = spawn(
    ALERTMANAGER_BIN,
    [
      `--config.file=${join(dir, 'alertmanager.yml')}`,
      `--storage.path=${join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--cluster.listen-address=',
      '--log.level=warn',
    ],
    { cwd: dir, stdio: ['ignore', 'ignore', 'inherit'] },
  );
  proc.on('error', () => {});
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
      proc.kill('SIGTERM');
      // Bounded: a process that does not stop in 5 s is killed.
      const timer = setTimeout(() => proc.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await waitFor('alertmanager ready', async () => (await fetch(`${url}/-/ready`).catch(() => undefined))?.status === 200, 30_000, 100);
  } catch (err) {
    await stop();
    throw err;
  }
  const api = async (method: string, path: string, body?: unknown): Promise<unknown> => {
    const res = await fetch(`${url}${path}`, {
      method,
      headers: { 'content-type': 'application/json' },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await res.text();
    if (res.status >= 300) throw new Error(`alertmanager ${method} ${path}: ${res.status} ${text}`);
    return text === '' ? undefined : JSON.parse(text);
  };
  return {
    url,
    async push(alerts) {
      await api(
        'POST',
        '/api/v2/alerts',
        alerts.map((a) => ({ annotations: {}, ...a })),
      );
    },
    async resolve(labels, startsAt) {
      await api('POST', '/api/v2/alerts', [{ labels, ...(startsAt ? { startsAt } : {}), endsAt: new Date().toISOString() }]);
    },
    async silences() {
      return (await api('GET', '/api/v2/silences')) as Awaited<ReturnType<Alertmanager['silences']>>;
    },
    stop,
  };
}

/** An HTTP server on 127.0.0.1 that hands every request to its app once one is set (503 before). */
export interface AppFront {
  /** http://127.0.0.1:<port> */
  url: string;
  setApp(app: (req: IncomingMessage, res: ServerResponse) => void): void;
  close(): Promise<void>;
}

/**
 * Listens before the API under test exists, so that Alertmanager's receiver (started next) can
 * name its port, and the API (configured with Alertmanager's URL) is set afterwards.
 */
export async function startAppFront(): Promise<AppFront> {
  let app: ((req: IncomingMessage, res: ServerResponse) => void) | undefined;
  const server = createServer((req, res) => (app ? app(req, res) : res.writeHead(503).end()));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    setApp: (a) => (app = a),
    async close() {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  };
}
