/**
 * test/node: end-to-end on a real node (hack/node.sh) with the images of `make images`.
 * `make e2e` starts the node, runs this config, and always tears the node down; files run one at a
 * time (one node, 2 cores).
 */
import base from '../../jest.config.js';

export default {
  ...base,
  rootDir: '../..',
  testMatch: ['<rootDir>/test/node/**/*.test.ts'],
  testPathIgnorePatterns: ['/node_modules/'],
  globalSetup: '<rootDir>/test/node/globalSetup.ts',
  testTimeout: 600000,
  maxWorkers: 1,
};
