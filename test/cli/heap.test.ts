// A plan too large for node's heap is a user error after its first program, naming what it would
// take and how to raise the heap, not V8's out-of-memory abort minutes later: `lfc compile` run as
// a process (bin/lfc.js, the compiled CLI) under a 300 MiB heap.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { projectRoot } from '../../compiler/paths.js';

it('a plan past the heap is refused after its first program, naming the flag and the heap it needs', () => {
  const dir = mkdtempSync(join(tmpdir(), 'lfc-heap-'));
  try {
    const args = ['compile', 'tiny-vlm-moe', '--nproc-per-node', '4', '--pp', '4'];
    const r = spawnSync(
      process.execPath,
      [join(projectRoot(), 'bin/lfc.js'), ...args, '--global-batch-size', '1024', '-o', dir],
      {
        encoding: 'utf8',
        env: { ...process.env, NODE_OPTIONS: '--max-old-space-size=300' },
        timeout: 120_000,
      },
    );
    expect(r.status, r.stderr).toBe(2);
    expect(r.stderr).toMatch(
      /^lfc: error: the plan is too large for this process's memory: program p0 holds \d+ instructions \(1024 microbatches a step\).*of the 0\.\d GiB node allows\. Lower --global-batch-size .*NODE_OPTIONS=--max-old-space-size=\d+\n$/,
    );
    expect(r.stderr).not.toMatch(/FATAL|at .*\.js:\d+/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}, 180_000);
