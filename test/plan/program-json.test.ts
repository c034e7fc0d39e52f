// A plan's programs are written as JSON.stringify writes them, byte for byte, though a relabeled
// program's text is made from its template's chunks (compiler/plan/program-json.ts): every program
// of the matrix's level-3 layouts (where relabeled programs are), in the plan's order, reversed
// (each relabel before its template) and without the templates.
import { describe, expect, it } from 'vitest';
import { parseCompileArgs } from '../../cli/compile.js';
import { compile } from '../../compiler/pipeline.js';
import { programJsons } from '../../compiler/plan/program-json.js';
import type { ProgramFile } from '../../compiler/plan/format.js';
import { BATCH, LAYOUTS } from '../layouts.js';

const level3 = LAYOUTS.filter((l) => l.flags.includes('--enable-full-hetero-dp'));

const texts = (programs: readonly ProgramFile[]) =>
  [...programJsons(programs)].map(([p, pieces]) => [p.id, pieces.join('')]);
const stringified = (programs: readonly ProgramFile[]) =>
  programs.map((p) => [p.id, JSON.stringify(p)]);

describe("programs' JSON", () => {
  it('the matrix has level-3 layouts with relabeled programs', () => {
    const relabeling = level3.filter((l) => {
      const { options } = parseCompileArgs([l.model, ...BATCH, ...l.flags]);
      return (options.parallel?.tp ?? 1) > 1 && !options.encoder?.vitDpBalance;
    });
    expect(relabeling.length).toBeGreaterThanOrEqual(3);
  });

  for (const l of level3)
    it(`${l.name}: JSON.stringify's bytes in any order, with or without the templates`, () => {
      const { options } = parseCompileArgs([
        l.model,
        ...['--nproc-per-node', String(l.ranks)],
        ...BATCH,
        ...l.flags,
      ]);
      const { programs } = compile({ ...options, skipVerify: true });
      // where alike-programs.ts relabels (TP ranks, no ViT balance), the relabeled programs hold
      // their template's objects: the text they reuse
      const sharing = programs.filter((p) =>
        programs.some(
          (t) =>
            t !== p &&
            t.instructions.length === p.instructions.length &&
            t.instructions.some((x, i) => x === p.instructions[i]),
        ),
      );
      const relabels = (options.parallel?.tp ?? 1) > 1 && !options.encoder?.vitDpBalance;
      expect(sharing.length > 0).toBe(relabels);
      expect(texts(programs)).toEqual(stringified(programs));
      const reversed = [...programs].reverse();
      expect(texts(reversed)).toEqual(stringified(reversed));
      const later = programs.slice(2);
      expect(texts(later)).toEqual(stringified(later));
    });
});
