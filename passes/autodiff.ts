// Pass: autodiff. After: the graph holds one microbatch's forward and backward (gradients of
// every trainable parameter accumulated into its `grad.` buffer) and the optimizer step
// (global-norm clipping and AdamW on `exp_avg.` / `exp_avg_sq.` state). Frozen parameters get
// no gradient, no optimizer state and no backward work that only they would need.

import { GraphBuilder, type Graph, type Node, type ParamDecl } from '../ir/graph.js';
import { isFloat, type DType } from '../ir/dtype.js';
import { GRAD_RULES, zerosLike, type GradCtx, type GradEntry } from './grad-rules.js';

export interface OptimizerSettings {
  readonly lr: number;
  readonly beta1: number;
  readonly beta2: number;
  readonly eps: number;
  readonly weightDecay: number;
  readonly clipNorm: number;
}

export const DEFAULT_OPTIMIZER: OptimizerSettings = {
  lr: 1e-3,
  beta1: 0.9,
  beta2: 0.95,
  eps: 1e-8,
  weightDecay: 0.1,
  clipNorm: 1.0,
};

export class AutodiffError extends Error {}

export interface AutodiffStats {
  backwardNodes: number;
  optimizerNodes: number;
  trainableParams: number;
}

export function gradName(param: string): string {
  return `grad.${param}`;
}

/** Weight decay applies to parameters of two or more dimensions (not norms or biases). */
export function weightDecayOf(p: ParamDecl, opt: OptimizerSettings): number {
  return p.type.shape.length >= 2 ? opt.weightDecay : 0;
}

/** The state a low-precision parameter's optimizer keeps: its fp32 master weights. */
export function masterName(param: string): string {
  return `master.${param}`;
}

/** AdamW's first and second moments of a parameter. */
export function expAvgName(param: string): string {
  return `exp_avg.${param}`;
}
export function expAvgSqName(param: string): string {
  return `exp_avg_sq.${param}`;
}

/**
 * `mainGrad` is the element type of the parameters' gradients (Megatron's main_grad): f32 by
 * default, also for bf16 parameters, whose weight-gradient ops then write f32 directly (gradient
 * accumulation fusion); bf16 with --grad-reduce-in-bf16. A parameter that is not f32 gets fp32
 * master weights (`master.<name>`), which AdamW updates and rounds back into the parameter; the
 * AdamW moments are f32 always.
 */
export function autodiff(
  g: Graph,
  opt: OptimizerSettings = DEFAULT_OPTIMIZER,
  mainGrad: DType = 'f32',
): { graph: Graph; stats: AutodiffStats } {
  const loss = g.outputs.find((o) => o.label === 'loss')?.value;
  if (loss === undefined)
    throw new AutodiffError("autodiff: the graph has no output labelled 'loss'");
  const b = GraphBuilder.from(g);
  const forwardCount = g.nodes.length;

  // values that depend on a trainable parameter through float data
  const trainableNames = new Set(
    g.params.filter((p) => p.trainable && p.role === 'param').map((p) => p.name),
  );
  const live = new Set(trainableNames);
  for (const n of g.nodes) {
    if (n.inputs.some((i) => live.has(i)))
      for (const o of n.outputs) if (isFloat(o.type.dtype)) live.add(o.name);
  }
  if (!live.has(loss))
    throw new AutodiffError('autodiff: the loss does not depend on any trainable parameter');

  const grads = new Map<string, string>();
  const addGrad = (v: string, d: string) => {
    const prev = grads.get(v);
    grads.set(v, prev === undefined ? d : b.op1('add', [prev, d]));
  };
  b.at('loss', 'backward', () =>
    grads.set(loss, b.op1('constant', [], { value: 1, dtype: 'f32', shape: [] })),
  );

  // reshapes of a trainable parameter (tensor parallelism's row-parallel bias, added once as a
  // [width, 1] column): their gradient flows into the parameter's, so it is a main gradient too
  const paramViews = new Set(
    g.nodes
      .filter((n) => n.op === 'reshape' && trainableNames.has(n.inputs[0]))
      .map((n) => n.outputs[0].name),
  );
  for (let idx = g.nodes.length - 1; idx >= 0; idx--) {
    const node = g.nodes[idx];
    if (!node.outputs.some((o) => grads.has(o.name))) continue;
    const entry: GradEntry = GRAD_RULES[node.op];
    if (entry.kind === 'none') {
      throw new AutodiffError(
        `autodiff: ${node.op} at node ${idx} (${node.scope}) has no gradient: ${entry.why}`,
      );
    }
    b.at(node.scope, 'backward', () => {
      const ctx: GradCtx = {
        b,
        node,
        dOut: (i) => grads.get(node.outputs[i].name),
        dOutOrZero: (i) => grads.get(node.outputs[i].name) ?? zerosLike(b, node.outputs[i].type),
        needs: (i) => live.has(node.inputs[i]),
        gradType: (i) =>
          trainableNames.has(node.inputs[i]) || paramViews.has(node.inputs[i])
            ? mainGrad
            : b.typeOf(node.inputs[i]).dtype,
      };
      const dIns = entry.rule(ctx);
      dIns.forEach((d, i) => {
        if (d !== undefined && live.has(node.inputs[i])) addGrad(node.inputs[i], d);
      });
    });
  }
  const backwardCount = b.build().nodes.length - forwardCount;

  // gradient accumulation into the step's buffers, then the optimizer step
  const trainable = g.params.filter((p) => p.trainable && p.role === 'param');
  const gradBufs: string[] = [];
  for (const p of trainable) {
    const d = grads.get(p.name);
    if (d === undefined)
      throw new AutodiffError(
        `autodiff: trainable parameter ${p.name} gets no gradient from the loss`,
      );
    if (b.typeOf(d).dtype !== mainGrad)
      throw new AutodiffError(
        `autodiff: the gradient of ${p.name} is ${b.typeOf(d).dtype}, not the main-gradient type ${mainGrad}`,
      );
    const gradType = { dtype: mainGrad, shape: p.type.shape };
    const buf = b.state(gradName(p.name), gradType, 'grad', p.module, 'zeros');
    gradBufs.push(buf);
    b.at(scopeOf(p.name), 'backward', () => b.op('grad_accumulate', [d, buf]));
  }
  const beforeOpt = b.build().nodes.length;
  b.at('optimizer', 'optimizer', () => {
    const sumsq = b.op1('sum_squares', gradBufs);
    const coef = b.op1('clip_coef', [sumsq], { max_norm: opt.clipNorm });
    trainable.forEach((p, i) => {
      const f32 = { dtype: 'f32' as const, shape: p.type.shape };
      const m = b.state(expAvgName(p.name), f32, 'optimizer_state', p.module, 'zeros');
      const v = b.state(expAvgSqName(p.name), f32, 'optimizer_state', p.module, 'zeros');
      const master =
        p.type.dtype === 'f32'
          ? []
          : [b.state(masterName(p.name), f32, 'optimizer_state', p.module, 'param')];
      b.op('adamw', [p.name, gradBufs[i], m, v, coef, ...master], {
        beta1: opt.beta1,
        beta2: opt.beta2,
        eps: opt.eps,
        weight_decay: weightDecayOf(p, opt),
      });
    });
    b.output('grad_norm_sq', sumsq);
    b.output('clip_coef', coef);
  });
  const built = b.build();
  const graph = { ...built, nodes: accumulateEarly(built.nodes) };
  return {
    graph,
    stats: {
      backwardNodes: backwardCount + (beforeOpt - forwardCount - backwardCount),
      optimizerNodes: graph.nodes.length - beforeOpt,
      trainableParams: trainable.length,
    },
  };
}

/**
 * Each gradient accumulation right after the node that finishes its gradient (its wgrad, or the
 * last add of a parameter used twice), instead of after the whole backward: a temporary weight
 * gradient is then freed as soon as it is added, where the end of the backward would keep every
 * layer's alive at once.
 */
function accumulateEarly(nodes: readonly Node[]): Node[] {
  const producer = new Map<string, number>();
  nodes.forEach((n, i) => n.outputs.forEach((o) => producer.set(o.name, i)));
  const after = new Map<number, Node[]>();
  const moved = new Set<Node>();
  for (const n of nodes) {
    if (n.op !== 'grad_accumulate') continue;
    const i = producer.get(n.inputs[0]);
    if (i === undefined) continue;
    after.set(i, [...(after.get(i) ?? []), n]);
    moved.add(n);
  }
  const out: Node[] = [];
  nodes.forEach((n, i) => {
    if (moved.has(n)) return;
    out.push(n, ...(after.get(i) ?? []));
  });
  return out;
}

function scopeOf(param: string): string {
  return param.split('.').slice(0, -1).join('.');
}
