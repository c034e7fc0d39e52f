// Pass: expert parallelism, on the forward graph before autodiff and before tensor parallelism.
// After: each MoE layer's experts are split over the `ep` group (rank i holds experts
// i·E/ep … (i+1)·E/ep − 1 as local parameters), and the routed rows travel to their expert and
// back (Megatron-LM's all-to-all token dispatcher):
//
//   moe_permute            rows grouped by global expert, counts [E]
//   all_to_all_v           the counts, as [ep, E/ep] (one row to each rank): who sends me what
//   moe_rank_counts        rows to each rank: sums of consecutive E/ep counts
//   all_to_all_v           the rows (sizes exchanged first; the received row count is a symbol,
//                          bounded by ep × the rows a rank sends, and under an expert capacity
//                          by ep × E/ep × capacity: every source sends ≤ capacity rows per expert)
//   moe_sort_chunks        received (source, expert) blocks reordered to (expert, source)
//   moe_local_counts       rows per local expert
//   grouped_linear …       the local experts
//   moe_sort_chunks⁻¹, all_to_all_v back, moe_unpermute
//
// Gradients: all_to_all_v's gradient is the reverse exchange. Expert gradients are summed over
// expert-data-parallel ranks (`edp`), not `dp`. Router, auxiliary loss and permutation stay on the
// rank's own tokens (every ep rank has its own microbatches).

import { GraphBuilder, type Graph, type ParamDecl } from '../../ir/graph.js';
import { formatDim, isSym } from '../../ir/shape.js';

export interface ExpertParallelOptions {
  /** expert-parallel size */
  readonly ep: number;
  /**
   * without an expert capacity: plan each rank's dispatch for at most this multiple of the rows
   * balanced routing gives it (the runtime refuses more); absent, the dropless worst case
   */
  readonly imbalance?: number;
  /**
   * the busiest rank's received rows in a typical step, as a multiple of balanced routing's: the
   * dispatch's expected size (default 1)
   */
  readonly expectedImbalance?: number;
  /**
   * the ranks each microbatch's tokens are split over before the router (sequence parallelism's
   * tp, dropless routing: passes/parallel/tensor.ts); a rank dispatches 1/tokenSplit of the
   * rows, and its receive bound shrinks with them. Default 1
   */
  readonly tokenSplit?: number;
  /**
   * the token dispatcher of the GPU run (Megatron's --moe-token-dispatcher-type): alltoall (the
   * default) or flex, DeepEP's, which sends a token once to each node that holds one of its
   * experts and forwards it there over NVLink. The rows move alike on every runtime; a flex
   * dispatch's row exchanges carry `dispatcher` and `top_k` for the simulator (cost.ts)
   */
  readonly dispatcher?: 'alltoall' | 'flex';
  /** the router's top-k (with the flex dispatcher) */
  readonly topK?: number;
}

export class ExpertParallelError extends Error {}

const GROUP = 'ep';
const EXPERT_RE = /^(.*\.experts)\.(\d+)\.(.+)$/;

interface LayerExchange {
  /** counts received: [ep, E/ep], row p = rows source p sends to each of my experts */
  readonly countsIn: string;
  /** rows received from each source (the combine sends these back) */
  readonly countsBack: string;
  /** rows dim of the rows this rank sends */
  readonly rowsOut: string;
}

/**
 * Rows a rank's dispatch can receive: every one of the ep sources sends it at most all of its
 * `sent` rows, and under an expert capacity at most `capacity` rows for each of its L local
 * experts.
 */
export function receivedRowsBound(
  ep: number,
  sent: number,
  L: number,
  capacity?: number,
  imbalance?: number,
): number {
  if (capacity !== undefined) return Math.min(ep * sent, ep * L * capacity);
  if (imbalance !== undefined) return Math.min(ep * sent, Math.ceil(imbalance * sent));
  return ep * sent;
}

/** Rows a rank's dispatch receives under balanced routing: what it sends, less what capacity drops. */
export function balancedReceivedRows(
  ep: number,
  sent: number,
  L: number,
  capacity?: number,
): number {
  return capacity === undefined ? sent : Math.min(sent, ep * L * capacity);
}

function receivedRowsDoc(scope: string, capacity: unknown, imbalance: number | undefined): string {
  const what = `rows ${scope}'s expert dispatch receives`;
  if (capacity !== undefined) return `${what} (at most ep × E/ep × capacity)`;
  if (imbalance !== undefined)
    return `${what} (planned for ${imbalance}× balanced routing: raise --moe-routing-imbalance for more)`;
  return `${what} (at most ep × the rows it sends: the dropless worst case)`;
}

export function expertParallel(g: Graph, o: ExpertParallelOptions): Graph {
  const ep = o.ep;
  if (ep === 1) return g;
  const b = new GraphBuilder(g.name);
  for (const s of g.symbols) b.declareSymbol(s);
  const name = new Map<string, string>();
  for (const i of g.inputs) name.set(i.name, b.input(i.name, i.type.dtype, i.type.shape, i.doc));

  // local expert parameters: global expert e = rank·perRank + local
  const perLayer = new Map<string, number>();
  for (const p of g.params) {
    const m = EXPERT_RE.exec(p.name);
    if (m) perLayer.set(m[1], Math.max(perLayer.get(m[1]) ?? 0, Number(m[2]) + 1));
  }
  for (const [prefix, count] of perLayer) {
    if (count % ep !== 0)
      throw new ExpertParallelError(
        `expert parallelism (ep ${ep}): ${prefix} has ${count} experts, not divisible by ep`,
      );
  }
  for (const p of g.params) {
    const m = EXPERT_RE.exec(p.name);
    if (!m) {
      b.declare(p);
      name.set(p.name, p.name);
      continue;
    }
    const [, prefix, index, rest] = m;
    const perRank = perLayer.get(prefix)! / ep;
    const e = Number(index);
    if (e >= perRank) {
      name.set(p.name, ''); // another rank's expert: dropped from its grouped_linear
      continue;
    }
    const local = `${prefix}.local${e}.${rest}`;
    const decl: ParamDecl = {
      ...p,
      name: local,
      dist: {
        name: `${prefix}.{}.${rest}`,
        shape: p.type.shape as number[],
        split: p.type.shape.map(() => null),
        expert: { group: GROUP, perRank, local: e },
        gradSum: [],
        replicas: 'edp',
      },
    };
    name.set(p.name, b.declare(decl));
  }

  const exchanges = new Map<string, LayerExchange>();
  const coll = { group: GROUP, group_size: ep };
  if (o.dispatcher === 'flex' && !(o.topK !== undefined && o.topK >= 1))
    throw new ExpertParallelError('expert parallelism: the flex dispatcher needs the top-k');
  // the exchanges of the routed rows (not of their counts)
  const rowsColl = o.dispatcher === 'flex' ? { ...coll, dispatcher: 'flex', top_k: o.topK! } : coll;
  let layerIndex = 0;
  for (const n of g.nodes) {
    const ins = n.inputs.map((v) => {
      const m = name.get(v);
      if (m === undefined) throw new Error(`expert parallelism: undefined value ${v}`);
      return m;
    });
    b.at(n.scope, n.phase, () => {
      if (n.op === 'moe_permute') {
        const [rows, counts, rowOf] = b.op('moe_permute', ins, n.attrs);
        const capacity = n.attrs.capacity as number | undefined;
        const perRank = (n.attrs.num_experts as number) / ep;
        const countsBy = b.op1('reshape', [counts], { shape: [String(ep), String(perRank)] });
        const ones = b.op1('constant', [], { value: 1, dtype: 'i32', shape: [String(ep)] });
        const [countsIn] = b.op('all_to_all_v', [countsBy, ones], {
          ...coll,
          out_rows: [String(ep)],
        });
        const send = b.op1('moe_rank_counts', [counts], { group_size: ep });
        const rowsDim = b.typeOf(rows).shape[0];
        const decl = isSym(rowsDim) ? g.symbols.find((s) => s.name === rowsDim.sym)! : undefined;
        // the rows one rank sends: its share of the tokens (tokenSplit) routed k ways
        const split = capacity === undefined ? (o.tokenSplit ?? 1) : 1;
        const scaled = (v: number) =>
          (isSym(rowsDim) ? (v * rowsDim.num) / rowsDim.den : v) / split;
        const bound = Math.ceil(decl ? scaled(decl.bound) : scaled(rowsDim as number));
        const sentExpected = decl ? scaled(decl.expected ?? decl.bound) : bound;
        const rxBound = receivedRowsBound(ep, bound, perRank, capacity, o.imbalance);
        const sym = b.symbol(
          `Rx${layerIndex++}`,
          rxBound,
          receivedRowsDoc(n.scope, capacity, o.imbalance),
          Math.min(
            rxBound,
            Math.round(
              (o.expectedImbalance ?? 1) *
                balancedReceivedRows(ep, sentExpected, perRank, capacity),
            ),
          ),
        );
        const [rowsIn, countsBack] = b.op('all_to_all_v', [rows, send], {
          ...rowsColl,
          out_rows: [formatDim(sym)],
        });
        const sorted = b.op1('moe_sort_chunks', [rowsIn, countsIn], { inverse: false });
        const local = b.op1('moe_local_counts', [countsIn]);
        exchanges.set(n.scope, { countsIn, countsBack, rowsOut: formatDim(rowsDim) });
        const [oRows, oCounts, oRowOf] = n.outputs.map((x) => x.name);
        name.set(oRows, sorted);
        name.set(oCounts, local);
        name.set(oRowOf, rowOf);
        return;
      }
      if (n.op === 'grouped_linear') {
        const weights = ins.slice(2).filter((w) => w !== '');
        const [y] = b.op('grouped_linear', [ins[0], ins[1], ...weights], n.attrs);
        name.set(n.outputs[0].name, y);
        return;
      }
      if (n.op === 'moe_unpermute') {
        const x = exchanges.get(n.scope);
        if (!x) throw new Error(`expert parallelism: ${n.scope} unpermutes without a dispatch`);
        // under an expert capacity rowsOut is the kept-rows symbol Nk<i> itself, which this
        // combine sets at run time to the rows it gets back (one rank: it stays at its bound)
        const unsorted = b.op1('moe_sort_chunks', [ins[0], x.countsIn], { inverse: true });
        const [back] = b.op('all_to_all_v', [unsorted, x.countsBack], {
          ...rowsColl,
          out_rows: [x.rowsOut],
        });
        const [y] = b.op('moe_unpermute', [back, ins[1], ins[2]], n.attrs);
        name.set(n.outputs[0].name, y);
        return;
      }
      const outs = b.op(n.op, ins, n.attrs);
      n.outputs.forEach((v, i) => name.set(v.name, outs[i]));
    });
  }
  for (const out of g.outputs) b.output(out.label, name.get(out.value)!);
  return b.build();
}
