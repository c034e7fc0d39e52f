// lfc demo: the embedded default on the tiny VLM. Until the runtime lands it builds, verifies
// and inspects the model; the training run takes its place as soon as `lfc run` exists.

import type { Command } from 'commander';
import { buildForwardGraph } from '../frontend/build.js';
import { loadModelConfig } from '../frontend/config.js';
import { formatInspect, inspectModel } from '../inspect.js';
import { assertValid } from '../../ir/verify.js';
import type { CliIO } from './index.js';
import { defaultImageSize } from './inspect.js';

export function addDemoCommand(program: Command, io: CliIO): void {
  program
    .command('demo')
    .description('the embedded default: the tiny VLM, built, verified and inspected')
    .argument('[overrides...]', 'Hydra-style overrides of the tiny-vlm preset')
    .option('--model <name>', 'tiny-vlm or tiny-vlm-moe', 'tiny-vlm')
    .action((overrides: string[], opts: { model: string }) => {
      const cfg = loadModelConfig(opts.model, overrides);
      const graph = buildForwardGraph(cfg);
      assertValid(graph, 'model builder');
      const [h, w] = defaultImageSize(cfg);
      io.out(
        `built ${cfg.name}: ${graph.nodes.length} nodes, ${graph.params.length} parameter tensors, verified\n\n`,
      );
      io.out(
        formatInspect(
          inspectModel(graph, cfg, {
            seqLength: cfg.training.seq_length,
            imageHeight: h,
            imageWidth: w,
          }),
        ),
      );
    });
}
