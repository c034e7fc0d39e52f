// The passes that split a step over ranks: golden text after each (--dump-after), and the
// properties the text shows: expert parallelism keeps E/ep local experts and exchanges rows by
// all_to_all_v; tensor parallelism splits column/row parameters, heads (GQA kept), the
// vocabulary, inserts the conjugate collectives and the vocabulary-parallel loss; the pipeline
// split moves values only between consecutive virtual stages.
import { describe, expect, it } from 'vitest';
import type { ModelConfig } from '../../compiler/frontend/config.js';
import { compile } from '../../compiler/pipeline.js';
import { parseGraph } from '../../ir/parser.js';
import { expectGolden } from '../golden.js';

function dump(pass: string, opts: Parameters<typeof compile>[0]): string {
  let text = '';
  compile({ ...opts, dumpAfter: pass, onDump: (t) => (text = t) });
  return text;
}

const moe4 = { model: 'tiny-vlm-moe', nprocPerNode: 4, globalBatchSize: 8 };
/** the encoder shares the decoder's TP (level 0): the tiny encoders' YAML says TP 1 */
const encoderTp = (n: number) => [`model.image_encoder.tensor_model_parallel_size=${n}`];

describe('expert-parallel pass (tiny-vlm-moe, ep 2)', () => {
  const text = dump('expert-parallel', { ...moe4, parallel: { ep: 2 } });
  const g = parseGraph(text);
  it('golden', () => expectGolden('tiny-vlm-moe.ep2.ir', text));
  it('keeps 4 of 8 experts per layer, named by their global index through dist', () => {
    const experts = g.params.filter((p) => p.dist?.expert);
    expect(experts).toHaveLength(4 * 4 * 3); // layers × local experts × (gate, up, down)
    for (const p of experts) {
      expect(p.dist!.replicas).toBe('edp');
      expect(p.dist!.expert).toMatchObject({ group: 'ep', perRank: 4 });
      expect(p.dist!.name).toMatch(/\.experts\.\{\}\./);
    }
  });
  it('exchanges counts and rows with all_to_all_v over ep, and back', () => {
    const a2a = g.nodes.filter((n) => n.op === 'all_to_all_v');
    expect(a2a).toHaveLength(4 * 3); // per layer: counts, rows, rows back
    for (const n of a2a) expect(n.attrs).toMatchObject({ group: 'ep', group_size: 2 });
    expect(g.symbols.map((s) => s.name)).toEqual(['S', 'Nv', 'Rx0', 'Rx1', 'Rx2', 'Rx3']);
  });
});

// Megatron's --moe-expert-capacity-factor: tiny-vlm-moe has T = 128 tokens, top-2 of E = 8 experts,
// so T·k = 256 assignments and capacity ceil(256/8 · C) = 32 C; on ep 2 a rank holds L = 4 experts.
describe('expert capacity bounds the dispatch (tiny-vlm-moe, ep 2)', () => {
  const at = (moeExpertCapacityFactor?: number) =>
    compile({ ...moe4, parallel: { ep: 2 }, moeExpertCapacityFactor });
  const [none, one, half] = [at(), at(1), at(0.5)];
  const bound = (r: ReturnType<typeof at>, name: string) =>
    r.plan.symbols.find((s) => s.name === name)?.bound;
  /** bytes of the largest buffer whose rows are the symbol, in stage 0's program */
  const rowsBytes = (r: ReturnType<typeof at>, name: string) =>
    Math.max(...r.programs[0].buffers.filter((b) => b.shape[0] === name).map((b) => b.bytes));

  it('without a capacity a rank may receive every row of every ep rank: ep × T·k', () => {
    expect(bound(none, 'Rx0')).toBe(2 * 256);
    expect(bound(none, 'Nk0')).toBeUndefined();
  });
  it('with one, at most ep × L × capacity rows, and a permute keeps at most min(T·k, E·capacity)', () => {
    expect([bound(one, 'Nk0'), bound(one, 'Rx0')]).toEqual([256, 2 * 4 * 32]);
    expect([bound(half, 'Nk0'), bound(half, 'Rx0')]).toEqual([128, 2 * 4 * 16]);
    const permute = one.graph.nodes.find((n) => n.op === 'moe_permute')!;
    expect(permute.attrs).toMatchObject({ num_experts: 8, capacity: 32, out_rows: ['Nk0'] });
  });
  it('the config key model.text_decoder.moe_expert_capacity_factor does the same as the flag', () => {
    const overrides = ['+model.text_decoder.moe_expert_capacity_factor=0.5'];
    const viaConfig = compile({ ...moe4, parallel: { ep: 2 }, overrides });
    expect([bound(viaConfig, 'Nk0'), bound(viaConfig, 'Rx0')]).toEqual([128, 2 * 4 * 16]);
  });
  it('the received-rows buffers of the plan shrink with the bound', () => {
    const base = rowsBytes(none, 'Rx0');
    expect(rowsBytes(one, 'Rx0')).toBe(base / 2);
    expect(rowsBytes(half, 'Rx0')).toBe(base / 4);
    // the plan records what was compiled
    const config = one.plan.model.config as ModelConfig['model'];
    expect(config.text_decoder.moe_expert_capacity_factor).toBe(1);
  });
});

// Megatron's all-to-all dispatcher under SP: tiny-vlm-moe has S ≤ 128 tokens, hidden 128 and top-2
// routing, so a tp 2 rank routes its own S/2 tokens (S assignments) where the whole sequence has 2·S.
describe('the MoE dispatch under sequence parallelism (tiny-vlm-moe, tp 2, ep 2)', () => {
  const r = compile({ ...moe4, parallel: { tp: 2, ep: 2 } });
  const mlp = (layer: number) =>
    r.graph.nodes.filter((n) => n.phase === 'forward' && n.scope === `model.layers.${layer}.mlp`);
  const bound = (name: string) => r.plan.symbols.find((s) => s.name === name)?.bound;
  it('is on by default for MoE with tp and ep above 1 (Megatron requires it)', () => {
    expect(r.sequenceParallel).toBe(true);
    expect(compile({ ...moe4, parallel: { tp: 2 } }).sequenceParallel).toBe(false);
  });
  it("routes each rank's own tokens and sends only their rows over ep", () => {
    const permute = mlp(0).find((n) => n.op === 'moe_permute')!;
    // S/tp tokens routed 2 ways: S rows (the whole sequence's permute has 2·S)
    expect(permute.outputs[0].type.shape).toEqual([{ sym: 'S', num: 1, den: 1 }, 128]);
    // the dispatch's bound: ep × the 128 rows a rank sends; the experts' rows: tp × that
    expect([bound('Rx0'), bound('Rg0')]).toEqual([2 * 128, 2 * 2 * 128]);
  });
  it('gathers the rows inside the tp group for the experts and scatters them back summed', () => {
    const ops = mlp(0).map((n) => `${n.op}${n.attrs.group ? `:${String(n.attrs.group)}` : ''}`);
    const at = (op: string) => ops.indexOf(op);
    expect(
      ops.filter((o) => /^(all_gather_v|reduce_scatter_v|all_to_all_v|all_reduce)/.test(o)),
    ).toEqual([
      'all_to_all_v:ep',
      'all_to_all_v:ep',
      'all_gather_v:tp',
      'reduce_scatter_v:tp',
      'all_to_all_v:ep',
    ]);
    expect(at('all_gather_v:tp')).toBeLessThan(at('reduce_scatter_v:tp'));
    // the backward: the conjugates, over the same counts
    const back = r.graph.nodes.filter(
      (n) => n.phase === 'backward' && n.scope === 'model.layers.0.mlp',
    );
    expect(back.filter((n) => n.op === 'all_gather_v')).toHaveLength(1);
    expect(back.filter((n) => n.op === 'reduce_scatter_v')).toHaveLength(1);
  });
  it('under an expert capacity, the router sees every token of the microbatch (gathered first)', () => {
    const capped = compile({ ...moe4, parallel: { tp: 2, ep: 2 }, moeExpertCapacityFactor: 1 });
    const permute = capped.graph.nodes.find((n) => n.op === 'moe_permute')!;
    expect(capped.graph.nodes.some((n) => n.op === 'all_gather_v')).toBe(false);
    expect(
      capped.graph.nodes.find((n) => n.outputs.some((o) => o.name === permute.inputs[0]))!.op,
    ).toBe('all_gather');
  });
});

describe('tensor-parallel pass (tiny-vlm-moe, tp 2, encoder tp 2)', () => {
  const text = dump('tensor-parallel', { ...moe4, parallel: { tp: 2 }, overrides: encoderTp(2) });
  const g = parseGraph(text);
  it('golden', () => expectGolden('tiny-vlm-moe.tp2.ir', text));
  it('splits column, row and vocabulary parameters in half, and nothing else', () => {
    for (const p of g.params) {
      const split = p.dist!.split.map((s, d) => (s ? d : -1)).filter((d) => d >= 0);
      const whole = p.dist!.shape;
      const local = p.type.shape as number[];
      if (/(q_proj|k_proj|v_proj|gate_proj|up_proj|fc1|qkv)\.(weight|bias)$/.test(p.name))
        expect(split).toEqual([0]);
      else if (/(o_proj|down_proj|fc2|attn\.proj)\.weight$/.test(p.name))
        expect(split).toEqual([1]);
      else if (/^(model\.embed_tokens|lm_head)\.weight$/.test(p.name)) expect(split).toEqual([0]);
      else expect(split).toEqual([]);
      local.forEach((n, d) => expect(n).toBe(split.includes(d) ? whole[d] / 2 : whole[d]));
    }
    const qkv = g.params.find((p) => p.name === 'visual.blocks.0.attn.qkv.weight')!;
    expect(qkv.dist!.split[0]).toEqual({ group: 'tp', parts: 2, blocks: 3 });
  });
  it('halves query and key/value heads alike (GQA groups kept)', () => {
    const attn = g.nodes.filter((n) => n.op === 'attention' && n.scope.startsWith('model.'));
    for (const n of attn) {
      const t = (v: string) => g.nodes.flatMap((m) => m.outputs).find((o) => o.name === v)!.type;
      expect([t(n.inputs[0]).shape[1], t(n.inputs[1]).shape[1]]).toEqual([4, 2]);
    }
  });
  it('computes the loss from vocabulary shards: no whole-vocabulary cross_entropy', () => {
    const ops = g.nodes.map((n) => n.op);
    expect(ops).not.toContain('cross_entropy');
    for (const op of ['vocab_logsumexp', 'lse_combine', 'vocab_target_logit', 'ce_from_stats'])
      expect(ops).toContain(op);
    const embedding = g.nodes.find(
      (n) => n.op === 'embedding' && n.scope === 'model.embed_tokens',
    )!;
    expect(embedding.attrs).toMatchObject({ shard_group: 'tp', group_size: 2 });
  });
  it('sums each row-parallel product once, and copies into each column-parallel region', () => {
    const count = (op: string) => g.nodes.filter((n) => n.op === op).length;
    // decoder: o_proj and the experts per layer; encoder: attn.proj, fc2 per block; merger fc2;
    // embedding; the target logit of the loss and of the caption metric
    expect(count('all_reduce')).toBe(4 * 2 + 2 * 2 + 1 + 1 + 2);
    // one copy per region input, shared by its column-parallel consumers: q/k/v and the experts
    // per layer; qkv and fc1 per encoder block; merger fc1; lm_head
    expect(count('copy_to_group')).toBe(4 * 2 + 2 * 2 + 1 + 1);
  });
});

describe('tensor-parallel pass with sequence parallelism (tiny-vlm, tp 2, encoder tp 2)', () => {
  const text = dump('tensor-parallel', {
    model: 'tiny-vlm',
    nprocPerNode: 2,
    globalBatchSize: 2,
    parallel: { tp: 2 },
    overrides: encoderTp(2),
    sequenceParallel: true,
  });
  const g = parseGraph(text);
  it('golden', () => expectGolden('tiny-vlm.tp2-sp.ir', text));
  it('gathers before and reduce-scatters after every decoder TP region; norms sum over tp', () => {
    const decoder = g.nodes.filter((n) => n.scope.startsWith('model.layers.'));
    const count = (op: string) => decoder.filter((n) => n.op === op).length;
    expect(count('all_gather')).toBe(4 * 2); // attention and MLP inputs of each layer
    expect(count('reduce_scatter')).toBe(4 * 2);
    const norm = g.params.find((p) => p.name === 'model.layers.0.input_layernorm.weight')!;
    expect(norm.dist!.gradSum).toEqual(['tp']);
  });
});

describe('hetero TP (level 1): the encoder with its own TP inside the decoder TP group', () => {
  const encoderParams = (text: string) =>
    parseGraph(text).params.filter((p) => p.name.startsWith('visual.'));
  const encoderNodes = (text: string) =>
    parseGraph(text).nodes.filter((n) => n.scope.startsWith('visual'));
  const collectives = ['all_reduce', 'all_gather', 'reduce_scatter', 'copy_to_group'];

  it('encoder tp 1 under decoder tp 2: encoder and projector whole, without collectives', () => {
    const text = dump('tensor-parallel', { ...moe4, parallel: { tp: 2 } });
    for (const p of encoderParams(text))
      expect(p.dist?.split.every((s) => s === null) ?? true).toBe(true);
    expect(encoderNodes(text).filter((n) => collectives.includes(n.op))).toEqual([]);
    // the decoder still splits
    const q = parseGraph(text).params.find(
      (p) => p.name === 'model.layers.0.self_attn.q_proj.weight',
    )!;
    expect(q.dist!.split[0]).toEqual({ group: 'tp', parts: 2, blocks: 1 });
  });

  it('encoder tp 2 under decoder tp 4: encoder pieces and collectives on enc_tp of 2', () => {
    const text = dump('tensor-parallel', {
      ...moe4,
      parallel: { tp: 4 },
      overrides: encoderTp(2),
    });
    const qkv = encoderParams(text).find((p) => p.name === 'visual.blocks.0.attn.qkv.weight')!;
    expect(qkv.dist!.split[0]).toEqual({ group: 'enc_tp', parts: 2, blocks: 3 });
    const colls = encoderNodes(text).filter((n) => collectives.includes(n.op));
    expect(colls.length).toBeGreaterThan(0);
    for (const n of colls) expect(n.attrs).toMatchObject({ group: 'enc_tp', group_size: 2 });
    // the decoder keeps its own tp of 4
    const q = parseGraph(text).params.find(
      (p) => p.name === 'model.layers.0.self_attn.q_proj.weight',
    )!;
    expect(q.dist!.split[0]).toEqual({ group: 'tp', parts: 4, blocks: 1 });
  });
});

describe('pipeline pass (tiny-vlm-moe, pp 2, vpp 2)', () => {
  const text = dump('pipeline', { ...moe4, parallel: { pp: 2, vpp: 2 } });
  it('golden', () => expectGolden('tiny-vlm-moe.pp2-vpp2.pipeline.txt', text));
  it('puts layer i in chunk i, the encoder first, the loss last; transfers between neighbours', () => {
    const lines = text.trim().split('\n');
    for (const l of lines.filter((x) => x.startsWith('chunk'))) {
      const [, c] = /^chunk (\d+)/.exec(l)!;
      const layer = /scope=model\.layers\.(\d+)/.exec(l);
      if (layer) expect(Number(c)).toBe(Number(layer[1]));
      if (/scope=visual/.test(l)) expect(c).toBe('0');
      if (/scope=(loss|lm_head)/.test(l)) expect(c).toBe('3');
    }
    const hops = lines.filter((l) => l.startsWith('transfer'));
    expect(hops.length).toBeGreaterThan(0);
    for (const h of hops) {
      const [, a, b] = /chunk (\d+) → (\d+)/.exec(h)!;
      expect(Math.abs(Number(a) - Number(b))).toBe(1);
    }
  });
});

describe('the issue layouts of qwen3-vl-30b-a3b on 32 ranks compile and verify', () => {
  const base = {
    model: 'qwen3-vl-30b-a3b',
    nnodes: 4,
    nprocPerNode: 8,
    seqLength: 32768,
    microBatchSize: 1,
    globalBatchSize: 64,
  };
  it.each([
    ['tp 1, pp 2, ep 8, vpp 2', { parallel: { tp: 1, pp: 2, ep: 8, vpp: 2 } }],
    ['tp 4, pp 2, ep 4', { parallel: { tp: 4, pp: 2, ep: 4 } }],
    [
      'tp 1, pp 2, ep 8, vpp 2, distributed optimizer',
      { parallel: { tp: 1, pp: 2, ep: 8, vpp: 2 }, distributedOptimizer: true },
    ],
  ])(
    '%s',
    (_, extra) => {
      // compile() runs the plan verifier and throws on any problem
      const r = compile({ ...base, ...extra });
      expect(r.plan.topology.worldSize).toBe(32);
      expect(new Set(r.plan.rankPrograms).size).toBe(2);
    },
    120_000,
  );
});
