// `lfc inspect`: parameters per module (total, trainable, active per token for MoE), training
// FLOPs per text token and per image, and weight / gradient / optimizer bytes, all read off the
// forward graph and the op table.
//
// FLOP convention (docs/design.md): matmul FLOPs only (2·m·n·k); a training step is forward + backward =
// 3 × forward; causal attention counts half of the full S² work.

import {
  MODULES,
  paramModule,
  symbolBounds,
  valueTypes,
  type Graph,
  type ModuleName,
} from '../ir/graph.js';
import { nodeFlops } from '../ir/ops.js';
import { numel } from '../ir/shape.js';
import type { ModelConfig } from './frontend/config.js';
import { UserError } from './errors.js';
import { DTYPE_BYTES } from '../ir/dtype.js';
import { describePrecision, FP32, type Precision } from './frontend/precision.js';

export interface ModuleParams {
  total: number;
  trainable: number;
  /** parameters a token passes through: experts counted k/E */
  activePerToken: number;
}

export interface InspectReport {
  model: string;
  aliases: string[];
  moe: boolean;
  params: Record<ModuleName, ModuleParams> & { total: ModuleParams };
  flops: {
    seqLength: number;
    /** training FLOPs (3 × forward) of the decoder per text token, at seqLength */
    perTextToken: number;
    image: { height: number; width: number; patches: number; visualTokens: number };
    /** training FLOPs of encoder + projector for one image of that size */
    perImage: number;
  };
  /**
   * bytes of the whole model's static state, as the plan holds it per parameter (the layout's
   * model-parallel split aside): weights in the compute dtype, under --bf16 fp32 master weights,
   * main gradients, Adam m and v in fp32; with the distributed optimizer over `shardedOver`
   * data-parallel ranks, master, m and v divided among them
   */
  memory: {
    precision: string;
    shardedOver: number;
    weightBytes: number;
    masterBytes: number;
    gradBytes: number;
    optimizerBytes: number;
    /** per trainable parameter on a rank: Megatron's 18 (bf16, Adam) or 6 + 12/d, 16 or 8 + 8/d in f32 */
    bytesPerTrainableParam: number;
    /** per frozen parameter: its weight only */
    bytesPerFrozenParam: number;
  };
}

export interface InspectMemoryOptions {
  readonly precision?: Precision;
  /** --use-distributed-optimizer: master weights and moments sharded over dataParallelSize */
  readonly distributedOptimizer?: boolean;
  readonly dataParallelSize?: number;
}

/** Static bytes per parameter for a precision and optimizer sharding (Megatron's accounting). */
export function bytesPerParam(o: InspectMemoryOptions): {
  weight: number;
  master: number;
  grad: number;
  moments: number;
  shardedOver: number;
} {
  const p = o.precision ?? FP32;
  const d = o.distributedOptimizer ? (o.dataParallelSize ?? 1) : 1;
  return {
    weight: DTYPE_BYTES[p.compute],
    master: (p.compute === 'f32' ? 0 : 4) / d,
    grad: DTYPE_BYTES[p.grad],
    moments: 8 / d,
    shardedOver: d,
  };
}

export function countParams(g: Graph, cfg: ModelConfig): InspectReport['params'] {
  const d = cfg.model.text_decoder;
  const experts = new Set<string>();
  for (const n of g.nodes)
    if (n.op === 'grouped_linear') n.inputs.slice(2).forEach((w) => experts.add(w));
  const activeFrac = d.num_experts > 0 ? d.moe_router_topk / d.num_experts : 1;
  const zero = (): ModuleParams => ({ total: 0, trainable: 0, activePerToken: 0 });
  const out = {
    image_encoder: zero(),
    image_projector: zero(),
    text_decoder: zero(),
    total: zero(),
  };
  const bounds = () => 0; // parameters have numeric shapes
  for (const p of g.params) {
    const n = numel(p.type.shape, bounds);
    for (const m of [out[p.module], out.total]) {
      m.total += n;
      if (p.trainable) m.trainable += n;
      m.activePerToken += experts.has(p.name) ? n * activeFrac : n;
    }
  }
  return out;
}

/** Forward matmul FLOPs of the nodes of some modules, at given symbol sizes (a symbol not given,
 * such as the rows an expert capacity keeps, at its bound). On a training graph, its forward
 * nodes only. */
export function forwardFlops(
  g: Graph,
  modules: readonly ModuleName[],
  sizes: Record<string, number>,
): number {
  const types = valueTypes(g);
  const bounds = symbolBounds(g);
  const size = (s: string) => sizes[s] ?? bounds(s);
  let total = 0;
  for (const n of g.nodes) {
    if (n.phase !== 'forward' || !modules.includes(paramModule(n.scope))) continue;
    const ins = n.inputs.map((i) => types.get(i)!);
    total += nodeFlops(
      n.op,
      ins,
      n.outputs.map((o) => o.type),
      n.attrs,
      size,
    );
  }
  return total;
}

export function inspectModel(
  g: Graph,
  cfg: ModelConfig,
  opts: { seqLength: number; imageHeight: number; imageWidth: number } & InspectMemoryOptions,
): InspectReport {
  const e = cfg.model.image_encoder;
  const unit = e.patch_size * e.spatial_merge_size;
  const { imageHeight: h, imageWidth: w } = opts;
  if (h % unit !== 0 || w % unit !== 0) {
    throw new UserError(
      `image size ${h}x${w}: both sides must be multiples of patch × merge = ${unit}`,
    );
  }
  const patches = (h / e.patch_size) * (w / e.patch_size);
  const visualTokens = patches / (e.spatial_merge_size * e.spatial_merge_size);
  const params = countParams(g, cfg);
  const S = opts.seqLength;
  const perText = (3 * forwardFlops(g, ['text_decoder'], { S, Nv: 0 })) / S;
  const perImage =
    3 * forwardFlops(g, ['image_encoder', 'image_projector'], { S, Nv: visualTokens });
  const total = params.total;
  return {
    model: cfg.name,
    aliases: cfg.aliases,
    moe: cfg.model.text_decoder.num_experts > 0,
    params,
    flops: {
      seqLength: S,
      perTextToken: perText,
      image: { height: h, width: w, patches, visualTokens },
      perImage,
    },
    memory: memoryOf(total, opts),
  };
}

function memoryOf(total: ModuleParams, o: InspectMemoryOptions): InspectReport['memory'] {
  const b = bytesPerParam(o);
  const p = o.precision ?? FP32;
  return {
    precision: describePrecision(p),
    shardedOver: b.shardedOver,
    weightBytes: b.weight * total.total,
    masterBytes: b.master * total.trainable,
    gradBytes: b.grad * total.trainable,
    optimizerBytes: b.moments * total.trainable,
    bytesPerTrainableParam: b.weight + b.master + b.grad + b.moments,
    bytesPerFrozenParam: b.weight,
  };
}

// ---- formatting for people -------------------------------------------------------------------

function group(n: number): string {
  return Math.round(n).toLocaleString('en-US');
}

function si(n: number, unit: string): string {
  const units = ['', 'K', 'M', 'G', 'T', 'P', 'E'];
  let i = 0;
  while (Math.abs(n) >= 1000 && i < units.length - 1) {
    n /= 1000;
    i++;
  }
  return `${n.toFixed(n < 10 ? 2 : n < 100 ? 1 : 0)} ${units[i]}${unit}`;
}

function gib(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(2)} GiB`;
}

export function formatInspect(r: InspectReport): string {
  const rows: string[][] = [
    ['module', 'parameters', 'trainable', ...(r.moe ? ['active / token'] : [])],
  ];
  for (const m of [...MODULES, 'total'] as const) {
    const p = r.params[m];
    rows.push([m, group(p.total), group(p.trainable), ...(r.moe ? [group(p.activePerToken)] : [])]);
  }
  const widths = rows[0].map((_, c) => Math.max(...rows.map((row) => row[c].length)));
  const table = rows.map((row) =>
    row.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]) : cell.padStart(widths[c]))).join('   '),
  );
  table.splice(1, 0, widths.map((w) => '-'.repeat(w)).join('   '));
  table.splice(table.length - 1, 0, widths.map((w) => '-'.repeat(w)).join('   '));
  const f = r.flops;
  const mem = r.memory;
  return [
    `${r.model}${r.aliases.length ? ` (aliases: ${r.aliases.join(', ')})` : ''}${r.moe ? ', MoE decoder' : ''}`,
    '',
    ...table,
    '',
    'training FLOPs (matmul only, forward + backward = 3 × forward, causal attention at half):',
    `  per text token, sequence ${f.seqLength}: ${si(f.perTextToken, 'FLOP')}`,
    `  per image ${f.image.height}x${f.image.width} (${f.image.patches} patches, ${f.image.visualTokens} visual tokens): ${si(f.perImage, 'FLOP')}`,
    '',
    `memory (${mem.precision}${mem.shardedOver > 1 ? `; master weights and Adam moments sharded over ${mem.shardedOver} data-parallel ranks` : ''}):`,
    `  weights ${gib(mem.weightBytes)}   master ${gib(mem.masterBytes)}   gradients ${gib(mem.gradBytes)}   optimizer ${gib(mem.optimizerBytes)}   total ${gib(mem.weightBytes + mem.masterBytes + mem.gradBytes + mem.optimizerBytes)}`,
    `  ${+mem.bytesPerTrainableParam.toFixed(3)} bytes per trainable parameter, ${mem.bytesPerFrozenParam} per frozen one (divide by the model-parallel split for one rank)`,
    '',
  ].join('\n');
}
