import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Cluster } from './cluster.js';

// jest compiles globalSetup to CommonJS and does not apply moduleNameMapper here: load the
// TypeScript file by its real name through jest's require hook.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const { REPO, SHARED_CLUSTER_ENV, startCluster } = require('./cluster.ts') as typeof import('./cluster.js');

/**
 * dist/ compiled (hack/build.mjs), for the files that spawn the built API and worker
 * (test/helpers/processes.ts), as the root config's globalSetup does; OPSGATE_SKIP_BUILD=1 skips
 * it. A compile error is reported, not fatal: the files that spawn nothing still run.
 */
function build(): Promise<void> {
  if (process.env.OPSGATE_SKIP_BUILD === '1') return Promise.resolve();
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ['hack/build.mjs', 'tsconfig.build.json', 'dist'], {
      cwd: REPO,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
    child.stderr.on('data', (c: Buffer) => (out += c.toString('utf8')));
    child.on('error', (err) => {
      process.stderr.write(`\n[test/e2e/controlplane] could not run hack/build.mjs: ${err.message}\n`);
      resolve();
    });
    child.on('close', (code) => {
      if (code !== 0) {
        const head = out.split('\n').slice(0, 20).join('\n');
        process.stderr.write(`\n[test/e2e/controlplane] hack/build.mjs reported errors (files spawning dist/ may fail):\n${head}\n`);
      }
      resolve();
    });
  });
}

/**
 * One control plane (etcd + kube-apiserver + kube-controller-manager) for the whole
 * test/e2e/controlplane suite: started once here, reached by every test file through useCluster(),
 * stopped in globalTeardown.ts. Each test file works in namespaces of its own.
 */
export default async function globalSetup(): Promise<void> {
  const t0 = Date.now();
  // the build and the control plane's start overlap
  const built = build();
  const cluster = await startCluster();
  await built;
  (globalThis as { __opsgateCluster?: Cluster }).__opsgateCluster = cluster;
  // eslint-disable-next-line @typescript-eslint/unbound-method -- dropped from what is written, never called
  const { stop: _stop, ...info } = cluster;
  const file = join(cluster.dir, 'cluster.json');
  writeFileSync(file, JSON.stringify(info), { mode: 0o600 });
  process.env[SHARED_CLUSTER_ENV] = file;
  process.stderr.write(`\n[test/e2e/controlplane] control plane at ${cluster.server} ready in ${Date.now() - t0} ms\n`);
}
