// The pass list: `lfc compile --list-passes` prints compile()'s own list, the README shows exactly
// that list (so it cannot drift), and --dump-after prints something for every dumpable pass:
// the graph after a graph pass, one program's text (parseable) after an emission pass.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { projectRoot } from '../../compiler/paths.js';
import { describePasses, PASSES } from '../../compiler/pipeline.js';
import { parseProgram } from '../../compiler/plan/program-text.js';
import { cli } from '../helpers.js';

const LAYOUT = ['--nproc-per-node', '4', '--pp', '2', '--vpp', '2', '--ep', '2'];
const LEVEL3 = [...LAYOUT, '--enable-full-hetero-dp', '--full-hetero-dp-cpu-offload'];
/** `lfc compile` of the level-3 layout, printing what --dump-after asks */
const DUMP = ['compile', 'tiny-vlm-moe', ...LEVEL3, '--global-batch-size', '8', '--dump-after'];

describe('the pass list', () => {
  it('lfc compile --list-passes prints it, and the README holds the same text', async () => {
    const r = await cli('compile', '--list-passes');
    expect(r.code).toBe(0);
    expect(r.out).toBe(describePasses());
    expect(r.out.split('\n').filter(Boolean)).toHaveLength(PASSES.length);
    const readme = readFileSync(join(projectRoot(), 'README.md'), 'utf8');
    const block =
      /<!-- lfc compile --list-passes -->\n```\n([\s\S]*?)```\n<!-- end of list -->/.exec(readme);
    expect(block?.[1]).toBe(r.out);
  });

  for (const pass of PASSES.filter((p) => p.dumps !== 'none'))
    it(`--dump-after ${pass.name}`, async () => {
      const r = await cli(...DUMP, pass.name);
      expect(r.err).toBe('');
      expect(r.code).toBe(0);
      expect(r.out.length).toBeGreaterThan(100);
      if (pass.dumps === 'program' && pass.name !== 'schedule') {
        const p = parseProgram(r.out);
        expect(p.id).toBe('p0');
        expect(p.instructions.length).toBeGreaterThan(0);
      }
    });

  it('--dump-program picks the program; a wrong id or pass is a one-line error', async () => {
    const r = await cli(...DUMP, 'memory-plan', '--dump-program', 'p1');
    expect(parseProgram(r.out).id).toBe('p1');
    const bad = await cli(
      'compile',
      'tiny-vlm-moe',
      ...LAYOUT,
      '--global-batch-size',
      '8',
      '--dump-after',
      'lower',
      '--dump-program',
      'p7',
    );
    expect(bad.code).toBe(2);
    expect(bad.err).toBe('lfc: error: --dump-program p7: no such program; programs: p0, p1\n');
    const graph = await cli(
      'compile',
      'tiny-vlm-moe',
      '--dump-after',
      'autodiff',
      '--dump-program',
      'p0',
    );
    expect(graph.code).toBe(2);
    expect(graph.err).toMatch(
      /^lfc: error: --dump-program p0 needs --dump-after with an emission pass/,
    );
    const verify = await cli('compile', 'tiny-vlm-moe', '--dump-after', 'verify');
    expect(verify.code).toBe(2);
    expect(verify.err).toMatch(/^lfc: error: --dump-after verify: no such pass; passes: build, /);
  });
});
