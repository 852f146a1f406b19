import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';

/**
 * A real redis-server for a test file: own port, own temp dir, nothing shared with other
 * files. `make test` installs redis-server (see mk/redis.mk); REDIS_SERVER overrides the binary.
 */
export interface RedisServer {
  url: string;
  port: number;
  dir: string;
  /** Stop the server (SIGTERM; with persistence on, it writes its AOF/RDB first). */
  stop(): Promise<void>;
  /** Start it again on the same port and dir (data survives when persistence is on). */
  start(): Promise<void>;
  /** Freeze the server (SIGSTOP): connections stay open but nothing is answered. */
  pause(): void;
  /** Thaw it (SIGCONT). */
  resume(): void;
  /** Stop and delete its dir. */
  destroy(): Promise<void>;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? resolve(addr.port) : reject(new Error('no port'))));
    });
  });
}

async function waitReady(url: string, timeoutMs = 10000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const c = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    c.on('error', () => {});
    try {
      await c.connect();
      if ((await c.ping()) === 'PONG') {
        c.disconnect();
        return;
      }
    } catch {
      c.disconnect();
    }
    if (Date.now() > deadline) throw new Error(`redis-server did not become ready at ${url}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** `port`: listen there (e.g. where a process already tries to connect); `password`: requirepass, and in the url. */
export async function startRedis(opts: { persistence?: boolean; port?: number; password?: string } = {}): Promise<RedisServer> {
  const bin = process.env.REDIS_SERVER ?? 'redis-server';
  const port = opts.port ?? (await freePort());
  const dir = mkdtempSync(join(tmpdir(), 'opsgate-redis-'));
  const url = opts.password ? `redis://:${encodeURIComponent(opts.password)}@127.0.0.1:${port}` : `redis://127.0.0.1:${port}`;
  let proc: ChildProcess | undefined;

  const args = [
    '--port',
    String(port),
    '--bind',
    '127.0.0.1',
    '--dir',
    dir,
    '--save',
    '',
    '--daemonize',
    'no',
    '--logfile',
    '',
    '--loglevel',
    'warning',
    '--maxmemory-policy',
    'noeviction',
    ...(opts.persistence ? ['--appendonly', 'yes', '--appendfsync', 'always'] : ['--appendonly', 'no']),
    ...(opts.password ? ['--requirepass', opts.password] : []),
  ];

  const start = async () => {
    proc = spawn(bin, args, { stdio: ['ignore', 'ignore', 'inherit'] });
    proc.on('error', () => {});
    await waitReady(url);
  };
  const stop = async () => {
    const p = proc;
    proc = undefined;
    if (!p || p.exitCode !== null) return;
    await new Promise<void>((resolve) => {
      p.once('exit', () => resolve());
      p.kill('SIGCONT'); // a paused server would never see the SIGTERM
      p.kill('SIGTERM');
    });
  };
  await start();
  return {
    url,
    port,
    dir,
    start,
    stop,
    pause: () => void proc?.kill('SIGSTOP'),
    resume: () => void proc?.kill('SIGCONT'),
    destroy: async () => {
      await stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
