// lfc viz DIR [DIR…]: the plans in the browser — the graph of each program, the step's timeline
// per rank, memory over the step, and the plans compared. It serves the app (viz/app, built into
// dist/viz-app) on a local port and prints its URL; --output FILE writes one self-contained HTML
// file instead, for sharing.

import { spawn } from 'node:child_process';
import type { Command } from 'commander';
import { resolve } from 'node:path';
import { UserError } from '../compiler/errors.js';
import { writeFileAtomic } from '../runtime/safetensors.js';
import { embedAll, openPlans } from '../viz/bundle/index.js';
import { selfContainedPage } from '../viz/page.js';
import { serve } from '../viz/server.js';
import type { CliIO } from './io.js';
import { checkOutputPath } from './options.js';

/** the port `lfc viz` tries first; another free one when it is taken and --port is not given */
const DEFAULT_PORT = 5310;

interface VizFlags {
  output?: string;
  port?: string;
  open?: boolean;
  trace?: string;
  hardware?: string;
  attentionKernel?: string;
}

export function addVizCommand(program: Command, io: CliIO): void {
  program
    .command('viz')
    .description(
      'the plans in the browser: graph, timeline, memory, and the plans compared (serves a local app)',
    )
    .argument('<dir...>', 'plan directories written by lfc compile (up to 4 to compare)')
    .option('-o, --output <file>', 'write one self-contained HTML file instead of serving')
    .option('--port <n>', `the local port to serve on (default ${DEFAULT_PORT}, 0: any free one)`)
    .option('--open', 'open the app in the default browser (xdg-open)')
    .option(
      '--trace <file>',
      'draw this measured timeline (lfc run --trace) instead of the simulated one',
    )
    .option(
      '--hardware <name|file>',
      "the profile the timeline is simulated on (default: the plan's, else h800)",
    )
    .option(
      '--attention-kernel <name>',
      "the attention kernel the timeline is priced with (default: the profile's)",
    )
    .action(async (dirs: string[], f: VizFlags) => {
      if (dirs.length > 4)
        throw new UserError(`lfc viz: ${dirs.length} plans; it compares at most 4`);
      if (f.trace && dirs.length > 1)
        throw new UserError("--trace: a trace is one plan's; give one plan directory with it");
      if (f.output && (f.port !== undefined || f.open))
        throw new UserError('--output writes a file; --port and --open are for serving');
      if (f.output) checkOutputPath('-o', f.output, 'file');
      const port = f.port === undefined ? undefined : Number(f.port);
      if (port !== undefined && !(Number.isInteger(port) && port >= 0 && port < 65536))
        throw new UserError(`--port ${f.port}: not a port number (0–65535)`);
      const bundles = openPlans(dirs, {
        trace: f.trace,
        hardware: f.hardware,
        attentionKernel: f.attentionKernel,
      });
      const summary = bundles.map((b) => `${b.summary().title} (${b.dir})`).join(', ');
      if (f.output) {
        const data = embedAll(bundles);
        writeFileAtomic(f.output, selfContainedPage(data));
        io.out(`${summary}\nopen file://${resolve(f.output)}\n`);
        return;
      }
      const server = await serve(bundles, port ?? DEFAULT_PORT).catch((e: unknown) =>
        port === undefined && e instanceof UserError ? serve(bundles, 0) : Promise.reject(e),
      );
      io.out(`${summary}\nlfc viz: serving on ${server.url} (Ctrl-C stops it)\n`);
      if (f.open) openBrowser(server.url, io);
      await new Promise<void>((done) => {
        const stop = () => {
          process.off('SIGINT', stop);
          process.off('SIGTERM', stop);
          server.close().then(done, done);
        };
        process.on('SIGINT', stop);
        process.on('SIGTERM', stop);
      });
    });
}

function openBrowser(url: string, io: CliIO): void {
  const child = spawn('xdg-open', [url], { stdio: 'ignore', detached: true });
  child.on('error', () => io.err(`lfc viz: could not start xdg-open; open ${url} yourself\n`));
  child.unref();
}
