// ESLint over src, worker, test and bench: typescript-eslint's type-aware recommended rules
// (`make lint`). Formatting is Prettier's (.prettierrc.json), not ESLint's.
import js from '@eslint/js';
import { defineConfig } from 'eslint/config';
import tseslint from 'typescript-eslint';

export default defineConfig(
  { ignores: ['dist/', 'node_modules/', '.tools/', 'artifacts/', 'coverage/', '.dev/'] },
  {
    files: ['**/*.ts'],
    extends: [js.configs.recommended, tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      // An async function that implements a Promise-returning interface (a fake provider, a hook)
      // is the plain way to write one whose body happens not to wait.
      '@typescript-eslint/require-await': 'off',
      // A handler registered before the value it reads exists (a signal handler set up before the
      // worker starts) needs a `let` assigned once, later.
      'prefer-const': ['error', { ignoreReadBeforeAssign: true }],
      // `_name` and rest siblings are how the code drops a field or an argument on purpose.
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrorsIgnorePattern: '^_', ignoreRestSiblings: true },
      ],
    },
  },
  {
    files: ['test/**/*.ts'],
    rules: {
      // Tests read the JSON that real servers answer (supertest's body, fetch's json(), kubectl -o json)
      // and assert on it: the assertion is the type check, a declared type for each answer would only repeat it.
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
    },
  },
);
