import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO, run } from '../../helpers/cluster.js';
import { freePort, startRedis, type RedisServer } from '../../helpers/redis.js';
import { waitFor } from '../../helpers/nodeSupport.js';
import {
  ELF_MACHINE,
  HOST_ARCH,
  NODE_ARCH,
  PODMAN_ENV,
  TAG,
  imageRef,
  podman,
  releasePlatforms,
  type Arch,
  type Target,
} from '../../helpers/images.js';

/**
 * The images `make images` / `make release` built with podman from the Dockerfile (not a replay of
 * it), for every platform of the release (linux/amd64 and linux/arm64 in make e2e): who they run as,
 * what node_modules they carry, that nothing else is in them (no shell, no package manager, no npm:
 * node, its libraries, CA certificates and tzdata), that every ELF file in them is of the image's
 * architecture and none is in node_modules, that both share their layers, that each entrypoint starts
 * and serves on a real Redis with the chart's read-only root filesystem, and how big they are (at most
 * 150 MB; artifacts/images.json). An image of another architecture than this machine's runs here
 * through qemu-user-static (binfmt_misc), as hack/images.sh built it.
 */
jest.setTimeout(600_000);

const pkg = JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as {
  version: string;
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
};
const ARCHES = releasePlatforms();
const TARGETS: Target[] = ['api', 'worker'];
const CASES = ARCHES.flatMap((arch) => TARGETS.map((target) => [imageRef(target, arch), target, arch] as [string, Target, Arch]));
/** Emulated, a process starts several times slower than natively. */
const startMs = (arch: Arch) => (arch === HOST_ARCH ? 60_000 : 240_000);

async function inspect(image: string) {
  const r = await podman(['image', 'inspect', image]);
  expect(r.code).toBe(0);
  return (JSON.parse(r.stdout) as Array<Record<string, any>>)[0]!;
}

/** Run node inside the image (no network, read-only root as the chart runs it) and return stdout. */
async function nodeIn(image: string, arch: Arch, script: string): Promise<string> {
  const r = await podman(
    [
      'run',
      '--rm',
      '--network',
      'none',
      '--read-only',
      '--tmpfs',
      '/tmp',
      '--platform',
      `linux/${arch}`,
      '--entrypoint',
      'node',
      image,
      '-e',
      script,
    ],
    300_000,
  );
  if (r.code !== 0) throw new Error(`node in ${image} exited ${r.code}: ${r.stderr}`);
  return r.stdout;
}

test('the release covers every platform make e2e builds', () => {
  expect(ARCHES).toContain(HOST_ARCH);
  if (process.env.PLATFORMS) expect(ARCHES.map((a) => `linux/${a}`).join(',')).toBe(process.env.PLATFORMS);
});

describe.each(CASES)('image %s', (image, target, arch) => {
  test('runs as UID/GID 1000 with an exec-form CMD of the compiled entrypoint (node is PID 1 and gets SIGTERM), on its platform', async () => {
    const i = await inspect(image);
    expect(`${i.Os}/${i.Architecture}`).toBe(`linux/${arch}`);
    expect(i.Config.User).toBe('1000:1000');
    expect(i.Config.Cmd).toEqual(['node', target === 'api' ? 'dist/src/server.js' : 'dist/worker/index.js']);
    expect(i.Config.WorkingDir).toBe('/app');
    expect(i.Config.Env).toContain('NODE_ENV=production');
    expect(i.Config.Env).toContain('MALLOC_ARENA_MAX=2');
    expect(
      await nodeIn(image, arch, 'process.stdout.write(`${process.getuid()}:${process.getgid()} ${process.version} ${process.arch}`)'),
    ).toBe(`1000:1000 v${process.versions.node} ${NODE_ARCH[arch]}`);
  });

  test('carries every production dependency and no package the lockfile marks dev-only; the app files are not writable by the app user', async () => {
    const out = JSON.parse(
      await nodeIn(
        image,
        arch,
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
        arch,
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

  test('every ELF file is of its architecture: node, the loader and the libraries node links; node_modules holds none (no native addon)', async () => {
    const out = JSON.parse(
      await nodeIn(
        image,
        arch,
        `
      const fs = require('fs'), path = require('path'), elf = [];
      const walk = (dir) => {
        for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
          const p = path.join(dir, e.name);
          if (['/proc', '/sys', '/dev', '/tmp', '/run'].includes(p)) continue;
          if (e.isDirectory()) { walk(p); continue; }
          if (!e.isFile()) continue;
          const fd = fs.openSync(p, 'r'), b = Buffer.alloc(20);
          const n = fs.readSync(fd, b, 0, 20, 0); fs.closeSync(fd);
          if (n === 20 && b.readUInt32BE(0) === 0x7f454c46) elf.push([p, b[5] === 2 ? b.readUInt16BE(18) : b.readUInt16LE(18)]);
        }
      };
      walk('/');
      console.log(JSON.stringify(elf));`,
      ),
    ) as Array<[string, number]>;
    const paths = out.map(([p]) => p);
    expect(paths).toContain('/usr/local/bin/node');
    expect(paths.some((p) => /\/ld-linux-(x86-64|aarch64)\.so\.\d$/.test(p))).toBe(true);
    for (const lib of ['libc.so.6', 'libstdc++.so.6', 'libgcc_s.so.1']) expect(paths.some((p) => p.endsWith(`/${lib}`))).toBe(true);
    expect(out.filter(([, m]) => m !== ELF_MACHINE[arch])).toEqual([]);
    expect(paths.filter((p) => p.startsWith('/app/'))).toEqual([]);
  });

  test('a shell cannot be started in it: exec of sh fails with "not found"', async () => {
    const r = await podman([
      'run',
      '--rm',
      '--network',
      'none',
      '--read-only',
      '--platform',
      `linux/${arch}`,
      '--entrypoint',
      'sh',
      image,
      '-c',
      'true',
    ]);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/executable file `sh` not found|executable file not found|no such file or directory/);
  });
});

describe.each(ARCHES)('api and worker images of linux/%s', (arch) => {
  test('share every layer but the last', async () => {
    const [api, worker] = [
      (await inspect(imageRef('api', arch))).RootFS.Layers as string[],
      (await inspect(imageRef('worker', arch))).RootFS.Layers as string[],
    ];
    expect(api.length).toBeGreaterThanOrEqual(3);
    expect(worker.length).toBe(api.length);
    expect(worker.slice(0, -1)).toEqual(api.slice(0, -1));
  });
});

describe('the release index', () => {
  test.each(TARGETS)('with more than one platform, localhost/opsgate-%s:<version>-index lists the image of each', async (target) => {
    const r = await podman(['manifest', 'inspect', `localhost/opsgate-${target}:${TAG}-index`]);
    if (ARCHES.length === 1) return expect(ARCHES).toEqual([HOST_ARCH]); // one platform: make push pushes the image itself
    expect(r.code).toBe(0);
    const index = JSON.parse(r.stdout) as { manifests: Array<{ digest: string; platform: { os: string; architecture: string } }> };
    expect(index.manifests.map((m) => `${m.platform.os}/${m.platform.architecture}`).sort()).toEqual(
      ARCHES.map((a) => `linux/${a}`).sort(),
    );
    for (const arch of ARCHES) {
      const digest = (await podman(['image', 'inspect', '--format', '{{.Digest}}', imageRef(target, arch)])).stdout.trim();
      expect(index.manifests.map((m) => m.digest)).toContain(digest);
    }
  });
});

describe('SBOM (hack/release.sh sbom, as make release writes it)', () => {
  beforeAll(async () => {
    const r = await run(join(REPO, 'hack', 'release.sh'), ['sbom'], {
      env: { ...PODMAN_ENV, PLATFORMS: ARCHES.map((a) => `linux/${a}`).join(',') },
      timeoutMs: 600_000,
    });
    if (r.code !== 0) throw new Error(`release.sh sbom: ${r.stderr}`);
  });

  test.each(CASES)(
    '%s: lists every npm package in the image, the Node version and the Debian packages of its architecture',
    async (image, target, arch) => {
      const bom = JSON.parse(
        readFileSync(join(REPO, 'artifacts', 'sbom', `${image.replace(/^localhost\//, '').replace(':', '-')}.cdx.json`), 'utf8'),
      ) as {
        bomFormat: string;
        specVersion: string;
        metadata: { component: { type: string; name: string; version: string; properties: Array<{ name: string; value: string }> } };
        components: Array<{ type: string; name: string; version: string; purl?: string }>;
      };
      expect(bom.bomFormat).toBe('CycloneDX');
      expect(bom.metadata.component).toMatchObject({ type: 'container', name: `opsgate-${target}`, version: TAG });
      expect(bom.metadata.component.properties).toContainEqual({ name: 'oci:image:architecture', value: arch });
      const id = (await inspect(image)).Id as string;
      expect(bom.metadata.component.properties).toContainEqual({
        name: 'oci:image:id',
        value: id.startsWith('sha256:') ? id : `sha256:${id}`,
      });
      // what the image really carries: name@version of every package.json under /app/node_modules
      const shipped = JSON.parse(
        await nodeIn(
          image,
          arch,
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
      const debs = bom.components.filter((c) => c.purl?.startsWith('pkg:deb/'));
      for (const p of ['libc6', 'libstdc++6', 'tzdata', 'ca-certificates']) expect(debs.map((c) => c.name)).toContain(p);
      // the libraries are the architecture's own packages (tzdata and ca-certificates are arch "all")
      for (const p of ['libc6', 'libstdc++6']) expect(debs.find((c) => c.name === p)?.purl).toContain(`arch=${arch}`);
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

  async function runDetached(image: string, arch: Arch, env: Record<string, string>): Promise<string> {
    const r = await podman([
      'run',
      '-d',
      '--network',
      'host',
      '--read-only',
      '--tmpfs',
      '/tmp',
      '--platform',
      `linux/${arch}`,
      ...Object.entries(env).flatMap(([k, v]) => ['-e', `${k}=${v}`]),
      image,
    ]);
    if (r.code !== 0) throw new Error(`podman run ${image}: ${r.stderr}`);
    return r.stdout.trim();
  }

  async function stopGracefully(id: string, arch: Arch): Promise<number> {
    await podman(['stop', '--time', arch === HOST_ARCH ? '20' : '60', id], 120_000);
    const code = Number((await podman(['inspect', '--format', '{{.State.ExitCode}}', id])).stdout.trim());
    await podman(['rm', '-f', id]);
    return code;
  }

  test.each(CASES)('%s', async (image, target, arch) => {
    const [port, metricsPort] = [await freePort(), await freePort()];
    const id = await runDetached(image, arch, {
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
          startMs(arch),
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
        startMs(arch),
      );
      expect(metrics).toMatch(new RegExp(`opsgate_build_info\\{[^}]*component="${target}"`));
    } finally {
      // SIGTERM -> graceful shutdown -> exit 0 within podman's 20 s (60 s emulated)
      expect(await stopGracefully(id, arch)).toBe(0);
    }
    const size = (await inspect(image)).Size as number;
    sizes[image] = size;
    process.stderr.write(`[images] ${image}: ${(size / 1e6).toFixed(0)} MB\n`);
    // the budget an SRE's platform accepts: 150 MB uncompressed (podman image inspect's Size)
    expect(size).toBeGreaterThan(50e6);
    expect(size).toBeLessThanOrEqual(150e6);
  });
});
