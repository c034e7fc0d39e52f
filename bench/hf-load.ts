// bench/hf-load: one rank's share of a Hugging Face checkpoint, read as a stream (acceptance 4b).
// A sparse, sharded checkpoint with Qwen2.5-VL-7B's names and shapes, bf16 on disk, is written as
// export-hf would lay it out (headers, then ftruncate: it takes no disk; its data reads as zeros),
// and rank 0 of qwen2.5-vl-7b under tp 4 (a bf16 plan) reads its pieces into buffers of its
// share with lfc run --load-hf's reader (runtime/hf/load.ts), without the native runtime.
//
//   npx tsx bench/hf-load.ts [--tp 4] [--rank 0] [--model qwen2.5-vl-7b]
//
// Printed: the checkpoint's size, the rank's share, the bytes and reads the load made, its time
// against a yardstick (the same bytes read front to back), and the peak RSS against the share:
// peak RSS − share (Node, the plan, one read window) stays under a constant whatever the share.

import {
  closeSync,
  ftruncateSync,
  openSync,
  readSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { hfConfigOf } from '../compiler/frontend/hf-config.js';
import type { ModelConfig } from '../compiler/frontend/config.js';
import { compile } from '../compiler/pipeline.js';
import { heldPieces } from '../runtime/checkpoint.js';
import { assignShards, shardName } from '../runtime/hf/export.js';
import { closeLoadPlan, planHfLoad, readPieces } from '../runtime/hf/load.js';
import { hfMap } from '../runtime/hf/names.js';
import { INDEX_FILE, WINDOW_BYTES } from '../runtime/hf/reader.js';
import { headerBytes } from '../runtime/safetensors.js';
import { benchDir } from './temp-dir.js';

function arg(name: string, def: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
}

const MiB = 2 ** 20;
const GiB = 2 ** 30;
const rssBytes = () => process.resourceUsage().maxRSS * 1024;
const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

const model = arg('model', 'qwen2.5-vl-7b');
const tp = Number(arg('tp', '4'));
const rank = Number(arg('rank', '0'));
const dir = benchDir('lfc-bench-hf-');

// 1. the plan: its parameters (whole) and rank's pieces
const { plan, programs } = compile({
  model,
  nprocPerNode: tp,
  parallel: { tp },
  precision: { bf16: true },
  skipVerify: true,
});
const config = plan.model.config as ModelConfig['model'];
const pieces = heldPieces(
  plan,
  programs.find((p) => p.id === plan.rankPrograms[rank])!,
  rank,
);

// 2. the sparse checkpoint: every shard's header, then its length (5 GB shards, bf16)
const map = hfMap(plan.params, config);
const shards = assignShards(map.tensors, 'BF16', 5e9);
const weightMap: Record<string, string> = {};
let totalBytes = 0;
let diskBytes = 0;
shards.forEach((tensors, i) => {
  const file = shardName(i, shards.length);
  const { bytes, dataBytes } = headerBytes(
    tensors.map((t) => ({ name: t.name, dtype: 'BF16', shape: t.shape })),
    { format: 'pt' },
  );
  const fd = openSync(join(dir, file), 'w');
  writeSync(fd, bytes);
  ftruncateSync(fd, bytes.length + dataBytes);
  closeSync(fd);
  diskBytes += statSync(join(dir, file)).blocks * 512;
  totalBytes += dataBytes;
  for (const t of tensors) weightMap[t.name] = file;
});
writeFileSync(
  join(dir, INDEX_FILE),
  JSON.stringify({ metadata: { total_size: totalBytes }, weight_map: weightMap }),
);
writeFileSync(join(dir, 'config.json'), JSON.stringify(hfConfigOf(config, 'bfloat16').json));

// 3. the load: rank's pieces into buffers of its share (bf16, as the plan holds them);
// the runtime holds its arena before it loads, so the share is allocated (pages touched)
// first, a buffer per piece as the plan lays them out
const before = rssBytes();
const allocStarted = performance.now();
const buffers = new Map(
  pieces.map((p) => [p.param, new Uint16Array(numel(p.index.map((l) => l.length))).fill(1)]),
);
const shareElements = [...buffers.values()].reduce((a, b) => a + b.length, 0);
const allocMs = performance.now() - allocStarted;
const started = performance.now();
const lp = planHfLoad([{ dir, part: 'all' }], plan.model.name, config, plan.params, pieces);
const checkedMs = performance.now() - started;
readPieces(lp, (r) => ({ bf16: buffers.get(r.param)! }));
const ms = performance.now() - started;
const peak = rssBytes();
const stats = lp.dirs[0].stats;
closeLoadPlan(lp);

// the yardstick: as many bytes read from a fresh sparse file in 8 MiB reads, front to back
const yard = join(dir, 'yardstick.bin');
const yfd = openSync(yard, 'w+');
ftruncateSync(yfd, stats.bytes);
const chunk = new Uint8Array(WINDOW_BYTES);
const yStarted = performance.now();
for (let at = 0; at < stats.bytes; at += chunk.length)
  readSync(yfd, chunk, 0, Math.min(chunk.length, stats.bytes - at), at);
const yardMs = performance.now() - yStarted;
closeSync(yfd);

const shareBytes = shareElements * 2;
const overhead = peak - shareBytes;
console.log(
  `${model}: ${map.tensors.length} tensors, ${(totalBytes / GiB).toFixed(2)} GiB bf16 in ${shards.length} shards (sparse: ${(diskBytes / MiB).toFixed(1)} MiB on disk)`,
);
console.log(
  `rank ${rank} of tp ${tp}: ${pieces.length} pieces, share ${(shareBytes / GiB).toFixed(3)} GiB (allocated and touched in ${(allocMs / 1000).toFixed(2)} s before the load)`,
);
console.log(
  `load: ${(ms / 1000).toFixed(2)} s (headers and checks ${checkedMs.toFixed(0)} ms): ${stats.reads} reads of ${(stats.bytes / GiB).toFixed(3)} GiB (${stats.bytes === shareBytes ? 'exactly the share' : `${(stats.bytes / shareBytes).toFixed(3)}× the share`}), ${(shareBytes / GiB / (ms / 1000)).toFixed(2)} GiB/s of share`,
);
console.log(
  `yardstick: the same ${(stats.bytes / GiB).toFixed(3)} GiB read front to back in ${WINDOW_BYTES / MiB} MiB reads from a fresh sparse file: ${(yardMs / 1000).toFixed(2)} s (the load takes ${(ms / yardMs).toFixed(2)}× that)`,
);
const bound = 256 * MiB;
console.log(
  `peak RSS ${(peak / GiB).toFixed(3)} GiB = share ${(shareBytes / GiB).toFixed(3)} GiB + ${(overhead / MiB).toFixed(0)} MiB (the process before the load: ${(before / MiB).toFixed(0)} MiB); stays under share + ${bound / MiB} MiB (Node, the plan, one ${WINDOW_BYTES / MiB} MiB read window): ${overhead <= bound ? 'yes' : 'NO'}`,
);
