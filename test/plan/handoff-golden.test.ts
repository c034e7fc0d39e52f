// The encoder handoff as the dump shows it: `lfc compile --dump-after encoder-handoff` on tiny-vlm-moe over
// 4 ranks at levels 2 and 3, every program, filtered to the handoff instructions (broadcast,
// gather_v, scatter_v) with their groups, roots, row counts and events. Goldens under
// test/goldens/handoff.*.txt (UPDATE_GOLDENS=1 rewrites them).
import { describe, it } from 'vitest';
import { compile } from '../../compiler/pipeline.js';
import { parseCompileArgs } from '../../cli/compile.js';
import { parseProgram, printProgram } from '../../compiler/plan/program-text.js';
import { expectGolden } from '../golden.js';

const HANDOFF = new Set(['broadcast', 'gather_v', 'scatter_v']);
const BATCH = ['--global-batch-size', '4', '--micro-batch-size', '1', '--nproc-per-node', '4'];

describe('the program after the encoder-handoff pass', () => {
  it.each([
    ['level2-tp4', ['--tp', '4', '--enable-encoder-hetero-dp']],
    ['level2-tp2-pp2', ['--tp', '2', '--pp', '2', '--enable-encoder-hetero-dp']],
    ['level3-tp2-pp2', ['--tp', '2', '--pp', '2', '--enable-full-hetero-dp']],
    ['level3-tp2-dp2', ['--tp', '2', '--enable-full-hetero-dp']],
  ])('%s', (name, flags) => {
    const { options } = parseCompileArgs(['tiny-vlm-moe', ...BATCH, ...flags]);
    const ids = compile(options).programs.map((p) => p.id);
    const text = ids.map((id) => {
      let dump = '';
      compile({
        ...options,
        dumpAfter: 'encoder-handoff',
        dumpProgram: id,
        onDump: (t) => (dump = t),
      });
      // the dump is the whole program's text: parsed back, printed with the handoff only
      return printProgram(parseProgram(dump), { instructions: (ins) => HANDOFF.has(ins.op) });
    });
    expectGolden(`handoff.${name}.txt`, text.join('\n'));
  });
});
