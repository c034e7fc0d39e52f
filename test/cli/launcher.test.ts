// How lfc starts: bin/lfc.js's first line holds node's flags (`#!/usr/bin/env -S node FLAGS`);
// run as a program it starts under them, `./lfc` passes the same ones, and the benches read them
// from there (bench/node-flags.ts). A line node rejects, or one `./lfc` and the benches read
// differently, fails here.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { lfcNodeFlags } from '../../bench/node-flags.js';
import { projectRoot } from '../../compiler/paths.js';

const VERSION = /^\d+\.\d+\.\d+\n$/;

it('bin/lfc.js names node flags that node accepts, and the benches read them', () => {
  const flags = lfcNodeFlags();
  expect(flags.length).toBeGreaterThan(0);
  for (const f of flags) expect(f).toMatch(/^--[a-z-]+(=\S+)?$/);
  const r = spawnSync(process.execPath, [...flags, '-e', 'process.stdout.write("ok")'], {
    encoding: 'utf8',
  });
  expect(r.stderr).toBe('');
  expect(r.stdout).toBe('ok');
});

it('bin/lfc.js as a program and ./lfc both start lfc', () => {
  for (const cmd of ['bin/lfc.js', 'lfc']) {
    const r = spawnSync(join(projectRoot(), cmd), ['--version'], { encoding: 'utf8' });
    expect(r.status, `${cmd}: ${r.stderr}`).toBe(0);
    expect(r.stdout).toMatch(VERSION);
  }
});
