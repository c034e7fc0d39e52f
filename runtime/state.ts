// Views of a rank's persistent state (parameters, gradients, AdamW moments) inside the native
// runtime's regions, by parameter name. One rank holds whole tensors; shards come with the
// parallel passes.

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
