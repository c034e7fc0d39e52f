// lfc compile <model> [overrides…] -o DIR: plan + report.

import type { Command } from 'commander';
import { PASSES, compile, writePlan } from '../pipeline.js';
import { describeLayout } from '../schedule/partition.js';
import { UserError } from '../errors.js';
import type { CliIO } from './index.js';
import { positiveInt, positiveNumber } from './options.js';

interface CompileFlags {
  modelName?: string;
  output?: string;
  seqLength?: number;
  microBatchSize?: number;
  globalBatchSize?: number;
  maxVisualTokens?: number;
  lr?: number;
  nnodes?: number;
  nodes?: number;
  nprocPerNode?: number;
  gpusPerNode?: number;
  dumpAfter?: string;
  json?: boolean;
  tensorModelParallelSize?: number;
  tp?: number;
  pipelineModelParallelSize?: number;
  pp?: number;
  numVirtualStagesPerPipelineRank?: number;
  vpp?: number;
  expertModelParallelSize?: number;
  ep?: number;
  expertTensorParallelSize?: number;
  contextParallelSize?: number;
  sequenceParallel?: boolean;
  useDistributedOptimizer?: boolean;
  microbatchGroupSizePerVpStage?: number;
  decoderFirstPipelineNumLayers?: number;
  decoderLastPipelineNumLayers?: number;
}

/** One value from a flag and its alias; both given and different is an error. */
function either(
  long: string,
  a: number | undefined,
  short: string,
  b: number | undefined,
): number | undefined {
  if (a !== undefined && b !== undefined && a !== b)
    throw new UserError(`${long} ${a} and ${short} ${b} disagree; give one`);
  return a ?? b;
}

/** bytes in the largest binary unit that keeps the number ≥ 1 (MiB at least) */
function mib(bytes: number): string {
  const units = ['MiB', 'GiB', 'TiB', 'PiB'];
  let k = 0;
  while (k + 1 < units.length && bytes >= 2 ** (20 + 10 * (k + 1))) k++;
  return `${(bytes / 2 ** (20 + 10 * k)).toFixed(2)} ${units[k]}`;
}

export function addCompileCommand(program: Command, io: CliIO): void {
  program
    .command('compile')
    .description('compile one training step of a model into an execution plan per rank')
    .argument('[model]', 'preset name, LoongForge alias or YAML file')
    .argument('[overrides...]', 'Hydra-style overrides: key=value, +key=value, ~key')
    .option(
      '--model-name <name>',
      'the model, by preset or LoongForge name (instead of the argument)',
    )
    .option(
      '-o, --output <dir>',
      'plan directory to write (replaced atomically if it holds a plan)',
    )
    .option(
      '--seq-length <n>',
      "tokens per sequence (default: the preset's)",
      positiveInt('--seq-length'),
    )
    .option(
      '--micro-batch-size <n>',
      'sequences per microbatch (packed)',
      positiveInt('--micro-batch-size'),
    )
    .option(
      '--global-batch-size <n>',
      'sequences per step over all data-parallel ranks',
      positiveInt('--global-batch-size'),
    )
    .option(
      '--max-visual-tokens <n>',
      'bound of visual tokens per microbatch (default: the token count)',
      positiveInt('--max-visual-tokens'),
    )
    .option(
      '--lr <x>',
      'peak learning rate (stored in the plan; lfc run can override)',
      positiveNumber('--lr'),
    )
    .option('--nnodes <n>', 'nodes in the cluster', positiveInt('--nnodes'))
    .option('--nodes <n>', 'alias of --nnodes', positiveInt('--nodes'))
    .option('--nproc-per-node <n>', 'ranks per node', positiveInt('--nproc-per-node'))
    .option('--gpus-per-node <n>', 'alias of --nproc-per-node', positiveInt('--gpus-per-node'))
    .option(
      '--tensor-model-parallel-size <n>',
      'decoder tensor parallelism (--tp)',
      positiveInt('--tensor-model-parallel-size'),
    )
    .option('--tp <n>', 'alias of --tensor-model-parallel-size', positiveInt('--tp'))
    .option(
      '--pipeline-model-parallel-size <n>',
      'pipeline stages (--pp)',
      positiveInt('--pipeline-model-parallel-size'),
    )
    .option('--pp <n>', 'alias of --pipeline-model-parallel-size', positiveInt('--pp'))
    .option(
      '--num-virtual-stages-per-pipeline-rank <n>',
      'model chunks per stage, interleaved schedule (--vpp)',
      positiveInt('--num-virtual-stages-per-pipeline-rank'),
    )
    .option('--vpp <n>', 'alias of --num-virtual-stages-per-pipeline-rank', positiveInt('--vpp'))
    .option(
      '--expert-model-parallel-size <n>',
      'expert parallelism (--ep)',
      positiveInt('--expert-model-parallel-size'),
    )
    .option('--ep <n>', 'alias of --expert-model-parallel-size', positiveInt('--ep'))
    .option(
      '--expert-tensor-parallel-size <n>',
      'tensor parallelism inside experts (default: --tp)',
      positiveInt('--expert-tensor-parallel-size'),
    )
    .option(
      '--context-parallel-size <n>',
      'context parallelism (only 1 is built)',
      positiveInt('--context-parallel-size'),
    )
    .option(
      '--use-distributed-optimizer',
      'shard AdamW state over data-parallel ranks (reduce-scatter gradients, all-gather parameters)',
    )
    .option(
      '--sequence-parallel',
      'shard activations along the sequence between tensor-parallel regions',
    )
    .option(
      '--microbatch-group-size-per-vp-stage <n>',
      'interleaved schedule: microbatches per group (default: --pp)',
      positiveInt('--microbatch-group-size-per-vp-stage'),
    )
    .option(
      '--decoder-first-pipeline-num-layers <n>',
      'decoder layers on the first pipeline stage',
      positiveInt('--decoder-first-pipeline-num-layers'),
    )
    .option(
      '--decoder-last-pipeline-num-layers <n>',
      'decoder layers on the last pipeline stage',
      positiveInt('--decoder-last-pipeline-num-layers'),
    )
    .option(
      '--dump-after <pass>',
      `print the IR after a pass (${PASSES.map((p) => p.name).join(', ')})`,
    )
    .option('--json', 'print the report as JSON')
    .action((model: string | undefined, overrides: string[], f: CompileFlags) => {
      const ref = f.modelName ?? model;
      if (!ref)
        throw new UserError('compile: name a model (a preset, a LoongForge name or a YAML file)');
      if (f.modelName && model) overrides = [model, ...overrides];
      if (!f.output && !f.dumpAfter)
        throw new UserError('compile: say where to write the plan with -o DIR');
      const result = compile({
        model: ref,
        overrides,
        seqLength: f.seqLength,
        microBatchSize: f.microBatchSize,
        globalBatchSize: f.globalBatchSize,
        maxVisualTokens: f.maxVisualTokens,
        nnodes: f.nnodes ?? f.nodes,
        nprocPerNode: f.nprocPerNode ?? f.gpusPerNode,
        parallel: {
          tp: either('--tensor-model-parallel-size', f.tensorModelParallelSize, '--tp', f.tp),
          pp: either('--pipeline-model-parallel-size', f.pipelineModelParallelSize, '--pp', f.pp),
          vpp: either(
            '--num-virtual-stages-per-pipeline-rank',
            f.numVirtualStagesPerPipelineRank,
            '--vpp',
            f.vpp,
          ),
          ep: either('--expert-model-parallel-size', f.expertModelParallelSize, '--ep', f.ep),
          etp: f.expertTensorParallelSize,
          cp: f.contextParallelSize,
        },
        sequenceParallel: f.sequenceParallel,
        distributedOptimizer: f.useDistributedOptimizer,
        microbatchGroupSize: f.microbatchGroupSizePerVpStage,
        decoderFirstPipelineNumLayers: f.decoderFirstPipelineNumLayers,
        decoderLastPipelineNumLayers: f.decoderLastPipelineNumLayers,
        optimizer: f.lr !== undefined ? { lr: f.lr } : {},
        dumpAfter: f.dumpAfter,
        onDump: (text) => io.out(text),
      });
      if (f.output) writePlan(f.output, result.plan, result.programs);
      if (f.dumpAfter) return;
      const e = result.stats.emit;
      const t = result.plan.training;
      if (f.json) {
        io.out(
          JSON.stringify({ output: f.output, training: t, stats: result.stats }, null, 2) + '\n',
        );
        return;
      }
      const sz = result.plan.topology.sizes;
      const world = result.plan.topology.worldSize;
      const layoutText = [
        `tp ${sz.tp}${f.sequenceParallel && sz.tp > 1 ? ' (sequence parallel)' : ''}`,
        `pp ${sz.pp}${sz.vpp > 1 ? ` × vpp ${sz.vpp}` : ''}`,
        `dp ${sz.dp}`,
        ...(sz.ep > 1 ? [`ep ${sz.ep} (expert dp ${sz.edp})`] : []),
        ...(f.useDistributedOptimizer && sz.dp > 1 ? ['distributed optimizer'] : []),
      ].join(', ');
      const programs = result.programs.length;
      io.out(
        [
          `compiled ${result.config.name} for ${world} rank${world > 1 ? 's' : ''} (${layoutText}; ${programs} distinct program${programs > 1 ? 's' : ''}) → ${f.output}`,
          ...(result.layout ? describeLayout(result.layout).map((l) => `  ${l}`) : []),
          `  sequence ${t.seqLength} × micro-batch ${t.microBatchSize}, ${t.numMicrobatches} microbatches per step per data-parallel rank, ≤ ${t.maxVisualTokens} visual tokens each`,
          `  graph: ${result.graph.nodes.length} nodes (${result.stats.autodiff.backwardNodes} backward, ${result.stats.autodiff.optimizerNodes} optimizer), ${result.stats.autodiff.trainableParams} trainable tensors on each rank`,
          `  program${programs > 1 ? 's (largest)' : ''}: ${e.instructions} instructions, ${e.buffers} buffers; plan verified in ${(result.stats.verify.ms / 1000).toFixed(2)} s`,
          `  activation arena ${mib(e.arenaBytes)} (liveness lower bound ${mib(e.arenaLowerBoundBytes)}, ×${(e.arenaBytes / e.arenaLowerBoundBytes).toFixed(3)})`,
          '',
        ].join('\n'),
      );
    });
}
