/** Jest runs the TypeScript sources as native ESM (node --experimental-vm-modules), compiled by swc. */
export default {
  testEnvironment: 'node',
  extensionsToTreatAsEsm: ['.ts'],
  transform: {
    '^.+\\.ts$': [
      '@swc/jest',
      {
        jsc: { parser: { syntax: 'typescript' }, target: 'es2022' },
        module: { type: 'es6' },
        sourceMaps: 'inline',
      },
    ],
  },
  moduleNameMapper: { '^(\\.{1,2}/.*)\\.js$': '$1' },
  testMatch: ['<rootDir>/test/**/*.test.ts'],
  // test/k8s needs the shared control plane of its own config (test/k8s/jest.config.js), test/node
  // the real node `make e2e` starts (test/node/jest.config.js).
  testPathIgnorePatterns: ['/node_modules/', '<rootDir>/test/k8s/', '<rootDir>/test/node/'],
  // Builds dist/ once per run so tests that spawn the real processes run the current code.
  globalSetup: '<rootDir>/test/helpers/globalSetup.ts',
  testTimeout: 30000,
  maxWorkers: 2,
};
