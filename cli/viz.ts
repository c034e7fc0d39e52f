// lfc viz DIR: the plan in the browser — one self-contained HTML file (viz/page.ts) with the rank
// grid, pipeline stages, memory per program, the step's timeline and the programs by module.

import type { Command } from 'commander';
import { join, resolve } from 'node:path';
import { writeFileAtomic } from '../runtime/safetensors.js';
import { vizData } from '../viz/data.js';
import { renderPage } from '../viz/page.js';
import type { CliIO } from './index.js';

export function addVizCommand(program: Command, io: CliIO): void {
  program
    .command('viz')
    .description(
      'the plan in the browser: ranks, stages, memory, the step timeline, programs by module',
    )
    .argument('<dir>', 'plan directory written by lfc compile')
    .option('-o, --output <file>', 'the HTML file to write (default: DIR/viz.html)')
    .option(
      '--trace <file>',
      'draw this measured timeline (lfc run --trace) instead of the simulated one',
    )
    .option('--hardware <name|file>', 'the profile the timeline is simulated on (default h800)')
    .option(
      '--attention-kernel <name>',
      "the attention kernel the timeline is priced with (default: the profile's)",
    )
    .action(
      (
        dir: string,
        f: { output?: string; trace?: string; hardware?: string; attentionKernel?: string },
      ) => {
        const data = vizData(dir, {
          trace: f.trace,
          hardware: f.hardware,
          attentionKernel: f.attentionKernel,
        });
        const out = f.output ?? join(dir, 'viz.html');
        writeFileAtomic(out, renderPage(data));
        io.out(
          `${data.title}: ${data.timeline.events.length} instructions on ${data.timeline.lanes.length} lanes, ${data.timeline.source}\nopen file://${resolve(out)}\n`,
        );
      },
    );
}
