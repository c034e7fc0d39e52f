// lfc inspect <model> [overrides…]: parameters, FLOPs and memory by module.

import type { Command } from 'commander';
import { buildForwardGraph } from '../compiler/frontend/build.js';
import { loadModelConfig, type ModelConfig } from '../compiler/frontend/config.js';
import { loadHfModelConfig } from '../compiler/frontend/hf-config.js';
import { formatInspect, inspectModel } from '../compiler/inspect.js';
import { resolvePrecision } from '../compiler/frontend/precision.js';
import { printGraph } from '../ir/printer.js';
import { assertValid } from '../ir/verify.js';
import { UserError } from '../compiler/errors.js';
import type { CliIO } from './io.js';
import { imageSize, positiveInt } from './options.js';

interface InspectOptions {
  modelName?: string;
  hfConfig?: string;
  seqLength?: number;
  imageSize?: [number, number];
  json?: boolean;
  printIr?: boolean;
  bf16?: boolean;
  gradReduceInBf16?: boolean;
  useDistributedOptimizer?: boolean;
  dataParallelSize?: number;
}

export function defaultImageSize(cfg: ModelConfig): [number, number] {
  const e = cfg.model.image_encoder;
  const unit = e.patch_size * e.spatial_merge_size;
  const side = Math.max(unit, Math.floor(Math.min(e.max_image_size, 448) / unit) * unit);
  return [side, side];
}

export function addInspectCommand(program: Command, io: CliIO): void {
  program
    .command('inspect')
    .description(
      'parameters per module, training FLOPs per text token and per image, weight/grad/optimizer bytes',
    )
    .argument('[model]', 'preset name, LoongForge alias or YAML file')
    .argument('[overrides...]', 'Hydra-style overrides: key=value, +key=value, ~key')
    .option(
      '--model-name <name>',
      'the model, by preset name or LoongForge name (instead of the argument)',
    )
    .option(
      '--hf-config <file>',
      'the model from a Hugging Face config.json (or its directory), over the preset if one is named',
    )
    .option(
      '--seq-length <n>',
      "tokens per sequence for FLOPs (default: the preset's)",
      positiveInt('--seq-length'),
    )
    .option(
      '--image-size <HxW>',
      'image resolution for per-image FLOPs (default: 448x448 or the largest the encoder takes)',
      imageSize,
    )
    .option(
      '--bf16',
      'memory in mixed precision: bf16 weights, fp32 main gradients and master weights',
    )
    .option('--grad-reduce-in-bf16', 'with --bf16: bf16 main gradients')
    .option(
      '--use-distributed-optimizer',
      'memory with master weights and Adam moments sharded over --data-parallel-size ranks',
    )
    .option(
      '--data-parallel-size <n>',
      'the data-parallel ranks the distributed optimizer shards over (default 1)',
      positiveInt('--data-parallel-size'),
    )
    .option('--json', 'print the report as JSON')
    .option('--print-ir', 'print the forward graph of one microbatch in the IR text form')
    .action((model: string | undefined, overrides: string[], opts: InspectOptions) => {
      if (opts.hfConfig && model !== undefined && !opts.modelName && model.includes('=')) {
        overrides = [model, ...overrides];
        model = undefined;
      }
      const ref = opts.modelName ?? model;
      if (!ref && !opts.hfConfig)
        throw new UserError('inspect: name a model (a preset, a LoongForge name or a YAML file)');
      if (opts.modelName && model) overrides = [model, ...overrides];
      const cfg = opts.hfConfig
        ? loadHfModelConfig(opts.hfConfig, ref, overrides)
        : loadModelConfig(ref!, overrides);
      const seqLength = opts.seqLength ?? cfg.training.seq_length;
      const graph = buildForwardGraph(cfg, { seqLength });
      assertValid(graph, 'model builder');
      if (opts.printIr) {
        io.out(printGraph(graph));
        return;
      }
      const [imageHeight, imageWidth] = opts.imageSize ?? defaultImageSize(cfg);
      const report = inspectModel(graph, cfg, {
        seqLength,
        imageHeight,
        imageWidth,
        precision: resolvePrecision({ bf16: opts.bf16, gradReduceInBf16: opts.gradReduceInBf16 }),
        distributedOptimizer: opts.useDistributedOptimizer,
        dataParallelSize: opts.dataParallelSize,
      });
      io.out(opts.json ? JSON.stringify(report, null, 2) + '\n' : formatInspect(report));
    });
}
