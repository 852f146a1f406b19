/**
 * test/e2e/controlplane runs against one shared real control plane (test/helpers/controlPlaneSetup.ts
 * starts it, controlPlaneTeardown.ts stops it): `make test-k8s`, part of `make e2e`. Files run one at a time (they share
 * the apiserver, and the machine has 2 cores).
 */
import base from '../../../jest.config.js';

export default {
  ...base,
  rootDir: '../../..',
  testMatch: ['<rootDir>/test/e2e/controlplane/**/*.test.ts'],
  // the root config excludes test/e2e (it needs the cluster below): not here
  testPathIgnorePatterns: ['/node_modules/'],
  globalSetup: '<rootDir>/test/helpers/controlPlaneSetup.ts',
  globalTeardown: '<rootDir>/test/helpers/controlPlaneTeardown.ts',
  testTimeout: 180000,
  maxWorkers: 1,
};
