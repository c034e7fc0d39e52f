// Where a command writes: the process's stdout and stderr, or a test's buffers (cli/index.ts run).

export interface CliIO {
  out: (text: string) => void;
  err: (text: string) => void;
}

export const processIO: CliIO = {
  out: (t) => process.stdout.write(t),
  err: (t) => process.stderr.write(t),
};
