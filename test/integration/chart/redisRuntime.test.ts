import { afterAll, beforeAll, expect, jest, test } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { freePort } from '../../helpers/redis.js';
import { one, render, run, type K8sObject } from '../../helpers/helm.js';

/**
 * The in-chart Redis as rendered, run for real: the StatefulSet's command and the ConfigMap's
 * redis.conf start a local redis-server (paths and port moved into a temp dir), which must
 * demand the password from the Secret, use AOF with the configured fsync and noeviction, keep
 * data across a restart, and answer the chart's probe commands only with REDISCLI_AUTH.
 */
jest.setTimeout(120_000);

const PASSWORD = 'fake-redis-password-0002'; // charts/opsgate/ci/in-chart-redis-values.yaml
let dir: string;
let port: number;
let objs: K8sObject[];
let server: ChildProcess | undefined;
let script: string;
let log = '';

function localize(text: string): string {
  return text
    .replace(/(^|[\s'"=])\/(etc\/redis|tmp)\//gm, (_m, pre: string, d: string) => `${pre}${dir}/${d === 'tmp' ? 'tmp' : 'etc'}/`)
    .replace(/^dir \/data$/m, `dir ${dir}/data`)
    .replace(/^port 6379$/m, `port ${port}`)
    .replace(/^bind .*$/m, 'bind 127.0.0.1')
    .replaceAll('-p 6379', `-p ${port}`);
}

async function start(): Promise<void> {
  server = spawn('sh', ['-c', script], { env: { PATH: process.env.PATH, REDIS_PASSWORD: PASSWORD }, stdio: ['ignore', 'pipe', 'pipe'] });
  server.stdout!.on('data', (d) => (log += d));
  server.stderr!.on('data', (d) => (log += d));
  const deadline = Date.now() + 15_000;
  for (;;) {
    const r = await run('redis-cli', ['-h', '127.0.0.1', '-p', String(port), 'ping'], {
      env: { PATH: process.env.PATH, REDISCLI_AUTH: PASSWORD },
    });
    if (r.stdout.trim() === 'PONG') return;
    if (Date.now() > deadline) throw new Error(`redis-server did not start:\n${log}`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

async function stop(): Promise<void> {
  if (!server || server.exitCode !== null) return;
  const exited = new Promise((r) => server!.once('exit', r));
  server.kill('SIGTERM'); // exec'd: the signal reaches redis-server itself, which flushes the AOF
  await exited;
  server.stdout?.destroy();
  server.stderr?.destroy();
}

function client(password?: string): Redis {
  const c = new Redis({ port, host: '127.0.0.1', password, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  c.on('error', () => {});
  return c;
}

beforeAll(async () => {
  objs = await render({ files: ['in-chart-redis-values.yaml'] });
  dir = mkdtempSync(join(tmpdir(), 'opsgate-chart-redis-'));
  port = await freePort();
  for (const d of ['etc', 'tmp', 'data']) mkdirSync(join(dir, d));
  chmodSync(join(dir, 'tmp'), 0o1777);
  writeFileSync(join(dir, 'etc/redis.conf'), localize(one(objs, 'ConfigMap', 'opsgate-redis').data['redis.conf']));
  const container = one(objs, 'StatefulSet', 'opsgate-redis').spec.template.spec.containers[0];
  expect(container.command.slice(0, 2)).toEqual(['sh', '-c']);
  script = localize(container.command[2]);
  expect(script).toContain('exec redis-server');
  await start();
});

afterAll(async () => {
  await stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test('requires the password from the Secret', async () => {
  const cli = (auth?: string) =>
    run('redis-cli', ['-h', '127.0.0.1', '-p', String(port), 'ping'], {
      env: { PATH: process.env.PATH, ...(auth ? { REDISCLI_AUTH: auth } : {}) },
    });
  expect((await cli()).stdout).toMatch(/NOAUTH/);
  expect((await cli('not-the-password')).stdout + (await cli('not-the-password')).stderr).toMatch(/WRONGPASS|AUTH failed|invalid/i);
  expect((await cli(PASSWORD)).stdout.trim()).toBe('PONG');
});

test('the password file is private and not on the command line', async () => {
  expect(statSync(join(dir, 'tmp/auth.conf')).mode & 0o077).toBe(0);
  const ps = await run('ps', ['-o', 'args=', '-p', String(server!.pid)]);
  expect(ps.stdout).toMatch(/redis-server/); // exec: the shell was replaced by redis-server
  expect(ps.stdout).not.toContain(PASSWORD);
});

test('AOF persistence with the configured fsync, noeviction, maxmemory', async () => {
  const c = client(PASSWORD);
  await c.connect();
  expect(await c.config('GET', 'appendonly')).toEqual(['appendonly', 'yes']);
  expect(await c.config('GET', 'appendfsync')).toEqual(['appendfsync', 'always']);
  expect(await c.config('GET', 'maxmemory-policy')).toEqual(['maxmemory-policy', 'noeviction']);
  expect(await c.config('GET', 'maxmemory')).toEqual(['maxmemory', String(256 * 1024 * 1024)]);
  await c.quit();
});

test('the probe commands pass with REDISCLI_AUTH and fail without it', async () => {
  const container = one(objs, 'StatefulSet', 'opsgate-redis').spec.template.spec.containers[0];
  for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
    const [shell, flag, cmd] = container[probe].exec.command as string[];
    const ok = await run(shell!, [flag!, localize(cmd!)], { env: { PATH: process.env.PATH, REDISCLI_AUTH: PASSWORD } });
    expect([probe, ok.code]).toEqual([probe, 0]);
    const denied = await run(shell!, [flag!, localize(cmd!)], { env: { PATH: process.env.PATH } });
    expect([probe, denied.code]).toEqual([probe, 1]);
  }
});

test('queue data survives a restart (AOF on the data volume)', async () => {
  const c = client(PASSWORD);
  await c.connect();
  await c.set('opsgate:chart-test', 'kept');
  await c.rpush('opsgate:chart-list', 'a', 'b');
  await c.quit();
  await stop();
  await start();
  const d = client(PASSWORD);
  await d.connect();
  expect(await d.get('opsgate:chart-test')).toBe('kept');
  expect(await d.lrange('opsgate:chart-list', 0, -1)).toEqual(['a', 'b']);
  await d.quit();
  expect(statSync(join(dir, 'data/appendonlydir')).isDirectory()).toBe(true);
});
