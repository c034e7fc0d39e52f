// Pass: ViT data-parallel balance (--use-vit-dp-balance; DESIGN.md "Parallel topology"). Images
// differ in size and attention cost grows with the square of an image's patches, so the ranks
// that encode distinct microbatches at the same time (the encoder's gradient group: dp, every rank
// of stage 0, or every rank) pool their images, and each rank encodes a share of about equal cost.
// Every rank computes the same assignment from the exchanged image sizes, so no rank decides
// alone. After:
//
//   image_sizes        patches of each image of this rank's microbatch            i32 [I]
//   all_gather         every rank's sizes                                         i32 [P·I]
//   vit_balance_route  the rule: patch rows to send to each rank, the row order, tokens to send
//                      back, where each own token returns to, images moved (a metric output)
//   per patch input    (segments made unique over the group) rows in send order, all_to_all_v
//                      → the Pb rows this rank encodes (a run-time symbol, bounded by one
//                      microbatch's patches: the rule never gives a rank more)
//   encoder, projector unchanged, over Pb patches instead of 4·Nv
//   per output         all_to_all_v back to the image's own rank, rows into their original order
//
// Gradients follow autodiff: the return exchange reverses, the reordering scatters back, so each
// image's embedding gradient reaches the rank that encoded it. The encoder's gradients are summed
// over the same group as before (the pooled images are the same images), so one step is the same
// step as without balancing, up to summation order.

import { GraphBuilder, valueTypes, type Graph, type Node } from '../../ir/graph.js';
import { formatDim, isSym, parseDim, sym, type Dim } from '../../ir/shape.js';
import type { Attrs } from '../../ir/types.js';
import { isEncoderScope } from './placement.js';

export interface VitBalanceOptions {
  /** the group kind that pools its images: the encoder's gradient group */
  readonly group: 'dp' | 'tp_dp_cp' | 'world';
  readonly groupSize: number;
  /** patches per visual token (spatial merge²) */
  readonly merge: number;
}

/** inputs that number the images (or attention windows) of one microbatch from 0 */
const SEGMENT_INPUTS = new Set(['image_segments', 'window_segments']);
/** the run-time symbol of the patch rows a rank encodes after the exchange */
const BALANCED = 'Pb';
/** the symbol of visual tokens per microbatch (compiler/frontend/build.ts) */
const VISUAL = 'Nv';

export function vitDpBalance(g: Graph, o: VitBalanceOptions): Graph {
  if (o.groupSize === 1) return g;
  const nv = g.symbols.find((s) => s.name === VISUAL);
  if (!nv || !g.inputs.some((i) => i.name === 'image_segments')) return g; // no encoder
  const coll = { group: o.group, group_size: o.groupSize };
  const isPatchDim = (d: Dim) => isSym(d) && d.sym === VISUAL && d.num === o.merge * d.den;
  const encoderReads = new Set(
    g.nodes.filter((n) => isEncoderScope(n.scope)).flatMap((n) => n.inputs),
  );
  const perPatch = g.inputs.filter(
    (i) => encoderReads.has(i.name) && i.type.shape.length && isPatchDim(i.type.shape[0]),
  );
  // values the encoder and projector make that the decoder reads (the visual tokens)
  const encoderMade = new Set(
    g.nodes.filter((n) => isEncoderScope(n.scope)).flatMap((n) => n.outputs.map((v) => v.name)),
  );
  const crossing = new Set(
    g.nodes
      .filter((n) => !isEncoderScope(n.scope))
      .flatMap((n) => n.inputs.filter((v) => encoderMade.has(v))),
  );
  const types = valueTypes(g);
  let lastEncoderNode = -1;
  g.nodes.forEach((n, i) => {
    if (isEncoderScope(n.scope)) lastEncoderNode = i;
  });

  const b = new GraphBuilder(g.name);
  for (const s of g.symbols) b.declareSymbol(s);
  const name = new Map<string, string>();
  for (const i of g.inputs) name.set(i.name, b.input(i.name, i.type.dtype, i.type.shape, i.doc));
  for (const p of g.params) name.set(p.name, b.declare(p));
  const images = nv.bound; // every image is at least one visual token
  const capacity = nv.bound * o.merge;
  b.symbol(
    BALANCED,
    capacity,
    'patch rows a rank encodes after the ViT balance (at most one microbatch’s patches)',
  );

  // the exchange before the encoder
  const route = b.at('visual.balance', 'forward', () => {
    const segments = 'image_segments';
    const sizes = b.op1('image_sizes', [segments], { images });
    const all = b.op1('all_gather', [sizes], coll);
    const [send, order, back, inverse, moved] = b.op('vit_balance_route', [all, segments], {
      ...coll,
      images,
      merge: o.merge,
      capacity,
    });
    for (const input of perPatch) {
      let x = input.name;
      if (SEGMENT_INPUTS.has(x)) x = b.op1('segment_offset', [x], { ...coll, stride: capacity });
      const shape = input.type.shape.map(formatDim);
      const rows = shape.length === 1 ? b.op1('reshape', [x], { shape: [shape[0], '1'] }) : x;
      const picked = b.op1('gather_rows', [rows, order]);
      const [received] = b.op('all_to_all_v', [picked, send], { ...coll, out_rows: [BALANCED] });
      const balanced =
        shape.length === 1 ? b.op1('reshape', [received], { shape: [BALANCED] }) : received;
      name.set(input.name, balanced);
    }
    return { back, inverse, moved };
  });

  const mapped = (n: Node) =>
    n.inputs.map((v) => {
      const m = name.get(v);
      if (m === undefined)
        throw new Error(`vit balance: undefined value ${v} (${n.op} in ${n.scope})`);
      return m;
    });
  g.nodes.forEach((n, index) => {
    const encoder = isEncoderScope(n.scope);
    if (!encoder && n.phase === 'forward' && index < lastEncoderNode)
      for (const v of n.inputs)
        if (crossing.has(v))
          throw new Error(`vit balance: ${n.scope} reads ${v} before the encoder is done`);
    const outs = b.at(n.scope, n.phase, () =>
      b.op(n.op, mapped(n), encoder ? balancedAttrs(n.attrs, o.merge) : n.attrs),
    );
    n.outputs.forEach((v, i) => name.set(v.name, outs[i]));
    if (index !== lastEncoderNode) return;
    // the exchange after the projector: each image's tokens home, in their original order
    b.at('visual.balance_back', 'forward', () => {
      for (const v of crossing) {
        const tokens = types.get(v)!.shape[0];
        if (!isSym(tokens) || tokens.sym !== VISUAL || tokens.num !== tokens.den)
          throw new Error(`vit balance: encoder output ${v} is not one row per visual token`);
        const [home] = b.op('all_to_all_v', [name.get(v)!, route.back], {
          ...coll,
          out_rows: [formatDim(tokens)],
        });
        name.set(v, b.op1('gather_rows', [home, route.inverse]));
      }
    });
  });
  for (const out of g.outputs) b.output(out.label, name.get(out.value)!);
  b.output('vit_images_moved', route.moved);
  return b.build();
}

/** An encoder node's attributes over the balanced rows: dims over Nv become dims over Pb. */
function balancedAttrs(attrs: Attrs, merge: number): Attrs {
  let changed = false;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(attrs)) {
    if (
      Array.isArray(v) &&
      v.every((x) => typeof x === 'string') &&
      (k === 'shape' || k === 'out_rows')
    ) {
      out[k] = v.map((text: string) => {
        const d = parseDim(text);
        if (!isSym(d) || d.sym !== VISUAL) return text;
        changed = true;
        return formatDim(sym(BALANCED, d.num, d.den * merge));
      });
    } else out[k] = v;
  }
  return changed ? (out as Attrs) : attrs;
}
