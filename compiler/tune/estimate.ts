// The cheaper model of `lfc tune`: a layout's step and memory estimated without emitting or
// simulating its plan, so that a search can rank thousands of layouts in seconds and compile
// only the best (compiler/tune/search.ts prices those with the full compiler and simulator).
//
// Pieces. The graph passes (build, the parallel rewrites, autodiff) run on a reduced model: the
// decoder cut to its deepstack layers plus one (its other layers repeat the last), the encoder
// whole. Each node of that rank graph is priced as the simulator prices its instruction
// (compiler/schedule/priced.ts, graphWork and workSeconds), collectives on the layout's own
// groups. Per decoder layer, forward and backward, the seconds split into the expert exchange
// (all_to_all_v, what A2A overlap hides) and the rest; the recompute modules (the layout's
// recompute policy, by the emitter's own module rules) add their forward again in backward. The
// graphs are cached by what shapes them: decoder pieces by (tp, ep, expert TP, micro-batch), encoder pieces
// by (tp, micro-batch, level, encoder TP).
//
// Step. The pipeline split is the compiler's (the min-max split of the priced layer seconds), the
// schedule the compiler's (1F1B or interleaved, A2A-overlap pairs as one combined step), replayed
// as events: a pass starts when its stage is free and its input has arrived over the pipeline
// link. An overlapped pair costs the larger of its compute and its exchanges, the compute slowed
// by the profile's overlap slowdown. The encoder runs per its level (compiler/parallel/encoder.ts):
// levels 0–1 in stage 0's first chunk of every microbatch; level 2 once per group of tp
// microbatches, broadcast to the TP group; level 3 before the pipeline (each rank its share of the
// microbatches, gathered to model-parallel rank 0) and its backward after (scattered back). Then
// the gradient sums of the last backward, as buckets finish, on the grad stream, the gradient
// norm's all-reduce over every rank, and the optimizer step (the distributed optimizer: a 1/dp
// shard and an all_gather of the parameters). On a profile that prices the framework's host
// (hardware.ts HostSide), the step is at least a stage's host time: its nodes' issue, and at each
// layer's expert dispatch the forward kernel time the issue does not cover (the plan has more
// instructions than the graph has nodes, so this understates a host-bound step).
//
// Memory, per stage: parameters, gradients and optimizer state by Megatron's bytes per parameter
// (compiler/inspect.ts); what a decoder layer keeps from forward to backward under the layout's
// recompute and offload (the emitter's rules), times the schedule's most microbatches in flight;
// what the encoder keeps for the microbatches it encoded and has not yet run backward for; one
// layer's working set; the batch slots. Both at the bounds and at expected sizes.
//
// The estimate is a ranking, not a figure the tuner prints: test/tune/estimate.test.ts holds it
// against compile + simulate on a sample of layouts.

import type { Graph } from '../../ir/graph.js';
import { valueTypes } from '../../ir/graph.js';
import { resolveShape } from '../../ir/shape.js';
import type { TensorType } from '../../ir/types.js';
import { DTYPE_BYTES } from '../../ir/dtype.js';
import { moduleInstructions, offloadedBuffers } from '../emit/activations.js';
import type { OffloadTensor, RecomputeModule } from '../frontend/activation-names.js';
import type { Precision } from '../frontend/precision.js';
import { bytesPerParam } from '../inspect.js';
import { buildTopology } from '../parallel/topology.js';
import type { CompileOptions } from '../pipeline.js';
import { trainingGraph } from '../pipeline.js';
import { costSite } from '../schedule/costs.js';
import { splitMinMax } from '../schedule/partition.js';
import {
  schedule1F1B,
  scheduleInterleaved,
  type Action,
  type PipelineSchedule,
} from '../schedule/pipeline.js';
import {
  elementBytesOn,
  expectedGraphSizes,
  graphWork,
  groupShapes,
  workSeconds,
  type NodeWork,
} from '../schedule/priced.js';
import { groupCollectiveSeconds, issueSeconds, pricedHost, type GroupShape } from '../sim/cost.js';
import type { HardwareProfile } from '../sim/hardware.js';
import type { Layout, SearchSpaceRequest } from './space.js';

export interface Estimate {
  readonly stepSeconds: number;
  readonly tokensPerSecond: number;
  /** the busiest stage's device bytes at the bounds, and at expected sizes */
  readonly peakBound: number;
  readonly peakExpected: number;
}

/** Collectives of one piece, summed by op, group and flex top-k: the cost is affine in bytes. */
type Comms = Map<
  string,
  { op: string; group: string; count: number; bytes: number; flexTopK: number }
>;

/** One piece's work in one direction: compute seconds and collectives (exchange apart). */
interface Work {
  compute: number;
  comms: Comms;
  /** the expert all_to_all_v exchange */
  a2a: Comms;
  /** the framework's host time to issue its nodes (hardware.ts HostSide) */
  host: number;
}

const emptyWork = (): Work => ({ compute: 0, comms: new Map(), a2a: new Map(), host: 0 });

/** Bytes at the bounds and at expected sizes. */
interface Bytes {
  bound: number;
  expected: number;
}

type Recompute = 'none' | 'full' | readonly RecomputeModule[];

/** A decoder layer of the reduced graph. */
interface LayerPieces {
  readonly forward: Work;
  readonly backward: Work;
  /** the forward work a recompute policy runs again in backward */
  recomputeOf(r: Recompute): Work;
  /** what the layer keeps from forward to backward under a recompute policy and offload */
  keptOf(r: Recompute, offload: readonly OffloadTensor[]): Bytes;
  /** what an offload copies to the host and back */
  offloadedOf(offload: readonly OffloadTensor[]): Bytes;
  /** its largest value, for the working set */
  readonly largest: Bytes;
}

interface DecoderPieces {
  readonly layers: readonly LayerPieces[];
  readonly embed: { forward: Work; backward: Work };
  readonly post: { forward: Work; backward: Work };
  /** optimizer-phase work per layer, of the embedding and of the post piece */
  readonly optimizer: { layer: Work; embed: Work; post: Work };
  /** what crosses a pipeline boundary per microbatch */
  readonly boundaryBytes: number;
  /** parameter elements per layer (dense, expert), of the embedding and of the post piece */
  readonly params: {
    readonly layer: { dense: number; expert: number };
    readonly embed: number;
    readonly post: number;
  };
  readonly encoderParams: number;
  readonly batch: { readonly first: Bytes; readonly last: Bytes };
  /** bytes of a parameter element (what the distributed optimizer's all_gather moves) */
  readonly paramBytes: number;
}

interface EncoderPieces {
  readonly forward: Work;
  readonly backward: Work;
  readonly optimizer: Work;
  /** what the encoder keeps per microbatch from forward to backward */
  readonly kept: Bytes;
  readonly params: number;
  /** the encoder's output per microbatch (what the handoffs move) */
  readonly outputBytes: number;
  readonly batch: Bytes;
}

export interface EstimatorRequest {
  readonly space: SearchSpaceRequest;
  readonly hardware: HardwareProfile;
  readonly precision: Precision;
}

const SELECTIVE_DEFAULT: readonly RecomputeModule[] = ['core_attn'];

/** The recompute and offload of a layout's flags (space.ts flagsOf), as policy keys. */
function policyOf(o: CompileOptions): {
  recompute: Recompute;
  offload: readonly OffloadTensor[];
} {
  const r = o.recompute;
  return {
    recompute: !r
      ? 'none'
      : r.granularity === 'full'
        ? 'full'
        : ((r.modules as RecomputeModule[] | undefined) ?? SELECTIVE_DEFAULT),
    offload: (o.offloadTensors ?? []) as OffloadTensor[],
  };
}

const recomputeKey = (r: Recompute) => (typeof r === 'string' ? r : [...r].sort().join('+'));

export class Estimator {
  private readonly decoders = new Map<string, DecoderPieces>();
  private readonly encoders = new Map<string, EncoderPieces>();
  /** graph-pass runs so far (each a reduced model) */
  graphs = 0;

  constructor(private readonly r: EstimatorRequest) {}

  /** `options`: the layout's compile options (its flags through the request's optionsOf) */
  estimate(layout: Layout, options: CompileOptions): Estimate {
    const r = this.r;
    const { decoder, encoder } = this.piecesOf(layout, options);
    const world = r.space.nnodes * r.space.nprocPerNode;
    const { tp, pp, vpp, ep, mbs } = layout;
    const dp = world / (tp * pp);
    const topology = buildTopology({
      nnodes: r.space.nnodes,
      nprocPerNode: r.space.nprocPerNode,
      tp,
      pp,
      vpp,
      ep,
      etp: layout.etp,
      cp: 1,
      encoderTp: layout.level >= 2 ? 1 : layout.encoderTp,
    });
    const policy = policyOf(options);
    const rkey = recomputeKey(policy.recompute);
    const c: LayoutContext = {
      layout,
      r,
      hw: r.hardware,
      decoder,
      encoder,
      world,
      dp,
      m: r.space.globalBatchSize / (mbs * dp),
      shapeOf: groupShapes(topology, r.space.nprocPerNode),
      policy,
      rkey,
      schedule: scheduleOf(layout, r.space.globalBatchSize / (mbs * dp)),
    };
    const st = stagePasses(c);
    const stepSeconds = stepOf(c, st);
    const { peakBound, peakExpected } = memoryOf(c, st);
    const tokens =
      r.space.globalBatchSize * (options.seqLength ?? r.space.config.training.seq_length);
    return { stepSeconds, tokensPerSecond: tokens / stepSeconds, peakBound, peakExpected };
  }

  /** The decoder and encoder pieces of a layout, from cached reduced-graph runs. */
  private piecesOf(
    l: Layout,
    options: CompileOptions,
  ): { decoder: DecoderPieces; encoder: EncoderPieces } {
    const dkey = `${l.tp},${l.ep},${l.etp},${l.mbs}`;
    const ekey = `${l.tp},${l.mbs},${l.level},${l.encoderTp}`;
    let decoder = this.decoders.get(dkey);
    let encoder = this.encoders.get(ekey);
    if (decoder && encoder) return { decoder, encoder };
    const cfg = this.r.space.config;
    const R = cfg.model.image_encoder.deepstack_layers.length + 1;
    const world = this.r.space.nnodes * this.r.space.nprocPerNode;
    // one pipeline stage, and a batch of one microbatch per replica: the pieces of a microbatch
    // do not depend on either
    const reduced: CompileOptions = {
      ...options,
      overrides: [
        ...(options.overrides ?? []),
        `model.text_decoder.num_layers=${Math.min(R, cfg.model.text_decoder.num_layers)}`,
      ],
      parallel: { ...options.parallel, pp: 1, vpp: 1 },
      globalBatchSize: l.mbs * (world / l.tp),
      decoderFirstPipelineNumLayers: undefined,
      decoderLastPipelineNumLayers: undefined,
      recompute: undefined,
      offloadTensors: undefined,
    };
    const graph = trainingGraph(reduced);
    this.graphs++;
    const pieces = readPieces(graph, this.r.hardware);
    decoder ??= pieces.decoder;
    encoder ??= pieces.encoder;
    this.decoders.set(dkey, decoder);
    this.encoders.set(ekey, encoder);
    return { decoder, encoder };
  }
}

/** What the estimate of one layout reads. */
interface LayoutContext {
  readonly layout: Layout;
  readonly r: EstimatorRequest;
  readonly hw: HardwareProfile;
  readonly decoder: DecoderPieces;
  readonly encoder: EncoderPieces;
  readonly world: number;
  readonly dp: number;
  /** microbatches per data-parallel rank */
  readonly m: number;
  readonly shapeOf: (kind: string) => GroupShape;
  readonly policy: ReturnType<typeof policyOf>;
  /** the recompute policy's key */
  readonly rkey: string;
  readonly schedule: PipelineSchedule;
}

/** Seconds of a pass: the expert exchange apart (what A2A overlap hides), and the rest. */
interface Seconds {
  other: number;
  a2a: number;
}

interface StagedPasses {
  /** layers of each virtual stage, and its first */
  readonly split: readonly number[];
  readonly first: readonly number[];
  /** each virtual stage's forward and backward per microbatch */
  readonly vs: readonly { readonly f: Seconds; readonly b: Seconds }[];
  /** the encoder's forward and backward of one microbatch */
  readonly encoderF: number;
  readonly encoderB: number;
  /** the framework's host time to issue each virtual stage's forward and backward of one
   * microbatch, and the encoder's (hardware.ts HostSide; 0 on a profile without it) */
  readonly host: readonly number[];
  readonly encoderHost: number;
}

const total = (x: Seconds) => x.other + x.a2a;

/** One collective of `bytes` over the group of `kind` of the layout (flexTopK: cost.ts). */
function collective(
  c: LayoutContext,
  op: string,
  kind: string,
  bytes: number,
  flexTopK = 0,
): number {
  const { hw } = c;
  return groupCollectiveSeconds(
    op,
    c.shapeOf(kind),
    bytes,
    hw.links,
    hw.efficiency?.allToAll,
    flexTopK,
  );
}

/** A piece's work priced on the layout's groups (collectives are affine in their bytes). */
function pricedWork(c: LayoutContext, w: Work): Seconds {
  const comm = (m: Comms) => {
    let s = 0;
    for (const x of m.values()) {
      const zero = collective(c, x.op, x.group, 0, x.flexTopK);
      s += x.count * zero + (collective(c, x.op, x.group, x.bytes, x.flexTopK) - zero);
    }
    return s;
  };
  return { other: w.compute + comm(w.comms), a2a: comm(w.a2a) };
}

/** The layers priced, split over the virtual stages as the compiler splits them, and staged. */
function stagePasses(c: LayoutContext): StagedPasses {
  const { layout, decoder, encoder, hw, policy, rkey } = c;
  const { tp, pp, vpp, level } = layout;
  const L = c.r.space.config.model.text_decoder.num_layers;
  const R = decoder.layers.length;
  // the offload's copies hold up compute (compiler/emit/activations.ts pass 2): the next
  // layer's first kernel waits for the copy out, the layer's backward for the copy back
  const host = hw.links.host;
  const copy = (bytes: number) =>
    policy.offload.length ? host.latencyUs * 1e-6 + bytes / (host.gbps * 1e9) : 0;
  // per layer: forward and backward, recompute added to backward
  // the compiler splits on the forward and backward alone (recompute and offload are emission
  // passes, after the split): the split's weights leave them out
  const splitWeight: number[] = [];
  // the host's time for a layer's passes of one microbatch; at the forward's expert dispatch it
  // waits for the GPU, so a forward whose kernels outlast their issue adds the difference
  const layerHost: number[] = [];
  const layerCost = decoder.layers.map((l) => {
    const f = pricedWork(c, l.forward);
    const waits = l.forward.a2a.size > 0 ? Math.max(0, total(f) - l.forward.host) : 0;
    layerHost.push(
      l.forward.host +
        waits +
        l.backward.host +
        (rkey === 'none' ? 0 : l.recomputeOf(policy.recompute).host),
    );
    const b = pricedWork(c, l.backward);
    splitWeight.push(total(f) + total(b));
    const rec =
      rkey === 'none' ? { other: 0, a2a: 0 } : pricedWork(c, l.recomputeOf(policy.recompute));
    const moved = copy(l.offloadedOf(policy.offload).expected);
    return {
      f: { other: f.other + moved, a2a: f.a2a },
      b: { other: b.other + rec.other + moved, a2a: b.a2a + rec.a2a },
    };
  });
  const costAt = (i: number) => layerCost[Math.min(i, R - 1)];
  const embedF = total(pricedWork(c, decoder.embed.forward));
  const embedB = total(pricedWork(c, decoder.embed.backward));
  const postF = total(pricedWork(c, decoder.post.forward));
  const postB = total(pricedWork(c, decoder.post.backward));
  const encoderF = total(pricedWork(c, encoder.forward));
  const encoderB = total(pricedWork(c, encoder.backward));

  // the pipeline split: the compiler's min-max split of the priced pieces (pipeline.ts)
  const K = pp * vpp;
  const encoderPre =
    level === 1 ? encoderF + encoderB : level === 2 ? (encoderF + encoderB) / tp : 0;
  const split =
    pp > 1
      ? splitMinMax(
          Array.from({ length: L }, (_, i) => splitWeight[Math.min(i, R - 1)]),
          K,
          embedF + embedB + encoderPre,
          postF + postB,
        )
      : [L];
  const first: number[] = [];
  split.reduce((a, n) => (first.push(a), a + n), 0);
  // levels 2 and 3 broadcast each microbatch's encoder output to stage 0's TP group
  const broadcast =
    level >= 2 && tp > 1 ? collective(c, 'broadcast', 'tp', encoder.outputBytes) : 0;
  const vs = Array.from({ length: K }, (_, s) => {
    const f = { other: 0, a2a: 0 };
    const b = { other: 0, a2a: 0 };
    for (let i = first[s]; i < first[s] + split[s]; i++) {
      const x = costAt(i);
      f.other += x.f.other;
      f.a2a += x.f.a2a;
      b.other += x.b.other;
      b.a2a += x.b.a2a;
    }
    if (s === 0) {
      f.other += embedF + broadcast + (level === 1 ? encoderF : 0);
      b.other += embedB + broadcast + (level === 1 ? encoderB : 0);
    }
    if (s === K - 1) {
      f.other += postF;
      b.other += postB;
    }
    return { f, b };
  });
  const pieceHost = (w: { forward: Work; backward: Work }) => w.forward.host + w.backward.host;
  const encoderHost = pieceHost(encoder);
  const issue = Array.from({ length: K }, (_, s) => {
    let h = 0;
    for (let i = first[s]; i < first[s] + split[s]; i++) h += layerHost[Math.min(i, R - 1)];
    if (s === 0) h += pieceHost(decoder.embed) + (level === 1 ? encoderHost : 0);
    if (s === K - 1) h += pieceHost(decoder.post);
    return h;
  });
  return { split, first, vs, encoderF, encoderB, host: issue, encoderHost };
}

/** Layers of pipeline stage s over its chunks. */
const stageLayers = (c: LayoutContext, st: StagedPasses, s: number) => {
  let n = 0;
  for (let k = 0; k < c.layout.vpp; k++) n += st.split[k * c.layout.pp + s];
  return n;
};

/** Parameter elements of stage s: dense (embedding and output layer on their stages), expert,
 * encoder (stage 0, or every rank under full separation). */
function stageParams(c: LayoutContext, st: StagedPasses, s: number) {
  const p = c.decoder.params;
  const { pp, level } = c.layout;
  const layers = stageLayers(c, st, s);
  return {
    layers,
    dense: layers * p.layer.dense + (s === 0 ? p.embed : 0) + (s === pp - 1 ? p.post : 0),
    expert: layers * p.layer.expert,
    encoder: level === 3 || s === 0 ? c.encoder.params : 0,
  };
}

/** The step: level 3's encoder phases around the schedule's replay, then each stage's tail. */
function stepOf(c: LayoutContext, st: StagedPasses): number {
  const { layout, hw, decoder, encoder, m, world } = c;
  const { tp, pp, level, distopt } = layout;
  const p2pShape: GroupShape =
    world / pp >= c.r.space.nprocPerNode
      ? { size: 2, nodes: 2, local: 1 }
      : { size: 2, nodes: 1, local: 2 };
  const p2p =
    pp > 1 ? groupCollectiveSeconds('send', p2pShape, decoder.boundaryBytes, hw.links) : 0;
  const slowdown = hw.efficiency?.overlapSlowdown ?? 0;
  // level 2: each TP rank encodes one microbatch of a group of tp at its start, and runs its
  // backward after the group's last
  const extraF = (vs: number, mb: number) =>
    level === 2 && vs === 0 && mb % tp === 0 ? st.encoderF : 0;
  const extraB = (vs: number, mb: number) =>
    level === 2 && vs === 0 && (mb % tp === tp - 1 || mb === m - 1) ? st.encoderB : 0;
  const pipe = replay(c.schedule, {
    forward: (vs, mb) => total(st.vs[vs].f) + extraF(vs, mb),
    backward: (vs, mb) => total(st.vs[vs].b) + extraB(vs, mb),
    combined: (fv, fm, bv, bm) => {
      const F = st.vs[fv].f;
      const B = st.vs[bv].b;
      const compute = F.other + B.other;
      const a2a = F.a2a + B.a2a;
      const slowed = compute * (1 + slowdown * Math.min(1, a2a / Math.max(compute, 1e-12)));
      return Math.max(slowed, a2a) + extraF(fv, fm) + extraB(bv, bm);
    },
    p2p,
  });
  // level 3: the encoder before and after the pipeline, on every rank
  const rounds = Math.ceil(m / (tp * pp));
  const outputs = encoder.outputBytes * m;
  const phase1 = level === 3 ? rounds * st.encoderF + collective(c, 'gather_v', 'mp', outputs) : 0;
  const phase3 = level === 3 ? collective(c, 'scatter_v', 'mp', outputs) + rounds * st.encoderB : 0;

  // the gradient sums of the last backward, and the optimizer step, per stage
  const gradBytes = DTYPE_BYTES[c.r.precision.grad];
  const sync = (kind: string, elements: number) =>
    elements > 0 && c.shapeOf(kind).size > 1
      ? collective(c, distopt ? 'reduce_scatter' : 'all_reduce', kind, elements * gradBytes)
      : 0;
  const gather = (kind: string, elements: number) =>
    distopt && elements > 0 && c.shapeOf(kind).size > 1
      ? collective(c, 'all_gather', kind, elements * decoder.paramBytes)
      : 0;
  const encoderGroup = level === 3 ? 'world' : level === 2 ? 'tp_dp_cp' : 'dp';
  const shard = distopt ? 1 / c.dp : 1;
  const opt = decoder.optimizer;
  // the gradient norm: one f32 sum of squares all-reduced over every rank, before the update
  const norm = world > 1 ? collective(c, 'all_reduce', 'world', 4) : 0;
  let tail = 0;
  for (let s = 0; s < pp; s++) {
    const p = stageParams(c, st, s);
    const syncs = sync('dp', p.dense) + sync('edp', p.expert) + sync(encoderGroup, p.encoder);
    // buckets are summed as the last backward finishes them: what its chunk leaves exposed
    const exposedSync = Math.max(syncs / Math.max(1, p.layers), syncs - total(st.vs[s].b));
    const optimizer =
      (p.layers * opt.layer.compute +
        (s === 0 ? opt.embed.compute : 0) +
        (s === pp - 1 ? opt.post.compute : 0) +
        (p.encoder ? encoder.optimizer.compute : 0)) *
        shard +
      gather('dp', p.dense) +
      gather('edp', p.expert) +
      gather(encoderGroup, p.encoder);
    tail = Math.max(tail, pipe.finish[s] + exposedSync + norm + optimizer);
  }
  // the framework's host issues a stage's every pass in turn (stagePasses: with its waits at the
  // expert dispatches): no step is shorter
  let issued = 0;
  for (let s = 0; s < pp; s++) {
    let h = 0;
    for (let k = 0; k < layout.vpp; k++) h += st.host[k * pp + s];
    const encoded = level === 2 && s === 0 ? Math.ceil(m / tp) : level === 3 ? rounds : 0;
    issued = Math.max(issued, m * h + encoded * st.encoderHost);
  }
  return Math.max(phase1 + tail + phase3, issued);
}

/** The busiest stage's device bytes, at the bounds and at expected sizes. */
function memoryOf(c: LayoutContext, st: StagedPasses): { peakBound: number; peakExpected: number } {
  const { layout, decoder, encoder, m, dp, policy } = c;
  const { tp, pp, ep, etp, level } = layout;
  const edp = c.world / (etp * ep * pp); // expert data parallelism
  const kept = (l: LayerPieces) => l.keptOf(policy.recompute, policy.offload);
  const R = decoder.layers.length;
  const layerAt = (i: number) => decoder.layers[Math.min(i, R - 1)];
  const inflight = inFlight(c.schedule);
  const rounds = Math.ceil(m / (tp * pp));
  const staticBytes = (elements: number, d: number) => {
    const b = bytesPerParam({
      precision: c.r.precision,
      distributedOptimizer: layout.distopt,
      dataParallelSize: d,
    });
    return elements * (b.weight + b.grad + b.master + b.moments);
  };
  // one layer's working set: what recompute regenerates, and its largest value thrice
  const working = (k: keyof Bytes) =>
    Math.max(...decoder.layers.map((l) => l.keptOf('none', [])[k] - kept(l)[k] + 3 * l.largest[k]));
  let peakBound = 0;
  let peakExpected = 0;
  for (let s = 0; s < pp; s++) {
    const p = stageParams(c, st, s);
    // the encoder's gradients are summed, and its distributed optimizer state sharded, over the
    // ranks that encode: dp at levels 0–1, stage 0's tp·dp at level 2, every rank at level 3
    // (compiler/parallel/encoder.ts)
    const encoderGroup = level === 3 ? c.world : level === 2 ? tp * dp : dp;
    const fixed =
      staticBytes(p.dense, dp) + staticBytes(p.expert, edp) + staticBytes(p.encoder, encoderGroup);
    const mostInFlight = Math.max(...inflight[s].values(), 0);
    const at = (k: keyof Bytes) => {
      // the most a stage's chunks keep at once, over the schedule
      let keptBytes = 0;
      for (const [chunk, count] of inflight[s]) {
        const vs = chunk * pp + s;
        for (let i = st.first[vs]; i < st.first[vs] + st.split[vs]; i++)
          keptBytes += count * kept(layerAt(i))[k];
      }
      const encoderKept =
        level <= 1 && s === 0
          ? mostInFlight * encoder.kept[k]
          : level === 2 && s === 0
            ? Math.ceil(Math.min(mostInFlight + tp - 1, m) / tp) * encoder.kept[k]
            : level === 3
              ? rounds * encoder.kept[k]
              : 0;
      // the slots whose encoder inputs a rank holds: the ones it encodes from level 2 on
      const slots = level === 3 ? rounds : level === 2 ? Math.ceil(m / tp) : m;
      const batch =
        (s === 0 ? decoder.batch.first[k] * m : 0) +
        (s === pp - 1 ? decoder.batch.last[k] * m : 0) +
        (level === 3 || s === 0 ? encoder.batch[k] * slots : 0);
      return fixed + keptBytes + encoderKept + working(k) + batch;
    };
    peakBound = Math.max(peakBound, at('bound'));
    peakExpected = Math.max(peakExpected, at('expected'));
  }
  return { peakBound, peakExpected };
}

/** The layout's schedule, as compiler/pipeline.ts picks it. */
function scheduleOf(l: Layout, m: number): PipelineSchedule {
  const a2aOverlap = l.overlap;
  if (l.pp === 1)
    return a2aOverlap ? scheduleInterleaved(1, 1, m, 1, { a2aOverlap }) : schedule1F1B(1, m);
  return l.vpp > 1
    ? scheduleInterleaved(l.pp, l.vpp, m, l.pp, { a2aOverlap })
    : schedule1F1B(l.pp, m);
}

/** Per stage: chunk → the most microbatches whose forward it ran and backward it has not. */
function inFlight(s: PipelineSchedule): Map<number, number>[] {
  return s.stages.map((st) => {
    const live = new Map<number, number>();
    const most = new Map<number, number>();
    let total = 0;
    let best = -1;
    const add = (chunk: number, d: number) => {
      live.set(chunk, (live.get(chunk) ?? 0) + d);
      total += d;
      if (total > best) {
        best = total;
        most.clear();
        for (const [c, n] of live) most.set(c, n);
      }
    };
    for (const a of st.actions) {
      if (a.kind === 'F') add(a.chunk, 1);
      else if (a.kind === 'B') add(a.chunk, -1);
      else {
        // a combined step frees the backward's layers as the forward's fill (layer by layer)
        add(a.b.chunk, -1);
        add(a.f.chunk, 1);
      }
    }
    return most;
  });
}

interface ReplayCosts {
  forward(vs: number, mb: number): number;
  backward(vs: number, mb: number): number;
  combined(fvs: number, fmb: number, bvs: number, bmb: number): number;
  /** seconds a microbatch's activation or gradient takes between adjacent stages */
  readonly p2p: number;
}

/**
 * The schedule replayed as events: each stage runs its actions in order, a pass once its stage is
 * free and its input has arrived (forward: the previous virtual stage's forward, plus the link;
 * backward: the next one's backward, or the last virtual stage's own forward). Returns each
 * stage's finish.
 */
function replay(s: PipelineSchedule, c: ReplayCosts): { finish: number[] } {
  const { p, v, m } = s;
  const K = p * v;
  const fEnd = new Float64Array(K * m).fill(NaN);
  const bEnd = new Float64Array(K * m).fill(NaN);
  const free = new Float64Array(p);
  const next = new Int32Array(p);
  const vsOf = (chunk: number, stage: number) => chunk * p + stage;
  const fReady = (vs: number, mb: number) =>
    vs === 0 ? 0 : fEnd[(vs - 1) * m + mb] + ((vs - 1) % p !== vs % p ? c.p2p : 0);
  const bReady = (vs: number, mb: number) =>
    vs === K - 1 ? fEnd[vs * m + mb] : bEnd[(vs + 1) * m + mb] + c.p2p;
  let left = s.stages.reduce((a, st) => a + st.actions.length, 0);
  while (left > 0) {
    let progressed = false;
    for (let r = 0; r < p; r++) {
      const acts = s.stages[r].actions;
      while (next[r] < acts.length) {
        const a: Action = acts[next[r]];
        let start: number;
        if (a.kind === 'F') {
          const vs = vsOf(a.chunk, r);
          const ready = fReady(vs, a.microbatch);
          if (Number.isNaN(ready)) break;
          start = Math.max(free[r], ready);
          free[r] = fEnd[vs * m + a.microbatch] = start + c.forward(vs, a.microbatch);
        } else if (a.kind === 'B') {
          const vs = vsOf(a.chunk, r);
          const ready = bReady(vs, a.microbatch);
          if (Number.isNaN(ready)) break;
          start = Math.max(free[r], ready);
          free[r] = bEnd[vs * m + a.microbatch] = start + c.backward(vs, a.microbatch);
        } else {
          const fv = vsOf(a.f.chunk, r);
          const bv = vsOf(a.b.chunk, r);
          const fr = fReady(fv, a.f.microbatch);
          const br = bReady(bv, a.b.microbatch);
          if (Number.isNaN(fr) || Number.isNaN(br)) break;
          start = Math.max(free[r], fr, br);
          const end = start + c.combined(fv, a.f.microbatch, bv, a.b.microbatch);
          free[r] = fEnd[fv * m + a.f.microbatch] = bEnd[bv * m + a.b.microbatch] = end;
        }
        next[r]++;
        left--;
        progressed = true;
      }
    }
    if (!progressed) throw new Error('estimate: the schedule deadlocks in replay');
  }
  return { finish: [...free] };
}

// ---- reading the pieces off a reduced rank graph ---------------------------------------------

/** A reduced rank graph as the pieces read it: each node's work, who reads each value, sizes. */
class RankGraph {
  readonly work: readonly NodeWork[];
  readonly workOf = new Map<number, NodeWork>();
  readonly producer = new Map<string, number>();
  readonly readers = new Map<string, number[]>();
  /** the nodes as the emitter's module and tensor rules read instructions (values numbered) */
  readonly ins: { op: string; scope: string; inputs: number[]; outputs: number[] }[];
  readonly names: string[] = [];
  /** decoder layers in the graph */
  readonly layers: number;
  private readonly types: ReturnType<typeof valueTypes>;
  private readonly expected: (sym: string) => number;
  private readonly bound: (sym: string) => number;
  private readonly elementBytes: (t: TensorType) => number;
  /** the host side the simulator prices, if the profile has one (cost.ts pricedHost) */
  private readonly host: ReturnType<typeof pricedHost>;

  constructor(
    readonly g: Graph,
    readonly hw: HardwareProfile,
  ) {
    this.expected = expectedGraphSizes(g);
    this.host = pricedHost(hw);
    const bounds = new Map(g.symbols.map((s) => [s.name, s.bound]));
    this.bound = (sym) => bounds.get(sym) ?? 0;
    this.types = valueTypes(g);
    this.elementBytes = elementBytesOn(hw, this.types.values());
    this.work = graphWork(g, this.expected, this.elementBytes);
    for (const x of this.work) this.workOf.set(x.node, x);
    g.nodes.forEach((n, i) => {
      n.outputs.forEach((o) => this.producer.set(o.name, i));
      n.inputs.forEach((v) => {
        let list = this.readers.get(v);
        if (!list) this.readers.set(v, (list = []));
        list.push(i);
      });
    });
    const ids = new Map<string, number>();
    const idOf = (v: string) => {
      let k = ids.get(v);
      if (k === undefined) ids.set(v, (k = ids.size));
      return k;
    };
    this.ins = g.nodes.map((n) => ({
      op: n.op,
      scope: n.scope,
      inputs: n.inputs.map(idOf),
      outputs: n.outputs.map((o) => idOf(o.name)),
    }));
    for (const [v, k] of ids) this.names[k] = v;
    this.layers = 1 + Math.max(-1, ...g.nodes.map((n) => layerIndex(n.scope)));
  }

  valueBytes(v: string): Bytes {
    const t = this.types.get(v)!;
    const of = (size: (s: string) => number) =>
      resolveShape(t.shape, size).reduce((a, d) => a * d, 1) * this.elementBytes(t);
    return { bound: of(this.bound), expected: of(this.expected) };
  }

  numel(t: TensorType): number {
    return resolveShape(t.shape, this.bound).reduce((a, d) => a * d, 1);
  }

  /** whether a backward node reads v (`outside`: one not of decoder layer `layer`) */
  readInBackward(v: string, outside?: number): boolean {
    return (this.readers.get(v) ?? []).some(
      (k) =>
        this.g.nodes[k].phase === 'backward' &&
        (outside === undefined || layerIndex(this.g.nodes[k].scope) !== outside),
    );
  }

  /** adds a node's work to a piece: compute seconds, or a collective by op and group */
  add(w: Work, x: NodeWork): void {
    // as the simulator issues the node's instruction
    if (this.host) w.host += issueSeconds(this.host, x);
    if (x.category !== 'collective') {
      w.compute += workSeconds(x, this.hw);
      return;
    }
    if (x.op === 'send' || x.op === 'recv') return;
    const into = x.op === 'all_to_all_v' ? w.a2a : w.comms;
    const k = `${x.op}|${x.group}|${x.flexTopK ?? 0}`;
    const e = into.get(k);
    if (e) {
      e.count++;
      e.bytes += x.bytes;
    } else
      into.set(k, {
        op: x.op,
        group: x.group!,
        count: 1,
        bytes: x.bytes,
        flexTopK: x.flexTopK ?? 0,
      });
  }
}

const LAYER_SCOPE = /^model\.layers\.(\d+)(\.|$)/;
const layerIndex = (scope: string) => {
  const x = LAYER_SCOPE.exec(scope);
  return x ? Number(x[1]) : -1;
};
/** a node's pipeline piece by scope; 'other' for what belongs to none (the optimizer's own) */
const siteOf = (scope: string): 'embed' | 'encoder' | 'post' | 'layer' | 'other' => {
  try {
    const c = costSite(scope);
    return typeof c === 'string' ? c : 'layer';
  } catch {
    return 'other';
  }
};
const zeroBytes = (): Bytes => ({ bound: 0, expected: 0 });
const addBytes = (a: Bytes, b: Bytes) => {
  a.bound += b.bound;
  a.expected += b.expected;
};

function readPieces(
  g: Graph,
  hw: HardwareProfile,
): { decoder: DecoderPieces; encoder: EncoderPieces } {
  const rg = new RankGraph(g, hw);
  const R = rg.layers;
  const layerWork = Array.from({ length: R }, () => ({
    forward: emptyWork(),
    backward: emptyWork(),
  }));
  const pieceWork = {
    embed: { forward: emptyWork(), backward: emptyWork() },
    post: { forward: emptyWork(), backward: emptyWork() },
    encoder: { forward: emptyWork(), backward: emptyWork() },
  };
  const optimizer = {
    layer: emptyWork(),
    embed: emptyWork(),
    post: emptyWork(),
    encoder: emptyWork(),
  };
  for (const x of rg.work) {
    const n = g.nodes[x.node];
    if (n.phase === 'optimizer') {
      // AdamW and the norm of each parameter: by the parameter's piece (layers pooled per layer)
      const param = n.inputs.find((i) => /^(model|visual|lm_head)\./.test(i)) ?? n.scope;
      const ps = siteOf(param.replace(/\.(weight|bias)$/, ''));
      if (ps === 'layer') {
        const per = emptyWork();
        rg.add(per, x);
        optimizer.layer.compute += per.compute / R;
      } else if (ps !== 'other') rg.add(optimizer[ps], x);
      continue;
    }
    if (n.phase !== 'forward' && n.phase !== 'backward') continue;
    const s = siteOf(n.scope);
    if (s === 'layer') rg.add(layerWork[layerIndex(n.scope)][n.phase], x);
    else if (s !== 'other') rg.add(pieceWork[s][n.phase], x);
  }
  const layers = layerWork.map((w, i) => layerPieces(rg, i, w));
  return {
    decoder: {
      layers,
      embed: pieceWork.embed,
      post: pieceWork.post,
      optimizer: { layer: optimizer.layer, embed: optimizer.embed, post: optimizer.post },
      boundaryBytes: boundaryBytes(rg),
      ...paramsOf(rg),
      batch: batchOf(rg).decoder,
    },
    encoder: {
      forward: pieceWork.encoder.forward,
      backward: pieceWork.encoder.backward,
      optimizer: optimizer.encoder,
      ...encoderValues(rg),
      params: paramsOf(rg).encoderParams,
      batch: batchOf(rg).encoder,
    },
  };
}

/**
 * Decoder layer i: its work, and by recompute policy (the emitter's module rules, pass 1 of
 * compiler/emit/activations.ts) the forward run again and what is kept from forward to backward:
 * a value its forward makes and a backward reads, unless the recomputed region makes it and only
 * the layer's own backward reads it; the region's inputs made in the layer stay; an offloaded
 * tensor (pass 2's rules) is on the host.
 */
function layerPieces(rg: RankGraph, i: number, w: { forward: Work; backward: Work }): LayerPieces {
  const { g } = rg;
  const p = `model.layers.${i}`;
  const fw: number[] = [];
  g.nodes.forEach((n, k) => {
    if (n.phase === 'forward' && layerIndex(n.scope) === i) fw.push(k);
  });
  const inLayer = new Set(fw);
  const made = fw.flatMap((k) => g.nodes[k].outputs.map((o) => o.name));
  const regionOf = (r: Recompute) =>
    r === 'none'
      ? new Set<number>()
      : r === 'full'
        ? inLayer
        : new Set(r.flatMap((mod) => moduleInstructions(mod, fw, rg.ins, p)));
  const offloaded = (names: readonly OffloadTensor[]) =>
    new Set(names.flatMap((t) => offloadedBuffers(t, fw, rg.ins, p)).map((k) => rg.names[k]));
  const recompute = new Map<string, Work>();
  const kept = new Map<string, Bytes>();
  const pieces: LayerPieces = {
    forward: w.forward,
    backward: w.backward,
    recomputeOf(r) {
      const key = recomputeKey(r);
      let x = recompute.get(key);
      if (!x) {
        x = emptyWork();
        for (const k of regionOf(r)) {
          const nw = rg.workOf.get(k);
          if (nw) rg.add(x, nw);
        }
        recompute.set(key, x);
      }
      return x;
    },
    keptOf(r, offload) {
      const key = `${recomputeKey(r)}/${offload.join('+')}`;
      let b = kept.get(key);
      if (b) return b;
      const region = regionOf(r);
      const out = offloaded(offload);
      const keep = new Set<string>();
      for (const v of made) {
        if (!rg.readInBackward(v)) continue;
        if (!region.has(rg.producer.get(v)!) || rg.readInBackward(v, i)) keep.add(v);
      }
      for (const k of region)
        for (const v of g.nodes[k].inputs) {
          const at = rg.producer.get(v);
          if (at !== undefined && inLayer.has(at) && !region.has(at)) keep.add(v);
        }
      b = zeroBytes();
      for (const v of keep) if (!out.has(v)) addBytes(b, rg.valueBytes(v));
      kept.set(key, b);
      return b;
    },
    offloadedOf(offload) {
      const b = zeroBytes();
      for (const v of offloaded(offload)) addBytes(b, rg.valueBytes(v));
      return b;
    },
    largest: made.reduce((a, v) => {
      const b = rg.valueBytes(v);
      return { bound: Math.max(a.bound, b.bound), expected: Math.max(a.expected, b.expected) };
    }, zeroBytes()),
  };
  return pieces;
}

/** What crosses a stage boundary per microbatch: the last layer's output the next piece reads. */
function boundaryBytes(rg: RankGraph): number {
  const last = rg.layers - 1;
  let bytes = 0;
  for (const n of rg.g.nodes) {
    if (n.phase !== 'forward' || layerIndex(n.scope) !== last) continue;
    for (const o of n.outputs)
      if (
        (rg.readers.get(o.name) ?? []).some(
          (k) => rg.g.nodes[k].phase === 'forward' && layerIndex(rg.g.nodes[k].scope) !== last,
        )
      )
        bytes = Math.max(bytes, rg.valueBytes(o.name).expected);
  }
  return bytes;
}

/** Parameter elements of this rank: per decoder layer (dense, expert), embedding, the rest. */
function paramsOf(rg: RankGraph) {
  const experts = new Set<string>();
  for (const n of rg.g.nodes)
    if (n.op === 'grouped_linear') n.inputs.slice(2).forEach((w) => experts.add(w));
  const params = { layer: { dense: 0, expert: 0 }, embed: 0, post: 0 };
  let encoderParams = 0;
  let paramBytes = 2;
  for (const p of rg.g.params) {
    if (p.role !== 'param') continue;
    paramBytes = DTYPE_BYTES[p.type.dtype];
    const n = rg.numel(p.type);
    if (p.module === 'image_encoder' || p.module === 'image_projector') encoderParams += n;
    else if (LAYER_SCOPE.test(p.name)) {
      if (experts.has(p.name)) params.layer.expert += n / rg.layers;
      else params.layer.dense += n / rg.layers;
    } else if (/^model\.(embed_tokens|merge_visual)/.test(p.name)) params.embed += n;
    else params.post += n;
  }
  return { params, encoderParams, paramBytes };
}

/** What the encoder keeps per microbatch from forward to backward, and its output's bytes. */
function encoderValues(rg: RankGraph): { kept: Bytes; outputBytes: number } {
  const kept = zeroBytes();
  let outputBytes = 0;
  for (const n of rg.g.nodes) {
    if (n.phase !== 'forward' || siteOf(n.scope) !== 'encoder') continue;
    for (const o of n.outputs) {
      if (rg.readInBackward(o.name)) addBytes(kept, rg.valueBytes(o.name));
      const rs = rg.readers.get(o.name) ?? [];
      if (
        rs.some(
          (k) => rg.g.nodes[k].phase === 'forward' && siteOf(rg.g.nodes[k].scope) !== 'encoder',
        )
      )
        outputBytes += rg.valueBytes(o.name).expected;
    }
  }
  return { kept, outputBytes };
}

/** The batch slot of one microbatch: the decoder's inputs (first and last stage's), the encoder's. */
function batchOf(rg: RankGraph) {
  const first = zeroBytes();
  const last = zeroBytes();
  const encoder = zeroBytes();
  for (const x of rg.g.inputs) {
    const b = rg.valueBytes(x.name);
    const rs = rg.readers.get(x.name) ?? [];
    if (rs.some((k) => siteOf(rg.g.nodes[k].scope) === 'encoder')) addBytes(encoder, b);
    else if (rs.some((k) => siteOf(rg.g.nodes[k].scope) === 'post')) addBytes(last, b);
    else addBytes(first, b);
  }
  return { decoder: { first, last }, encoder };
}
