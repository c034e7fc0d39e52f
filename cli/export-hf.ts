// lfc export-hf OUT --load CKPT (--plan DIR | --model NAME [overrides…]): an lfc checkpoint as a
// Hugging Face model directory (runtime/hf/export.ts): config.json, safetensors shards in the
// model's name family and their index.

import type { Command } from 'commander';
import { InvalidArgumentError, Option } from 'commander';
import { buildForwardGraph } from '../compiler/frontend/build.js';
import { loadModelConfig, type ModelConfig } from '../compiler/frontend/config.js';
import { architectureOfModel, loadHfModelConfig } from '../compiler/frontend/hf-config.js';
import { UserError } from '../compiler/errors.js';
import { readPlan } from '../runtime/plan-io.js';
import { DEFAULT_MAX_SHARD_BYTES, exportHf } from '../runtime/hf/export.js';
import type { ParamShape } from '../runtime/hf/names.js';
import type { CliIO } from './io.js';

interface ExportFlags {
  load?: string;
  plan?: string;
  model?: string;
  hfConfig?: string;
  dtype: 'bf16' | 'fp32';
  maxShardSize?: number;
}

const UNITS: Record<string, number> = {
  '': 1,
  B: 1,
  KB: 1e3,
  MB: 1e6,
  GB: 1e9,
  TB: 1e12,
  KIB: 2 ** 10,
  MIB: 2 ** 20,
  GIB: 2 ** 30,
  TIB: 2 ** 40,
};

/** `5GB`, `500MB`, `2GiB` or bytes (transformers' units: GB is 10⁹ bytes) */
export function byteSize(v: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$/i.exec(v);
  const unit = m ? UNITS[(m[2] ?? '').toUpperCase()] : undefined;
  const n = m && unit !== undefined ? Math.floor(Number(m[1]) * unit) : NaN;
  if (!Number.isFinite(n) || n < 1)
    throw new InvalidArgumentError(
      `--max-shard-size must be a size like 5GB, 500MB or 2GiB, got '${v}'`,
    );
  return n;
}

/** The model the checkpoint is of, and its whole parameters. */
function modelOf(
  f: ExportFlags,
  overrides: readonly string[],
): { name: string; model: ModelConfig['model']; params: ParamShape[] } {
  const given = [f.plan && '--plan', f.model && '--model', f.hfConfig && '--hf-config'].filter(
    Boolean,
  );
  if (f.plan && given.length > 1)
    throw new UserError(`--plan names the model; drop ${given.slice(1).join(' and ')}`);
  if (f.plan) {
    if (overrides.length)
      throw new UserError(`--plan names the model; overrides (${overrides[0]}) need --model`);
    const { plan } = readPlan(f.plan);
    return {
      name: plan.model.name,
      model: plan.model.config as ModelConfig['model'],
      params: plan.params.map((p) => ({ name: p.name, shape: p.shape })),
    };
  }
  if (!f.model && !f.hfConfig)
    throw new UserError(
      'export-hf: say what model the checkpoint is of: --plan DIR or --model NAME',
    );
  const cfg = f.hfConfig
    ? loadHfModelConfig(f.hfConfig, f.model, overrides)
    : loadModelConfig(f.model!, overrides);
  const params = buildForwardGraph(cfg).params.map((p) => ({
    name: p.name,
    shape: p.type.shape.map(Number),
  }));
  return { name: cfg.name, model: cfg.model, params };
}

export function addExportHfCommand(program: Command, io: CliIO): void {
  program
    .command('export-hf')
    .description(
      'write an lfc checkpoint as a Hugging Face model directory (config.json, safetensors shards, index)',
    )
    .argument('<out>', 'the directory to write (new, or empty)')
    .argument('[overrides...]', 'with --model: Hydra-style overrides, as at compile')
    .option('--load <dir>', 'the lfc checkpoint: an iter_ directory, or a --save directory')
    .option('--plan <dir>', 'the plan the checkpoint was trained with (names the model)')
    .option(
      '--model <name>',
      'the model, by preset name, LoongForge name or YAML file (instead of --plan)',
    )
    .option(
      '--hf-config <file>',
      'a Hugging Face config.json the model was compiled from (with --model: the preset it went over)',
    )
    .addOption(
      new Option('--dtype <dtype>', 'the tensors on disk')
        .choices(['bf16', 'fp32'])
        .default('bf16'),
    )
    .option(
      '--max-shard-size <size>',
      'largest shard: 5GB, 500MB, 2GiB or bytes (default 5GB, as transformers)',
      byteSize,
    )
    .action((out: string, overrides: string[], f: ExportFlags) => {
      if (!f.load) throw new UserError('export-hf: name the checkpoint with --load DIR');
      const { name, model, params } = modelOf(f, overrides);
      const r = exportHf({
        out,
        checkpoint: f.load,
        modelName: name,
        model,
        params,
        dtype: f.dtype === 'bf16' ? 'BF16' : 'F32',
        maxShardBytes: f.maxShardSize ?? DEFAULT_MAX_SHARD_BYTES,
      });
      if (r.inexact.length)
        io.err(
          `lfc: warning: ${name} is not exactly ${architectureOfModel(model)} (transformers would compute it otherwise): ${r.inexact.slice(0, 3).join('; ')}${r.inexact.length > 3 ? `; and ${r.inexact.length - 3} more` : ''}\n`,
        );
      const shards = r.files.filter((x) => x.endsWith('.safetensors')).length;
      io.out(
        `exported ${name} as ${architectureOfModel(model)}: ${r.tensors} tensors, ${(r.bytes / 2 ** 30).toFixed(2)} GiB ${f.dtype} in ${shards} shard${shards > 1 ? 's' : ''} → ${out}\n`,
      );
    });
}
