// ESLint 9 flat config: typescript-eslint's type-aware recommended rules over src/, plain
// recommended rules over the tests.  `npm run lint`.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/', 'node_modules/', 'style/'] },
  {
    files: ['src/**/*.ts'],
    extends: [js.configs.recommended, ...tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname }
    },
    rules: {
      // `_name` marks a parameter kept for its position (signal slots: sender, args)
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
      // Lumino signals take a method and its `this` apart (`signal.connect(this._onX, this)`),
      // which this rule cannot see: every finding here was that idiom
      '@typescript-eslint/unbound-method': 'off',
      eqeqeq: ['error', 'always'],
      'prefer-const': 'error'
    }
  },
  {
    files: ['test/**/*.mjs', '*.mjs'],
    extends: [js.configs.recommended],
    languageOptions: { globals: { console: 'readonly', performance: 'readonly', process: 'readonly', URL: 'readonly' } }
  }
);
