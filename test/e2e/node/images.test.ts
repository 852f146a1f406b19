import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO, run } from '../../helpers/cluster.js';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import { waitFor } from '../../helpers/nodeSupport.js';

/**
 * The images `make images` built with podman from the Dockerfile (not a replay of it): who they run
 * as, what node_modules they carry, that nothing else is in them (no shell, no package manager, no
 * npm: node, its libraries, CA certificates and tzdata), that both share their layers, that each
 * entrypoint starts and serves on a real Redis with the chart's read-only root filesystem, and how big
 * they are (at most 150 MB; artifacts/images.json).
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

  test('holds nothing but node, the libraries it links, CA certificates, tzdata and the app: no shell, no package manager, no npm', async () => {
    const out = JSON.parse(
      await nodeIn(
        image,
        `
      const fs = require('fs'), path = require('path'), tls = require('tls');
      const programs = [], all = [];
      const walk = (dir) => {
        for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
          const p = path.join(dir, e.name);
          if (['/proc', '/sys', '/dev', '/tmp', '/app', '/etc/hosts', '/etc/hostname', '/etc/resolv.conf', '/run'].includes(p)) continue;
          if (e.isDirectory()) { walk(p); continue; }
          all.push(p);
          if (e.isFile() && (fs.statSync(p).mode & 0o111) && !/\\.so(\\.[0-9]+)*$/.test(e.name)) programs.push(p);
        }
      };
      walk('/');
      console.log(JSON.stringify({
        programs,
        shells: all.filter((p) => /\\/(sh|bash|dash|ash|busybox|apt|apt-get|dpkg|npm|npx|corepack)$/.test(p)),
        npm: fs.existsSync('/usr/local/lib/node_modules/npm'),
        passwd: fs.readFileSync('/etc/passwd', 'utf8'),
        group: fs.readFileSync('/etc/group', 'utf8'),
        extraCAs: tls.getCACertificates('extra').length,
        zoneinfo: fs.existsSync('/usr/share/zoneinfo/Europe/Paris'),
        dpkg: fs.readdirSync('/var/lib/dpkg/status.d').sort(),
      }));`,
      ),
    ) as {
      programs: string[];
      shells: string[];
      npm: boolean;
      passwd: string;
      group: string;
      extraCAs: number;
      zoneinfo: boolean;
      dpkg: string[];
    };
    // node is the only program (shared objects, the dynamic loader among them, are left out by name)
    expect(out.programs).toEqual(['/usr/local/bin/node']);
    expect(out.shells).toEqual([]);
    expect(out.npm).toBe(false);
    expect(out.passwd).toMatch(/^node:x:1000:1000:/m);
    expect(out.group).toMatch(/^node:x:1000:$/m);
    // Debian's CA bundle, loaded through NODE_EXTRA_CA_CERTS (Node's own store aside)
    expect(out.extraCAs).toBeGreaterThan(100);
    expect(out.zoneinfo).toBe(true);
    // the Debian packages the files come from, recorded for scanners (distroless layout)
    for (const p of ['libc6', 'libstdc++6', 'libgcc-s1', 'tzdata', 'ca-certificates']) expect(out.dpkg).toContain(p);
  });

  test('a shell cannot be started in it: exec of sh fails with "not found"', async () => {
    const r = await podman(['run', '--rm', '--network', 'none', '--read-only', '--entrypoint', 'sh', image, '-c', 'true']);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/executable file `sh` not found|executable file not found|no such file or directory/);
  });
});

describe('api and worker images', () => {
  test('share every layer but the last', async () => {
    const [api, worker] = [(await inspect(IMAGES.api)).RootFS.Layers as string[], (await inspect(IMAGES.worker)).RootFS.Layers as string[]];
    expect(api.length).toBeGreaterThanOrEqual(3);
    expect(worker.length).toBe(api.length);
    expect(worker.slice(0, -1)).toEqual(api.slice(0, -1));
  });
});

describe('SBOM (hack/release.sh sbom, as make release writes it)', () => {
  beforeAll(async () => {
    const r = await run(join(REPO, 'hack', 'release.sh'), ['sbom'], { env: ENV, timeoutMs: 300_000 });
    if (r.code !== 0) throw new Error(`release.sh sbom: ${r.stderr}`);
  });

  test.each(Object.entries(IMAGES))(
    '%s: lists every npm package in the image, the Node version and the Debian packages',
    async (target, image) => {
      const bom = JSON.parse(readFileSync(join(REPO, 'artifacts', 'sbom', `opsgate-${target}-${TAG}.cdx.json`), 'utf8')) as {
        bomFormat: string;
        specVersion: string;
        metadata: { component: { type: string; name: string; version: string; properties: Array<{ name: string; value: string }> } };
        components: Array<{ type: string; name: string; version: string; purl?: string }>;
      };
      expect(bom.bomFormat).toBe('CycloneDX');
      expect(bom.metadata.component).toMatchObject({ type: 'container', name: `opsgate-${target}`, version: TAG });
      const id = (await inspect(image)).Id as string;
      expect(bom.metadata.component.properties).toContainEqual({
        name: 'oci:image:id',
        value: id.startsWith('sha256:') ? id : `sha256:${id}`,
      });
      // what the image really carries: name@version of every package.json under /app/node_modules
      const shipped = JSON.parse(
        await nodeIn(
          image,
          `
      const fs = require('fs'), path = require('path'), found = new Set();
      const walk = (dir) => {
        for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
          if (!e.isDirectory() || e.name === '.bin') continue;
          const d = path.join(dir, e.name);
          if (e.name.startsWith('@')) { walk(d); continue; }
          const pj = path.join(d, 'package.json');
          if (fs.existsSync(pj)) { const j = JSON.parse(fs.readFileSync(pj, 'utf8')); if (j.name && j.version) found.add(j.name + '@' + j.version); }
          if (fs.existsSync(path.join(d, 'node_modules'))) walk(path.join(d, 'node_modules'));
        }
      };
      walk('/app/node_modules');
      console.log(JSON.stringify([...found]));`,
        ),
      ) as string[];
      const listed = new Set(bom.components.filter((c) => c.purl?.startsWith('pkg:npm/')).map((c) => `${c.name}@${c.version}`));
      expect(shipped.length).toBeGreaterThan(100);
      expect(shipped.filter((p) => !listed.has(p))).toEqual([]);
      for (const d of Object.keys(pkg.dependencies)) expect([...listed].some((p) => p.startsWith(`${d}@`))).toBe(true);
      expect(bom.components).toContainEqual(expect.objectContaining({ type: 'platform', name: 'node', version: process.versions.node }));
      const debs = bom.components.filter((c) => c.purl?.startsWith('pkg:deb/')).map((c) => c.name);
      for (const p of ['libc6', 'libstdc++6', 'tzdata', 'ca-certificates']) expect(debs).toContain(p);
    },
  );
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
    // the budget an SRE's platform accepts: 150 MB uncompressed (podman image inspect's Size)
    expect(size).toBeGreaterThan(50e6);
    expect(size).toBeLessThanOrEqual(150e6);
  });
});
