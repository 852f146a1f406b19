import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO, run } from '../../helpers/cluster.js';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import { waitFor } from '../../helpers/nodeSupport.js';

/**
 * The images `make images` built with podman from the Dockerfile (not a replay of it): who they run
 * as, what node_modules they carry, that each entrypoint starts and serves on a real Redis with the
 * chart's read-only root filesystem, and how big they are (artifacts/images.json).
 */
jest.setTimeout(300_000);

const pkg = JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as {
  version: string;
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
};
const TAG = process.env.APP_TAG ?? pkg.version;
const IMAGES = { api: `localhost/opsgate-api:${TAG}`, worker: `localhost/opsgate-worker:${TAG}` };
const ENV = { CONTAINERS_CONF: join(REPO, 'hack', 'images', 'containers.conf') };

function podman(args: string[], timeoutMs = 120_000) {
  return run('podman', args, { env: ENV, timeoutMs });
}

async function inspect(image: string) {
  const r = await podman(['image', 'inspect', image]);
  expect(r.code).toBe(0);
  return (JSON.parse(r.stdout) as Array<Record<string, any>>)[0]!;
}

/** Run node inside the image (no network, read-only root as the chart runs it) and return stdout. */
async function nodeIn(image: string, script: string): Promise<string> {
  const r = await podman([
    'run',
    '--rm',
    '--network',
    'none',
    '--read-only',
    '--tmpfs',
    '/tmp',
    '--entrypoint',
    'node',
    image,
    '-e',
    script,
  ]);
  if (r.code !== 0) throw new Error(`node in ${image} exited ${r.code}: ${r.stderr}`);
  return r.stdout;
}

describe.each(Object.entries(IMAGES))('image %s', (target, image) => {
  test('runs as UID/GID 1000 with an exec-form CMD of the compiled entrypoint (node is PID 1 and gets SIGTERM)', async () => {
    const i = await inspect(image);
    expect(i.Config.User).toBe('1000:1000');
    expect(i.Config.Cmd).toEqual(['node', target === 'api' ? 'dist/src/server.js' : 'dist/worker/index.js']);
    expect(i.Config.WorkingDir).toBe('/app');
    expect(i.Config.Env).toContain('NODE_ENV=production');
    expect(i.Config.Env).toContain('MALLOC_ARENA_MAX=2');
    expect(await nodeIn(image, 'process.stdout.write(`${process.getuid()}:${process.getgid()} ${process.version}`)')).toBe(
      `1000:1000 v${process.versions.node}`,
    );
  });

  test('carries every production dependency and no package the lockfile marks dev-only; the app files are not writable by the app user', async () => {
    const out = JSON.parse(
      await nodeIn(
        image,
        `
      const fs = require('fs'), path = require('path');
      const found = [];
      const walk = (dir, rel) => {
        for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
          if (!e.isDirectory() || e.name === '.bin') continue;
          const d = path.join(dir, e.name), r = rel + '/' + e.name;
          if (e.name.startsWith('@')) { walk(d, r); continue; }
          if (fs.existsSync(path.join(d, 'package.json'))) found.push(r);
          if (fs.existsSync(path.join(d, 'node_modules'))) walk(path.join(d, 'node_modules'), r + '/node_modules');
        }
      };
      walk('/app/node_modules', 'node_modules');
      let writable = true; try { fs.writeFileSync('/app/dist/x', ''); } catch { writable = false; }
      console.log(JSON.stringify({ found, writable }));`,
      ),
    ) as { found: string[]; writable: boolean };
    const lock = JSON.parse(readFileSync(join(REPO, 'package-lock.json'), 'utf8')) as { packages: Record<string, { dev?: boolean }> };
    const devOnly = Object.entries(lock.packages)
      .filter(([k, v]) => k && v.dev === true)
      .map(([k]) => k);
    expect(devOnly.length).toBeGreaterThan(100); // jest, typescript, swc, playwright-core, ... and theirs
    expect(out.found.filter((p) => devOnly.includes(p))).toEqual([]);
    for (const d of Object.keys(pkg.dependencies)) expect(out.found).toContain(`node_modules/${d}`);
    for (const d of ['jest', 'typescript', '@swc/core', 'fast-check', 'playwright-core'])
      expect(out.found).not.toContain(`node_modules/${d}`);
    expect(out.writable).toBe(false);
  });
});

describe('entrypoints start and stop on a real Redis', () => {
  let redis: RedisServer;
  const sizes: Record<string, number> = {};

  beforeAll(async () => {
    redis = await startRedis();
  });
  afterAll(async () => {
    await redis?.destroy();
    mkdirSync(join(REPO, 'artifacts'), { recursive: true });
    writeFileSync(join(REPO, 'artifacts', 'images.json'), JSON.stringify(sizes, null, 2));
  });

  async function runDetached(image: string, env: Record<string, string>): Promise<string> {
    const r = await podman([
      'run',
      '-d',
      '--network',
      'host',
      '--read-only',
      '--tmpfs',
      '/tmp',
      ...Object.entries(env).flatMap(([k, v]) => ['-e', `${k}=${v}`]),
      image,
    ]);
    if (r.code !== 0) throw new Error(`podman run ${image}: ${r.stderr}`);
    return r.stdout.trim();
  }

  async function stopGracefully(id: string): Promise<number> {
    await podman(['stop', '--time', '20', id], 60_000);
    const code = Number((await podman(['inspect', '--format', '{{.State.ExitCode}}', id])).stdout.trim());
    await podman(['rm', '-f', id]);
    return code;
  }

  test.each(Object.entries(IMAGES))('%s', async (target, image) => {
    const [port, metricsPort] = [await freePort(), await freePort()];
    const id = await runDetached(image, {
      OPS_API_KEY_ROLES: 'image-test-operator-key-0001:operator',
      REDIS_URL: redis.url,
      PORT: String(port),
      METRICS_PORT: String(metricsPort),
      LOG_LEVEL: 'info',
    });
    try {
      if (target === 'api') {
        const health = await waitFor(
          'api /health',
          async () => {
            const r = await fetch(`http://127.0.0.1:${port}/health`).catch(() => undefined);
            return r?.ok ? await r.json() : undefined;
          },
          60_000,
        );
        expect(health).toEqual({ status: 'ok' });
        expect((await fetch(`http://127.0.0.1:${port}/ready`)).status).toBe(200);
      }
      const metrics = await waitFor(
        `${target} /metrics`,
        async () => {
          const r = await fetch(`http://127.0.0.1:${metricsPort}/metrics`).catch(() => undefined);
          return r?.ok ? await r.text() : undefined;
        },
        60_000,
      );
      expect(metrics).toMatch(new RegExp(`opsgate_build_info\\{[^}]*component="${target}"`));
    } finally {
      // SIGTERM -> graceful shutdown -> exit 0 within podman's 20 s
      expect(await stopGracefully(id)).toBe(0);
    }
    const size = (await inspect(image)).Size as number;
    sizes[image] = size;
    process.stderr.write(`[images] ${image}: ${(size / 1e6).toFixed(0)} MB\n`);
    expect(size).toBeGreaterThan(50e6);
  });
});
