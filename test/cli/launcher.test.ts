// How lfc starts: bin/lfc.js's first line holds node's flags (`#!/usr/bin/env -S node FLAGS`);
// run as a program it starts under them, `./lfc` passes the same ones, and the benches read them
// from there (bench/node-flags.ts). Each entry point is started with a preloaded probe that writes
// the lfc process's node flags (process.execArgv) to a file: a first line node rejects, or an entry
// point that starts node without the flags, fails here.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, expect, it } from 'vitest';
import { lfcNodeFlags } from '../../bench/node-flags.js';
import { projectRoot } from '../../compiler/paths.js';

const VERSION = /^\d+\.\d+\.\d+\n$/;
const dir = mkdtempSync(join(tmpdir(), 'lfc-launcher-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const probe = join(dir, 'probe.cjs');
writeFileSync(
  probe,
  `if (/bin[\\\\/]lfc\\.js$/.test(process.argv[1] ?? ''))
  require('node:fs').writeFileSync(process.env.LFC_PROBE_OUT, JSON.stringify(process.execArgv));
`,
);

it('bin/lfc.js names node flags that node accepts', () => {
  const flags = lfcNodeFlags();
  expect(flags.length).toBeGreaterThan(0);
  for (const f of flags) expect(f).toMatch(/^--[a-z-]+(=\S+)?$/);
  const r = spawnSync(process.execPath, [...flags, '-e', 'process.stdout.write("ok")'], {
    encoding: 'utf8',
  });
  expect(r.stderr).toBe('');
  expect(r.stdout).toBe('ok');
});

it.each(['bin/lfc.js', 'lfc'])('%s starts lfc under those flags', (cmd) => {
  const out = join(dir, `${cmd.replace('/', '_')}.json`);
  const r = spawnSync(join(projectRoot(), cmd), ['--version'], {
    encoding: 'utf8',
    env: { ...process.env, NODE_OPTIONS: `--require ${probe}`, LFC_PROBE_OUT: out },
  });
  expect(r.status, `${cmd}: ${r.stderr}`).toBe(0);
  expect(r.stdout).toMatch(VERSION);
  expect(JSON.parse(readFileSync(out, 'utf8'))).toEqual(lfcNodeFlags());
});
