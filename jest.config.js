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
  // test/e2e needs Kubernetes: its suites run under their own configs (`make e2e`):
  // test/e2e/controlplane/jest.config.js (a shared control plane), test/e2e/node/jest.config.js (a real node).
  testPathIgnorePatterns: ['/node_modules/', '<rootDir>/test/e2e/'],
  // Builds dist/ once per run so tests that spawn the real processes run the current code.
  globalSetup: '<rootDir>/test/helpers/globalSetup.ts',
  testTimeout: 30000,
  maxWorkers: 2,
};
