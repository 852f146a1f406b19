/**
 * test/e2e/node: end-to-end on a real node (hack/node.sh) with the images of `make images`.
 * `make e2e` starts the node, runs this config, and always tears the node down; files run one at a
 * time (one node, 2 cores).
 */
import base from '../../../jest.config.js';

export default {
  ...base,
  rootDir: '../../..',
  testMatch: ['<rootDir>/test/e2e/node/**/*.test.ts'],
  testPathIgnorePatterns: ['/node_modules/'],
  globalSetup: '<rootDir>/test/helpers/nodeSetup.ts',
  testTimeout: 600000,
  maxWorkers: 1,
};
