// Entry of a rank process of a launched run: launch.ts spawns it on each rank's node as
//   node rank-main.js OPTIONS_JSON
// with the rank's place in the job in its environment (RANK, WORLD_SIZE, LFC_STORE, …:
// launch-rank.ts). It trains as that rank and reports each step to its launcher over IPC
// (rank.ts). An error ends it as it ends `lfc`: one line on stderr, exit code 2 for the user's
// input, 1 for the machine's, the stack and 1 for anything else; the launcher quotes that line.

import { reportError, UserError } from '../compiler/errors.js';
import { rankFromEnv } from './launch-rank.js';
import { runRank, type RankIO } from './rank.js';
import type { TrainOptions } from './train.js';

const io: RankIO = {
  out: (t) => process.stdout.write(t),
  err: (t) => process.stderr.write(t),
};

// a closed pipe ends the output quietly
process.stdout.on('error', (e: NodeJS.ErrnoException) => {
  if (e.code === 'EPIPE') process.exit(0);
  throw e;
});

async function main(argv: readonly string[]): Promise<void> {
  if (argv.length !== 1)
    throw new Error(
      `usage: rank-main OPTIONS_JSON (launch.ts starts it), got ${argv.length} arguments`,
    );
  // launch.ts: RankTrainOptions and the plan directory
  const opts = JSON.parse(argv[0]) as TrainOptions;
  const rank = await rankFromEnv();
  if (!rank?.launched)
    throw new UserError(
      "a rank process is started by lfc's launcher (lfc run --nproc-per-node N); a rank started by a cluster manager runs `lfc run DIR`",
    );
  // quiet: a launched rank shows no progress (its launcher merges the steps)
  await runRank(opts, rank, io, true, process.stderr.isTTY === true);
}

try {
  await main(process.argv.slice(2));
  process.exitCode = 0;
} catch (e) {
  process.exitCode = reportError(e, io.err);
}
