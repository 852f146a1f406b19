import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
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

/*
 * Ports for the servers tests start come from below the kernel's ephemeral range
 * (net.ipv4.ip_local_port_range), which the local ports of outgoing connections are drawn from, and
 * from a block of their own per jest worker. A port the kernel hands out as free can be taken before
 * the server binds it, by another test file's freePort() or as the local port of any connection
 * (the suites make thousands): the server then exits, or a test talks to another file's server.
 */
const PORT_BLOCK = 1000;
const FIRST_PORT = 20000;
const MAX_BLOCKS = 12;
let portOffset = Math.floor(Math.random() * PORT_BLOCK);

/** The first port of the kernel's ephemeral range (Linux's default when it cannot be read). */
const EPHEMERAL_LOW = ((): number => {
  try {
    const low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > 0 ? low : 32768;
  } catch {
    return 32768;
  }
})();

function listenOnce(port: number): Promise<number | undefined> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', () => resolve(undefined));
    srv.listen(port, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => resolve(typeof addr === 'object' && addr ? addr.port : undefined));
    });
  });
}

/** A port nothing listens on now (see above); a port the kernel picks when the range leaves no room below it. */
export async function freePort(): Promise<number> {
  const worker = Math.max(1, Number(process.env.JEST_WORKER_ID ?? 1) || 1);
  const base = FIRST_PORT + ((worker - 1) % MAX_BLOCKS) * PORT_BLOCK;
  if (base + PORT_BLOCK <= EPHEMERAL_LOW) {
    for (let i = 0; i < PORT_BLOCK; i++) {
      const port = await listenOnce(base + (portOffset++ % PORT_BLOCK));
      if (port !== undefined) return port;
    }
  }
  const port = await listenOnce(0);
  if (port === undefined) throw new Error('no free port');
  return port;
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
