import js from '@eslint/js';
import tseslint from 'typescript-eslint';

// The code's layers, bottom up: ir ← passes ← compiler ← runtime ← cli. A folder imports only the
// folders below it; viz/ (the visualizer `lfc viz` writes) takes compiler/ and runtime/, never
// cli/. Tests, benches and examples may import anything. The browser app (viz/app/) imports only
// itself and viz/model.ts (types), since it is bundled for the browser.
const LAYERING =
  'layering: ir ← passes ← compiler ← runtime ← cli; viz/ uses compiler/ and runtime/';

/** The files of `folder` import none of `forbidden` (relative imports, at any depth). */
function layer(folder, forbidden) {
  const names = forbidden.map((f) => `${f}/`);
  const list = names.length > 1 ? `${names.slice(0, -1).join(', ')} or ${names.at(-1)}` : names[0];
  const pattern = {
    regex: `^(\\.\\./)+(${forbidden.join('|')})(/|$)`,
    message: `${folder}/ must not import ${list} (${LAYERING})`,
  };
  return {
    files: [`${folder}/**`],
    rules: { 'no-restricted-imports': ['error', { patterns: [pattern] }] },
  };
}

export default tseslint.config(
  {
    ignores: [
      'node_modules/',
      'dist/',
      'build/',
      'runtime-native/build/',
      'test/reference/',
      'artifacts/',
    ],
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      globals: { process: 'readonly', console: 'readonly', URL: 'readonly', Buffer: 'readonly' },
    },
    rules: {
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_' },
      ],
      'no-constant-condition': ['error', { checkLoops: false }],
    },
  },
  {
    // a function a reader can hold in their head: split a longer one into its steps
    files: ['compiler/**', 'passes/**'],
    rules: { 'max-lines-per-function': ['error', { max: 150 }] },
  },
  layer('ir', ['passes', 'compiler', 'runtime', 'cli', 'viz']),
  layer('passes', ['compiler', 'runtime', 'cli', 'viz']),
  layer('compiler', ['runtime', 'cli', 'viz']),
  layer('runtime', ['cli', 'viz']),
  layer('viz', ['cli']),
  {
    files: ['viz/app/**'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              regex: '^(\\.\\./)+(ir|passes|compiler|runtime|cli)(/|$)',
              message: 'viz/app/ runs in the browser: it imports only viz/app/ and viz/model.ts',
            },
          ],
        },
      ],
    },
  },
);
