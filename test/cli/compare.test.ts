// lfc compare: the reports lfc compile keeps beside its plans (report.json, the --json report),
// side by side; its user errors.
import { mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { cli } from '../helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-compare-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const LAYOUT = ['--nproc-per-node', '4', '--pp', '2', '--vpp', '2', '--ep', '2'];
const BATCH = ['--global-batch-size', '8', '--no-advice'];

describe('lfc compare', () => {
  const a = join(dir, 'hetero-tp');
  const b = join(dir, 'full-separation');
  it('keeps the --json report beside the plan, and sets plans side by side', async () => {
    const ca = await cli('compile', 'tiny-vlm-moe', ...LAYOUT, ...BATCH, '-o', a, '--json');
    const cb = await cli(
      'compile',
      'tiny-vlm-moe',
      ...LAYOUT,
      ...BATCH,
      '--enable-full-hetero-dp',
      '--use-distributed-optimizer',
      '-o',
      b,
      '--json',
    );
    expect([ca.code, cb.code]).toEqual([0, 0]);
    expect(JSON.parse(readFileSync(join(a, 'report.json'), 'utf8'))).toEqual(JSON.parse(ca.out));

    const j = await cli('compare', a, b, '--json');
    expect(j.code).toBe(0);
    const plans = (JSON.parse(j.out) as { plans: { dir: string; forecast: object }[] }).plans;
    expect(plans.map((p) => p.dir)).toEqual([a, b]);
    expect(plans[1].forecast).toEqual((JSON.parse(cb.out) as { forecast: object }).forecast);

    const t = await cli('compare', a, b);
    expect(t.code).toBe(0);
    const ta = (JSON.parse(ca.out) as { forecast: { tokensPerSecond: number } }).forecast;
    const tb = (JSON.parse(cb.out) as { forecast: { tokensPerSecond: number } }).forecast;
    const line = (label: string) => t.out.split('\n').find((l) => l.startsWith(label))!;
    expect(line('tokens/s')).toContain(ta.tokensPerSecond.toFixed(0));
    expect(line('tokens/s')).toContain(tb.tokensPerSecond.toFixed(0));
    expect(line(`vs ${a}`)).toContain(`${(tb.tokensPerSecond / ta.tokensPerSecond).toFixed(3)}×`);
    expect(line('layout')).toContain('encoder level 3');
    expect(line('features')).toContain('--use-distributed-optimizer');
  });

  it('refuses what it cannot compare, in one line', async () => {
    const empty = join(dir, 'empty');
    mkdirSync(empty);
    const bad = join(dir, 'bad');
    mkdirSync(bad);
    writeFileSync(join(bad, 'report.json'), '{"model": 3');
    for (const [args, message] of [
      [[a], /give two plan directories or more/],
      [[a, empty], /empty: no report\.json/],
      [[a, bad], /bad\/report\.json: malformed JSON/],
    ] as const) {
      const r = await cli('compare', ...args);
      expect(r.code).toBe(2);
      expect(r.err).toMatch(message);
      expect(r.err.trim().split('\n')).toHaveLength(1);
    }
    writeFileSync(join(bad, 'report.json'), '{"model": 3}');
    const r = await cli('compare', a, bad);
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/not an lfc compile report/);
  });
});
