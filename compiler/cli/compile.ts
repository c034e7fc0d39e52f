// lfc compile <model> [overrides…] -o DIR: plan + report.

import type { Command } from 'commander';
import { PASSES, compile, writePlan } from '../pipeline.js';
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
}

function mib(bytes: number): string {
  return `${(bytes / 2 ** 20).toFixed(2)} MiB`;
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
      io.out(
        [
          `compiled ${result.config.name} for 1 rank → ${f.output}`,
          `  sequence ${t.seqLength} × micro-batch ${t.microBatchSize}, ${t.numMicrobatches} microbatches per step, ≤ ${t.maxVisualTokens} visual tokens each`,
          `  graph: ${result.graph.nodes.length} nodes (${result.stats.autodiff.backwardNodes} backward, ${result.stats.autodiff.optimizerNodes} optimizer), ${result.stats.autodiff.trainableParams} trainable tensors`,
          `  program: ${e.instructions} instructions, ${e.buffers} buffers`,
          `  activation arena ${mib(e.arenaBytes)} (liveness lower bound ${mib(e.arenaLowerBoundBytes)}, ×${(e.arenaBytes / e.arenaLowerBoundBytes).toFixed(3)})`,
          '',
        ].join('\n'),
      );
    });
}
