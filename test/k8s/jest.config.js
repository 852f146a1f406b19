/**
 * test/k8s runs against one shared real control plane (globalSetup.ts starts it,
 * globalTeardown.ts stops it): `make test-k8s`. Files run one at a time (they share
 * the apiserver, and the machine has 2 cores).
 */
import base from '../../jest.config.js';

export default {
  ...base,
  rootDir: '../..',
  testMatch: ['<rootDir>/test/k8s/**/*.test.ts'],
  // the root config may exclude test/k8s (it needs the cluster below): not here
  testPathIgnorePatterns: ['/node_modules/'],
  globalSetup: '<rootDir>/test/k8s/globalSetup.ts',
  globalTeardown: '<rootDir>/test/k8s/globalTeardown.ts',
  testTimeout: 180000,
  maxWorkers: 1,
};
