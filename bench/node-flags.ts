// The node flags lfc runs under, from bin/lfc.js's first line (`#!/usr/bin/env -S node FLAGS`), so
// that a bench that times a compile in a child process of its own runs it as `lfc` would.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export function lfcNodeFlags(): string[] {
  const bin = fileURLToPath(new URL('../bin/lfc.js', import.meta.url));
  const first = readFileSync(bin, 'utf8').split('\n', 1)[0];
  const m = /^#!.* node(?: (.*))?$/.exec(first);
  if (!m) throw new Error(`${bin}: its first line names no node (${first})`);
  return m[1] ? m[1].trim().split(/\s+/) : [];
}
