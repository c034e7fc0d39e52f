import { availableParallelism } from 'node:os';
import { defineConfig } from 'vitest/config';

/**
 * Test files that start several rank processes: each keeps the machine's cores busy by itself, so
 * they run one at a time, after the rest. The rest run a file per core: vitest's default is one
 * worker fewer than the cores, which on a 2-core machine ran every file alone while most of them
 * (compiles, simulations, one-rank runs) use one core.
 */
const RANK_FILES = [
  'test/multirank/**/*.test.ts',
  'test/train/learning.test.ts',
  'test/train/data.test.ts',
];

export default defineConfig({
  test: {
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 60_000,
    projects: [
      {
        extends: true,
        test: {
          name: 'one-process',
          include: ['test/**/*.test.ts'],
          exclude: RANK_FILES,
          maxWorkers: availableParallelism(),
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: {
          name: 'ranks',
          include: RANK_FILES,
          maxWorkers: 1,
          sequence: { groupOrder: 1 },
        },
      },
    ],
  },
});
