// The CLI as a library call: run(argv) → exit code. The `lfc` binary only forwards to it, and
// tests call it in-process. User errors print one line and return 2; environment errors (the
// machine's: a runtime not built, a full disk) one line and 1; internal errors the stack and 1.

import { Command, CommanderError } from 'commander';
import { reportError } from '../compiler/errors.js';
import { addInspectCommand } from './inspect.js';
import { addDemoCommand } from './demo.js';
import { addCompileCommand } from './compile.js';
import { addRunCommand } from './run.js';
import { addCalibrateCommand } from './calibrate.js';
import { addVizCommand } from './viz.js';
import { addExportHfCommand } from './export-hf.js';
import { addDataCommand } from './data.js';
import { addTuneCommand } from './tune.js';
import { addCompareCommand } from './compare.js';
import { processIO, type CliIO } from './io.js';

export { processIO, type CliIO } from './io.js';

export function makeProgram(io: CliIO, isTTY: () => boolean = () => false): Command {
  const program = new Command('lfc')
    .description('lfc: a dataflow-graph compiler for multimodal training steps')
    .version('0.1.0')
    .exitOverride()
    .showSuggestionAfterError(true)
    .configureOutput({
      writeOut: io.out,
      writeErr: io.err,
      // commander's own usage errors: one line, our prefix
      outputError: (text, write) => write(`lfc: ${text.replace(/\n(?=.)/g, ' ').trim()}\n`),
    });
  addInspectCommand(program, io);
  addCompileCommand(program, io, isTTY);
  addRunCommand(program, io, isTTY);
  addDemoCommand(program, io, isTTY);
  addTuneCommand(program, io, isTTY);
  addCompareCommand(program, io);
  addCalibrateCommand(program, io);
  addVizCommand(program, io);
  addExportHfCommand(program, io);
  addDataCommand(program, io, isTTY);
  const override = (c: Command): void =>
    c.commands.forEach((cmd) => {
      cmd.exitOverride().configureOutput(program.configureOutput());
      override(cmd);
    });
  override(program);
  return program;
}

export async function run(argv: readonly string[], io: CliIO = processIO): Promise<number> {
  const program = makeProgram(io, () => io === processIO && process.stderr.isTTY === true);
  if (argv.length === 0) {
    io.out(program.helpInformation());
    return 0;
  }
  try {
    await program.parseAsync([...argv], { from: 'user' });
    return 0;
  } catch (e) {
    if (e instanceof CommanderError) {
      if (
        e.code === 'commander.helpDisplayed' ||
        e.code === 'commander.version' ||
        e.code === 'commander.help'
      )
        return 0;
      return 2; // commander already printed the one-line message
    }
    return reportError(e, io.err);
  }
}
