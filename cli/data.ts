// lfc data stats PATH…: what datasets hold, read as training reads them (runtime/data/stats.ts),
// and the data profile `lfc compile --data-profile` plans memory for (--profile FILE).

import { Option, type Command } from 'commander';
import { writeFileSync } from 'node:fs';
import { basename, dirname, extname, resolve } from 'node:path';
import { makeDirs } from '../compiler/files.js';
import { UserError } from '../compiler/errors.js';
import { imageProcessorOf } from '../compiler/frontend/data-profile.js';
import { loadModelConfig } from '../compiler/frontend/config.js';
import type { CliIO } from './io.js';
import { checkOutputPath, nonNegativeInt, positiveInt } from './options.js';
import { parseDataPath, parseSplit, SPLIT_PARTS, type SplitPart } from '../runtime/data/sampler.js';
import { dataStats, profileYaml, type Summary } from '../runtime/data/stats.js';
import { progressBar } from '../runtime/progress.js';

interface StatsFlags {
  model: string;
  tokenizerModel?: string;
  seqLength?: number;
  maxVisualTokens?: number;
  trainingPhase: 'sft' | 'pretrain';
  split: string;
  part: SplitPart;
  samples?: number;
  seed: number;
  truncate?: boolean;
  profile?: string;
  quiet?: boolean;
}

function line(name: string, s: Summary, unit = ''): string {
  const f = (x: number) => (Number.isInteger(x) ? String(x) : x.toFixed(1));
  return `  ${name.padEnd(24)} mean ${f(s.mean)}${unit}, median ${f(s.p50)}, p90 ${f(s.p90)}, max ${f(s.max)}`;
}

function shares(m: ReadonlyMap<string | number, number>, total: number, top = 8): string {
  const sorted = [...m.entries()].sort((a, b) => b[1] - a[1]);
  const shown = sorted
    .slice(0, top)
    .map(([k, n]) => `${k} ${((100 * n) / Math.max(total, 1)).toFixed(1)}%`);
  return shown.join(', ') + (sorted.length > top ? `, … (${sorted.length} in all)` : '');
}

export function addDataCommand(program: Command, io: CliIO, isTTY: () => boolean): void {
  const data = program.command('data').description('look at training data');
  data
    .command('stats')
    .description(
      'what datasets hold, read as training reads them: samples, images, resolutions, text, visual and loss tokens per packed microbatch; --profile writes a data profile',
    )
    .argument('<datasets...>', 'JSONL files or WebDataset shards, as --data-path takes them')
    .option('--model <name>', 'the model preset whose image processor and sizes apply', 'tiny-vlm')
    .option('--tokenizer-model <path>', 'a tokenizer.json, or a directory holding it')
    .option(
      '--seq-length <n>',
      "tokens of a packed microbatch (default: the preset's seq_length)",
      positiveInt('--seq-length'),
    )
    .option(
      '--max-visual-tokens <n>',
      'visual tokens of a microbatch at most (default: the sequence)',
      positiveInt('--max-visual-tokens'),
    )
    .addOption(
      new Option('--training-phase <phase>', 'which tokens carry loss')
        .choices(['sft', 'pretrain'])
        .default('sft'),
    )
    .option('--split <parts>', 'train,valid,test proportions', '100,0,0')
    .addOption(
      new Option('--part <part>', 'which part of the split').choices(SPLIT_PARTS).default('train'),
    )
    .option('--samples <n>', 'read only the first n of the epoch', positiveInt('--samples'))
    .option('--seed <n>', 'the shuffle seed', nonNegativeInt('--seed'), 1234)
    .option('--truncate', 'cut samples longer than the sequence (as lfc run --truncate)')
    .option('--profile <file>', 'write the data profile (YAML) here')
    .option('--quiet', 'no progress bar')
    .action(async (paths: string[], f: StatsFlags) => {
      if (!f.tokenizerModel)
        throw new UserError(
          'lfc data stats needs --tokenizer-model PATH (the tiny models take configs/tokenizers/tiny)',
        );
      if (f.profile && !/\.ya?ml$/.test(f.profile))
        throw new UserError(`--profile ${f.profile}: want a .yaml path`);
      if (f.profile) checkOutputPath('--profile', f.profile, 'file');
      const model = loadModelConfig(f.model, []);
      const seqLength = f.seqLength ?? model.training.seq_length;
      const sources = parseDataPath(paths).map((s) => ({ ...s, path: resolve(s.path) }));
      const bar = progressBar(100, io.err, isTTY());
      const stats = await dataStats(
        {
          sources,
          split: parseSplit(f.split),
          part: f.part,
          tokenizer: resolve(f.tokenizerModel),
          phase: f.trainingPhase,
          seed: f.seed,
          bounds: { seqLength, maxVisualTokens: f.maxVisualTokens ?? seqLength },
          processor: imageProcessorOf(model.model.image_encoder),
          vocabSize: model.model.text_decoder.vocab_size,
          truncate: f.truncate,
        },
        f.samples,
        (read, of) => f.quiet || bar.update(Math.round((100 * read) / of), `${read}/${of} samples`),
      );
      if (!f.quiet) bar.done();
      const c = stats.counts;
      const images = [...stats.resolutions.values()].reduce((a, b) => a + b, 0);
      const out = [
        `${paths.join(' ')}: ${stats.samples} samples read of ${stats.epochSamples} (${f.part} split), ${model.name}'s processor, ${f.trainingPhase}`,
        `  bad ${c.bad}, dropped ${c.dropped} (too long for a microbatch), truncated ${c.truncated}, images shrunk to the visual bound ${c.shrunk}`,
        ...c.examples.map((e) => `    ${e}`),
        `  images per sample        ${shares(stats.imagesPerSample, stats.samples)}`,
        `  image sizes (${images})    ${shares(stats.resolutions, images)}`,
        'per sample:',
        line('text tokens', stats.perSample.text),
        line('visual tokens', stats.perSample.visual),
        line('loss tokens', stats.perSample.loss),
        `per packed microbatch (${stats.perMicrobatch.count} of ${stats.seqLength} tokens, at most ${stats.maxVisualTokens} visual):`,
        line('samples', stats.perMicrobatch.samples),
        line('text tokens', stats.perMicrobatch.text),
        line('visual tokens', stats.perMicrobatch.visual),
        line('loss tokens', stats.perMicrobatch.loss),
        line('padding', stats.perMicrobatch.padding),
      ];
      if (f.profile) {
        const path = resolve(f.profile);
        const name = basename(path, extname(path));
        makeDirs(dirname(path));
        writeFileSync(path, profileYaml(stats, name, paths));
        out.push(`data profile: ${path} (lfc compile --data-profile ${f.profile})`);
      }
      io.out(out.join('\n') + '\n');
    });
}
