import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createNetServer, connect, type AddressInfo, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { waitFor as until } from './waitFor.js';
import { freePort } from './redis.js';

/**
 * Replicated Redis topologies for tests, made of real Debian processes on 127.0.0.1, each with
 * its own ports and temp dir, started and stopped by the test (every wait bounded):
 * - startSentinelRedis(): 1 primary + N replicas + M sentinels (`redis-sentinel`, quorum 2),
 *   REDIS_URL `redis+sentinel://…/<master>`.
 * - startRedisCluster(): P primaries (+ R replicas each) joined by
 *   `redis-cli --cluster create … --cluster-yes`, REDIS_URL `redis+cluster://…`.
 * `make redis` installs redis-server, redis-sentinel and redis-tools (mk/redis.mk).
 */
const REDIS_SERVER = process.env.REDIS_SERVER ?? 'redis-server';
const REDIS_SENTINEL = process.env.REDIS_SENTINEL ?? 'redis-sentinel';
const REDIS_CLI = process.env.REDIS_CLI ?? 'redis-cli';

export interface RedisProc {
  port: number;
  readonly proc: ChildProcess;
  readonly alive: boolean;
  kill(signal?: NodeJS.Signals): Promise<void>;
  /** Start the same process again (same port, dir and arguments) after it was killed. */
  restart(): void;
  /** A plain connection to this one process (for checks); the caller disconnects it. */
  client(): Redis;
}

function startProc(bin: string, args: string[], port: number): RedisProc {
  let proc!: ChildProcess;
  let exited = false;
  let exit!: Promise<void>;
  const spawnIt = () => {
    proc = spawn(bin, args, { stdio: ['ignore', 'ignore', 'inherit'] });
    proc.on('error', () => {});
    exited = false;
    exit = new Promise<void>((resolve) => proc.once('exit', () => ((exited = true), resolve())));
  };
  spawnIt();
  return {
    port,
    get proc() {
      return proc;
    },
    get alive() {
      return !exited;
    },
    async kill(signal: NodeJS.Signals = 'SIGKILL') {
      if (exited) return;
      proc.kill(signal);
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([exit, new Promise((r) => (timer = setTimeout(r, 10_000)))]);
      clearTimeout(timer);
    },
    restart() {
      if (!exited) throw new Error(`process on port ${port} is still running`);
      spawnIt();
    },
    client() {
      const c = new Redis({
        host: '127.0.0.1',
        port,
        maxRetriesPerRequest: 1,
        retryStrategy: () => 200,
        connectTimeout: 1000,
        lazyConnect: false,
      });
      c.on('error', () => {});
      return c;
    },
  };
}

/** Polls until a value other than undefined/false; bounded (test/helpers/waitFor.ts). */
export { until };

async function ask<T>(p: RedisProc, fn: (c: Redis) => Promise<T>): Promise<T> {
  const c = p.client();
  try {
    return await fn(c);
  } finally {
    c.disconnect();
  }
}

const serverArgs = (port: number, dir: string, extra: string[] = []) => [
  '--port',
  String(port),
  '--bind',
  '127.0.0.1',
  '--dir',
  dir,
  '--save',
  '',
  '--appendonly',
  'no',
  '--daemonize',
  'no',
  '--logfile',
  '',
  '--loglevel',
  'warning',
  '--maxmemory-policy',
  'noeviction',
  '--repl-diskless-sync',
  'yes',
  '--repl-diskless-sync-delay',
  '0',
  ...extra,
];

export interface SentinelRedis {
  masterName: string;
  url: string;
  primary: RedisProc;
  replicas: RedisProc[];
  sentinels: RedisProc[];
  /** The primary's port as the sentinels report it now. */
  primaryPort(): Promise<number>;
  /** The process that is primary now. */
  currentPrimary(): Promise<RedisProc>;
  destroy(): Promise<void>;
}

export async function startSentinelRedis(
  opts: { replicas?: number; sentinels?: number; downAfterMs?: number; masterName?: string } = {},
): Promise<SentinelRedis> {
  const masterName = opts.masterName ?? 'opsgate';
  const nReplicas = opts.replicas ?? 2;
  const nSentinels = opts.sentinels ?? 3;
  const downAfter = opts.downAfterMs ?? 1000;
  const root = mkdtempSync(join(tmpdir(), 'opsgate-sentinel-'));
  const all: RedisProc[] = [];
  const destroy = async () => {
    await Promise.all(all.map((p) => p.kill('SIGKILL')));
    rmSync(root, { recursive: true, force: true });
  };
  try {
    const dirFor = (name: string) => {
      const d = join(root, name);
      mkdirSync(d);
      return d;
    };
    const primaryPort = await freePort();
    const primary = startProc(REDIS_SERVER, serverArgs(primaryPort, dirFor('primary')), primaryPort);
    all.push(primary);
    const replicas: RedisProc[] = [];
    for (let i = 0; i < nReplicas; i++) {
      const port = await freePort();
      const r = startProc(
        REDIS_SERVER,
        serverArgs(port, dirFor(`replica${i}`), ['--replicaof', '127.0.0.1', String(primaryPort), '--replica-announce-ip', '127.0.0.1']),
        port,
      );
      replicas.push(r);
      all.push(r);
    }
    await until('primary with its replicas online', () => {
      const exited = [primary, ...replicas].filter((p) => !p.alive).map((p) => p.port);
      if (exited.length) throw new Error(`redis-server exited (port ${exited.join(', ')})`);
      return ask(primary, async (c) => {
        const info = await c.info('replication');
        return (info.match(/state=online/g) ?? []).length === nReplicas;
      });
    });
    const sentinels: RedisProc[] = [];
    for (let i = 0; i < nSentinels; i++) {
      const port = await freePort();
      const dir = dirFor(`sentinel${i}`);
      const conf = join(dir, 'sentinel.conf');
      writeFileSync(
        conf,
        [
          `port ${port}`,
          'bind 127.0.0.1',
          'daemonize no',
          `dir ${dir}`,
          'logfile ""',
          'loglevel warning',
          'sentinel announce-ip 127.0.0.1',
          `sentinel monitor ${masterName} 127.0.0.1 ${primaryPort} 2`,
          `sentinel down-after-milliseconds ${masterName} ${downAfter}`,
          `sentinel failover-timeout ${masterName} 10000`,
          `sentinel parallel-syncs ${masterName} 2`,
          '',
        ].join('\n'),
      );
      const s = startProc(REDIS_SENTINEL, [conf], port);
      sentinels.push(s);
      all.push(s);
    }
    // Every sentinel knows the replicas and the other sentinels (hello messages, every ~2 s):
    // only then can they agree on a failover.
    for (const s of sentinels) {
      await until('sentinels discovered each other and the replicas', () =>
        ask(s, async (c) => {
          const reps = (await c.call('SENTINEL', 'REPLICAS', masterName)) as unknown[];
          const others = (await c.call('SENTINEL', 'SENTINELS', masterName)) as unknown[];
          return reps.length === nReplicas && others.length === nSentinels - 1;
        }),
      );
    }
    const primaryPortNow = async () => {
      for (const s of sentinels) {
        if (!s.alive) continue;
        try {
          const addr = (await ask(s, (c) => c.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', masterName))) as [string, string] | null;
          if (addr) return Number(addr[1]);
        } catch {
          /* next sentinel */
        }
      }
      throw new Error('no sentinel answered');
    };
    return {
      masterName,
      url: `redis+sentinel://${sentinels.map((s) => `127.0.0.1:${s.port}`).join(',')}/${masterName}`,
      primary,
      replicas,
      sentinels,
      primaryPort: primaryPortNow,
      async currentPrimary() {
        const port = await primaryPortNow();
        const p = all.find((x) => x.port === port);
        if (!p) throw new Error(`sentinels name an unknown primary port ${port}`);
        return p;
      },
      destroy,
    };
  } catch (err) {
    await destroy();
    throw err;
  }
}

export interface RedisCluster {
  url: string;
  nodes: RedisProc[];
  /** The primary serving a key's slot now. */
  primaryFor(key: string): Promise<RedisProc>;
  /** Every node agrees the cluster is ok and each slot has a primary. */
  waitHealthy(timeoutMs?: number): Promise<void>;
  destroy(): Promise<void>;
}

export async function startRedisCluster(
  opts: { primaries?: number; replicasPerPrimary?: number; nodeTimeoutMs?: number } = {},
): Promise<RedisCluster> {
  const nPrimaries = opts.primaries ?? 3;
  const perPrimary = opts.replicasPerPrimary ?? 0;
  const nodeTimeout = opts.nodeTimeoutMs ?? 1000;
  const root = mkdtempSync(join(tmpdir(), 'opsgate-cluster-'));
  const nodes: RedisProc[] = [];
  const destroy = async () => {
    await Promise.all(nodes.map((p) => p.kill('SIGKILL')));
    rmSync(root, { recursive: true, force: true });
  };
  try {
    const total = nPrimaries * (1 + perPrimary);
    for (let i = 0; i < total; i++) {
      const port = await freePort();
      const dir = join(root, `node${i}`);
      mkdirSync(dir);
      nodes.push(
        startProc(
          REDIS_SERVER,
          serverArgs(port, dir, [
            '--cluster-enabled',
            'yes',
            '--cluster-config-file',
            join(dir, 'nodes.conf'),
            '--cluster-node-timeout',
            String(nodeTimeout),
            '--cluster-announce-ip',
            '127.0.0.1',
            // A replica whose primary died takes over however long its link was down.
            '--cluster-replica-validity-factor',
            '0',
          ]),
          port,
        ),
      );
    }
    for (const n of nodes) await until(`cluster node ${n.port} up`, () => ask(n, async (c) => (await c.ping()) === 'PONG'));
    const create = spawnSync(
      REDIS_CLI,
      ['--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`), '--cluster-replicas', String(perPrimary), '--cluster-yes'],
      { encoding: 'utf8', timeout: 60_000 },
    );
    if (create.status !== 0)
      throw new Error(`redis-cli --cluster create failed: ${create.stdout.slice(-500)} ${create.stderr.slice(-500)}`);
    const waitHealthy = async (timeoutMs = 30_000) => {
      for (const n of nodes.filter((x) => x.alive)) {
        await until(
          `cluster_state:ok on ${n.port}`,
          () => ask(n, async (c) => /cluster_state:ok/.test(String(await c.call('CLUSTER', 'INFO')))),
          timeoutMs,
        );
      }
    };
    await waitHealthy();
    if (perPrimary > 0) {
      // Every replica has finished its first sync (a failover needs an in-sync replica).
      for (const n of nodes) {
        await until(`node ${n.port} in sync`, () =>
          ask(n, async (c) => {
            const info = await c.info('replication');
            if (/role:master/.test(info)) return (info.match(/state=online/g) ?? []).length === perPrimary;
            return /master_link_status:up/.test(info);
          }),
        );
      }
    }
    return {
      url: `redis+cluster://${nodes
        .slice(0, Math.min(3, nodes.length))
        .map((n) => `127.0.0.1:${n.port}`)
        .join(',')}`,
      nodes,
      async primaryFor(key) {
        for (const n of nodes.filter((x) => x.alive)) {
          try {
            const slot = Number(await ask(n, (c) => c.call('CLUSTER', 'KEYSLOT', key)));
            const slots = (await ask(n, (c) => c.call('CLUSTER', 'SLOTS'))) as Array<
              [number, number, [string, number, ...unknown[]], ...unknown[]]
            >;
            const range = slots.find(([a, b]) => slot >= a && slot <= b);
            if (!range) continue;
            const p = nodes.find((x) => x.port === Number(range[2][1]));
            if (p) return p;
          } catch {
            /* try the next node */
          }
        }
        throw new Error(`no primary found for ${key}`);
      },
      waitHealthy,
      destroy,
    };
  } catch (err) {
    await destroy();
    throw err;
  }
}

/** One replica of an existing server (e.g. startRedis()'s), online when this resolves. */
export async function startReplica(primaryPort: number): Promise<RedisProc & { destroy(): Promise<void> }> {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'opsgate-replica-'));
  const r = startProc(REDIS_SERVER, serverArgs(port, dir, ['--replicaof', '127.0.0.1', String(primaryPort)]), port);
  const destroy = async () => {
    await r.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await until('the replica in sync', () => ask(r, async (c) => /master_link_status:up/.test(await c.info('replication'))));
  } catch (err) {
    await destroy();
    throw err;
  }
  return Object.assign(r, { destroy });
}

/**
 * A replication link that lags: a TCP relay on 127.0.0.1 for a replica to follow instead of the
 * primary, passing what the primary sends `delayMs` late (in order) and the replica's answers at
 * once. A write then reaches the replica a known time after the primary applied it, so a test can
 * tell an answer that waited for the replica (WAIT) from one that went out before it.
 */
export async function startLaggingLink(primaryPort: number, delayMs: number): Promise<{ port: number; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  const server = createNetServer((replica) => {
    const primary = connect(primaryPort, '127.0.0.1');
    for (const s of [replica, primary]) {
      sockets.add(s);
      s.on('error', () => {
        replica.destroy();
        primary.destroy();
      });
      s.on('close', () => sockets.delete(s));
    }
    primary.on('data', (chunk: Buffer) => {
      setTimeout(() => {
        if (!replica.destroyed) replica.write(chunk);
      }, delayMs);
    });
    replica.pipe(primary);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
