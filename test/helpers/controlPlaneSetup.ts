import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Cluster } from './cluster.js';

// jest compiles globalSetup to CommonJS and does not apply moduleNameMapper here: load the
// TypeScript file by its real name through jest's require hook.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const { SHARED_CLUSTER_ENV, startCluster } = require('./cluster.ts') as typeof import('./cluster.js');
// eslint-disable-next-line @typescript-eslint/no-require-imports
const { default: buildDist } = require('./globalSetup.ts') as typeof import('./globalSetup.js');

/**
 * One control plane (etcd + kube-apiserver + kube-controller-manager) for the whole
 * test/e2e/controlplane suite: started once here, reached by every test file through useCluster(),
 * stopped in globalTeardown.ts. Each test file works in namespaces of its own. dist/ is compiled
 * first, as the other tiers compile it (test/helpers/globalSetup.ts; OPSGATE_SKIP_BUILD=1 skips it):
 * tests of the API and worker processes run it.
 */
export default async function globalSetup(): Promise<void> {
  await buildDist();
  const t0 = Date.now();
  const cluster = await startCluster();
  (globalThis as { __opsgateCluster?: Cluster }).__opsgateCluster = cluster;
  // eslint-disable-next-line @typescript-eslint/unbound-method -- dropped from what is written, never called
  const { stop: _stop, ...info } = cluster;
  const file = join(cluster.dir, 'cluster.json');
  writeFileSync(file, JSON.stringify(info), { mode: 0o600 });
  process.env[SHARED_CLUSTER_ENV] = file;
  process.stderr.write(`\n[test/e2e/controlplane] control plane at ${cluster.server} ready in ${Date.now() - t0} ms\n`);
}
