import type { Cluster } from './cluster.js';

const SHARED_CLUSTER_ENV = 'OPSGATE_K8S_CLUSTER'; // test/helpers/cluster.ts

export default async function globalTeardown(): Promise<void> {
  const g = globalThis as { __opsgateCluster?: Cluster };
  await g.__opsgateCluster?.stop();
  g.__opsgateCluster = undefined;
  delete process.env[SHARED_CLUSTER_ENV];
}
