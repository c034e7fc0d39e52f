// Views of a rank's persistent state (parameters, gradients, AdamW moments) inside the native
// runtime's regions, by program parameter name (a rank's parameters may be pieces of whole tensors:
// checkpoint.ts maps them), and of other persistent buffers by id (the distributed optimizer's
// bucket slices).

import type { ProgramFile, ProgramParam } from '../compiler/plan/format.js';

export type StateKind = 'param' | 'grad' | 'expAvg' | 'expAvgSq';

export interface RegionSource {
  region(name: 'param' | 'grad' | 'optim' | 'scalar'): ArrayBuffer;
}

const REGION: Record<StateKind, 'param' | 'grad' | 'optim'> = {
  param: 'param',
  grad: 'grad',
  expAvg: 'optim',
  expAvgSq: 'optim',
};

export class RankState {
  private readonly byName: Map<string, ProgramParam>;

  constructor(
    private readonly program: ProgramFile,
    private readonly rt: RegionSource,
  ) {
    this.byName = new Map(program.params.map((p) => [p.name, p]));
  }

  names(): string[] {
    return [...this.byName.keys()];
  }

  has(name: string, kind: StateKind): boolean {
    const p = this.byName.get(name);
    return p !== undefined && (kind === 'param' ? true : p[kind] !== undefined);
  }

  shape(name: string): number[] {
    return this.program.params.find((p) => p.name === name)!.shard.map(([, len]) => len);
  }

  /** A persistent f32 buffer (param, grad or optim region) by id, over the runtime's memory. */
  buffer(id: number): Float32Array {
    const b = this.program.buffers[id];
    if (
      !b ||
      b.dtype !== 'f32' ||
      !(b.region === 'param' || b.region === 'grad' || b.region === 'optim')
    )
      throw new Error(`program ${this.program.id}: buffer ${id} is not a persistent f32 buffer`);
    return new Float32Array(this.rt.region(b.region), b.offset, b.bytes / 4);
  }

  /** A Float32Array over the runtime's memory (writes go straight to the runtime). */
  view(name: string, kind: StateKind): Float32Array {
    const p = this.byName.get(name);
    if (!p) throw new Error(`no parameter ${name} in program ${this.program.id}`);
    const id = kind === 'param' ? p.buffer : p[kind];
    if (id === undefined) throw new Error(`parameter ${name} has no ${kind} (frozen?)`);
    const b = this.program.buffers[id];
    return new Float32Array(this.rt.region(REGION[kind]), b.offset, b.bytes / 4);
  }
}
