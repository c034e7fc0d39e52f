// Entry of the `lfc` binary: forwards to run().

import { run } from './index.js';

// a closed pipe (`lfc … | head`) ends the output quietly
process.stdout.on('error', (e: NodeJS.ErrnoException) => {
  if (e.code === 'EPIPE') process.exit(0);
  throw e;
});

process.exitCode = await run(process.argv.slice(2));
