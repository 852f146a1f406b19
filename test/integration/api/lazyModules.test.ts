import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, it } from '@jest/globals';
import { DIST_DIR } from '../../helpers/processes.js';

/**
 * Bull Board is loaded only when the admin UI is mounted (src/routes/admin.ts): with
 * ADMIN_UI_ENABLED off (the chart's default) the API process does not carry it (its RSS).
 * Checked in a fresh node process on the built code: jest's own module registry would hide it.
 */
function loadedAfter(script: string): Promise<string[]> {
  const appUrl = pathToFileURL(join(DIST_DIR, 'src', 'routes', 'admin.js')).href;
  const program = `
    import { createRequire } from 'node:module';
    const admin = await import(${JSON.stringify(appUrl)});
    ${script}
    const cache = createRequire(import.meta.url).cache;
    process.stdout.write(JSON.stringify(Object.keys(cache).filter((k) => k.includes('@bull-board'))));
  `;
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ['--input-type=module', '-e', program], { cwd: DIST_DIR, timeout: 60_000 }, (err, stdout, stderr) =>
      err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(JSON.parse(stdout) as string[]),
    );
  });
}

describe('Bull Board is loaded only with the admin UI', () => {
  it('importing the admin routes module loads none of @bull-board', async () => {
    expect(await loadedAfter('')).toEqual([]);
  }, 90_000);

  it('building the admin router loads it (so the check above can fail)', async () => {
    const loaded = await loadedAfter(`
      const { Queue } = await import('bullmq');
      const q = new Queue('ops', { connection: { host: '127.0.0.1', port: 1, lazyConnect: true, maxRetriesPerRequest: null } });
      admin.createAdminRouter({ queues: [q], apiKeys: [], logger: { info() {}, warn() {}, error() {}, debug() {} } });
      await q.close().catch(() => undefined);
    `);
    expect(loaded.some((k) => k.includes('@bull-board/api'))).toBe(true);
    expect(loaded.some((k) => k.includes('@bull-board/express'))).toBe(true);
  }, 90_000);
});

/**
 * @kubernetes/client-node (about 78 MB of RSS) is loaded by the API on its first GET
 * /ops/hosts/{host}, not when the host-status provider or the kubeconfig loader is imported and
 * built: checked in a fresh node process on the built code, with a resolve hook listing every
 * module the process loads.
 */
function kubeClientLoadedAfter(script: string): Promise<boolean> {
  const dir = (p: string) => JSON.stringify(pathToFileURL(join(DIST_DIR, 'src', ...p.split('/'))).href);
  const program = `
    import { registerHooks } from 'node:module';
    const seen = [];
    registerHooks({ resolve(specifier, context, next) { const r = next(specifier, context); seen.push(r.url); return r; } });
    const { createKubeHostStatusProvider } = await import(${dir('domain/kubeHostStatus.js')});
    const { findKubeConfig, kubeConfigFromEnv, NoKubeConfigError } = await import(${dir('shared/kubeconfig.js')});
    ${script}
    process.stdout.write(JSON.stringify(seen.some((u) => u.includes('@kubernetes/client-node'))));
  `;
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ['--input-type=module', '-e', program], { cwd: DIST_DIR, timeout: 60_000 }, (err, stdout, stderr) =>
      err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(JSON.parse(stdout) as boolean),
    );
  });
}

describe('the Kubernetes client is loaded on first use', () => {
  it('importing the provider and the loader, building the provider and looking for a configuration load none of it', async () => {
    expect(
      await kubeClientLoadedAfter(`
        const provider = createKubeHostStatusProvider(kubeConfigFromEnv({ HOME: '/nonexistent' }));
        try { findKubeConfig({ HOME: '/nonexistent' }); } catch (err) { if (!(err instanceof NoKubeConfigError)) throw err; }
      `),
    ).toBe(false);
  }, 90_000);

  it('the first request loads it (so the check above can fail)', async () => {
    expect(
      await kubeClientLoadedAfter(`
        const provider = createKubeHostStatusProvider(() => ({ makeApiClient: () => ({}) }));
        await provider.deployments('ns', []).catch(() => undefined);
      `),
    ).toBe(true);
  }, 90_000);
});
