// The runtime refuses a bad program when it is loaded, before anything runs, with a message that
// names the problem (and the instruction index, op and scope where there is one).
import { describe, expect, it } from 'vitest';

import { PLAN_VERSION, type ProgramFile } from '../../compiler/plan/format.js';
import { loadNative } from '../../runtime/native.js';
import { ProgramBuilder } from './program-builder.js';

const native = loadNative();

/** A valid two-stream program: linear on compute, then a copy on copy after an event. */
function base(): ProgramBuilder {
  const b = new ProgramBuilder('valid', { S: 4, Nv: 0 });
  const tokens = b.input('tokens', 'i32', ['S']);
  const table = b.param('table', [8, 4], { trainable: false });
  const w = b.param('w', [3, 4], { trainable: false });
  const h = b.arena('h', 'f32', ['S', 4]);
  const y = b.arena('y', 'f32', ['S', 3]);
  const host = b.buffer('y.host', 'arena', 'f32', ['S', 3], { microbatch: 0, space: 'host' });
  const done = b.event();
  b.instr('compute', 'embedding', [tokens, table.buffer], [h], {}, { scope: 'model.embed' });
  b.instr('compute', 'linear', [h, w.buffer], [y], {}, { scope: 'model.head', record: [done] });
  b.instr('copy', 'offload', [y], [host], {}, { scope: 'model.head', wait: [done] });
  return b;
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] extends object ? Mutable<T[K]> : T[K] };

function mutated(edit: (p: Mutable<ProgramFile>) => void): string {
  const p = JSON.parse(base().json()) as Mutable<ProgramFile>;
  edit(p);
  return JSON.stringify(p);
}

function loadError(text: string): string {
  try {
    new native.Runtime(text);
  } catch (e) {
    expect(e).toBeInstanceOf(Error);
    return (e as Error).message;
  }
  throw new Error('the program was accepted');
}

describe('native runtime: program validation', () => {
  it('accepts the valid base program', () => {
    const rt = new native.Runtime(base().json());
    expect(rt.info()).toMatchObject({ id: 'valid', slots: 1, instructions: 3, events: 1 });
    expect(rt.info().streams).toEqual(['compute', 'copy']);
  });

  it('wrong version: names both versions', () => {
    const other = PLAN_VERSION + 1;
    const msg = loadError(mutated((p) => ((p as { version: number }).version = other)));
    expect(msg).toMatch(
      new RegExp(
        `plan version ${other} is not supported: this runtime reads plan version ${PLAN_VERSION}`,
      ),
    );
  });

  it('wrong format', () => {
    expect(loadError(mutated((p) => ((p as { format: string }).format = 'lfc-plan')))).toMatch(
      /format is "lfc-plan", expected "lfc-program"/,
    );
  });

  it('JSON that does not parse', () => {
    expect(loadError('{"format": ')).toMatch(/program JSON does not parse/);
  });

  it('unknown op: names the instruction index, op and scope', () => {
    const msg = loadError(mutated((p) => (p.instructions[1].op = 'matmul')));
    expect(msg).toBe(
      "program valid: instruction 1 (matmul, scope model.head): unknown op 'matmul'",
    );
  });

  it('buffer id out of range', () => {
    const msg = loadError(mutated((p) => (p.instructions[1].inputs[1] = 99)));
    expect(msg).toMatch(
      /instruction 1 \(linear, scope model\.head\): inputs: buffer id 99 is out of range \(\d+ buffers\)/,
    );
  });

  it('event never recorded', () => {
    const msg = loadError(mutated((p) => (p.instructions[1].record = [])));
    expect(msg).toMatch(
      /instruction 2 \(offload, scope model\.head\): waits for event 0, which no instruction records/,
    );
  });

  it('event declared but never recorded', () => {
    const msg = loadError(mutated((p) => ((p as { events: number }).events = 2)));
    expect(msg).toMatch(/event 1 is never recorded/);
  });

  it('event recorded twice', () => {
    const msg = loadError(mutated((p) => (p.instructions[0].record = [0])));
    expect(msg).toMatch(
      /instruction 1 \(linear, scope model\.head\): event 0 is already recorded by instruction 0/,
    );
  });

  it('event out of range', () => {
    const msg = loadError(mutated((p) => (p.instructions[2].wait = [5])));
    expect(msg).toMatch(
      /instruction 2 \(offload, scope model\.head\): wait: event 5 is out of range \(1 events\)/,
    );
  });

  it('a wait that can never be satisfied (deadlock) is refused', () => {
    // the copy stream records the event the compute stream waits for, but only after waiting
    // for an event that compute records later
    const b = new ProgramBuilder('deadlock', { S: 4, Nv: 0 });
    const x = b.param('x', [4], { trainable: false });
    const a = b.arena('a', 'f32', [4]);
    const c = b.arena('c', 'f32', [4]);
    const e0 = b.event();
    const e1 = b.event();
    b.instr('compute', 'gelu', [x.buffer], [a], {}, { wait: [e1], record: [e0], scope: 's.a' });
    b.instr('copy', 'offload', [x.buffer], [c], {}, { wait: [e0], record: [e1], scope: 's.c' });
    expect(loadError(b.json())).toMatch(
      /instruction 0 \(gelu, scope s\.a\) can never start: .*deadlock/,
    );
  });

  it('a collective: needs a collective backend', () => {
    const msg = loadError(
      mutated((p) => {
        p.instructions[1].op = 'all_reduce';
        p.instructions[1].attrs = { group: 'tp', group_size: 2 };
      }),
    );
    expect(msg).toBe(
      'program valid: instruction 1 (all_reduce, scope model.head): op all_reduce needs a collective backend; this runtime runs one rank',
    );
  });

  it('unknown stream, dtype, region', () => {
    expect(
      loadError(mutated((p) => ((p.instructions[0] as { stream: string }).stream = 'gpu0'))),
    ).toMatch(/instruction 0 \(embedding, scope model\.embed\): unknown stream 'gpu0'/);
    expect(loadError(mutated((p) => (p.buffers[3].dtype = 'f8')))).toMatch(
      /buffer 3 \(h\) has unknown dtype 'f8'/,
    );
    expect(
      loadError(mutated((p) => ((p.buffers[3] as { region: string }).region = 'heap'))),
    ).toMatch(/buffer 3 \(h\) has unknown region 'heap'/);
  });

  it('dims that do not parse, or name an unknown symbol', () => {
    expect(loadError(mutated((p) => (p.buffers[3].shape = ['S*2', '4'])))).toMatch(
      /buffer 3 \(h\): bad dim 'S\*2'/,
    );
    expect(loadError(mutated((p) => (p.buffers[3].shape = ['Ne', '4'])))).toMatch(
      /buffer 3 \(h\): bad dim 'Ne': unknown symbol 'Ne' \(this runtime resolves S, Nv\)/,
    );
  });

  it('operand counts and attributes against the registry', () => {
    expect(loadError(mutated((p) => (p.instructions[1].inputs = [3])))).toMatch(
      /instruction 1 \(linear, scope model\.head\): linear takes 2–3 inputs, got 1/,
    );
    const b = base();
    const x = b.arena('n', 'f32', ['S', 4]);
    b.instr('compute', 'layernorm', [3, 1, 1], [x], {});
    expect(loadError(b.json())).toMatch(
      /instruction 3 \(layernorm, scope test\.layernorm\): missing attribute 'eps'/,
    );
    expect(loadError(mutated((p) => (p.instructions[0].attrs = { eps: 1 })))).toMatch(
      /unknown attribute 'eps' for embedding/,
    );
  });

  it('a buffer past its region, a planned size below the shape, a broken view', () => {
    expect(loadError(mutated((p) => (p.buffers[3].offset = 1 << 20)))).toMatch(
      /buffer 3 \(h\) ends at byte \d+, past its region arena/,
    );
    expect(loadError(mutated((p) => (p.buffers[1].bytes = 8)))).toMatch(
      /buffer 1 \(table\): f32\[8, 4\] needs 128 bytes, planned 8/,
    );
    expect(loadError(mutated((p) => (p.buffers[4].viewOf = 1)))).toMatch(
      /buffer 4 \(y\) in region arena is a view of buffer 1 \(table\) in region param/,
    );
  });

  it('an output that overlaps an input', () => {
    expect(loadError(mutated((p) => (p.buffers[4].offset = p.buffers[3].offset)))).toMatch(
      /instruction 1 \(linear, scope model\.head\): output buffer 4 \(y\) overlaps input buffer 3 \(h\)/,
    );
  });

  it('data inputs: unknown field, wrong dtype', () => {
    expect(loadError(mutated((p) => ((p.inputs[0] as { name: string }).name = 'pixels')))).toMatch(
      /input 'pixels' is not a data field this runtime fills/,
    );
    expect(loadError(mutated((p) => (p.buffers[0].dtype = 'i64')))).toMatch(
      /input tokens of microbatch 0: buffer 0 .* has dtype i64, expected i32/,
    );
  });
});
