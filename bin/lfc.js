#!/usr/bin/env -S node --initial-old-space-size=1024
// The lfc binary: sets up what the command needs on first use (scripts/setup.mjs: npm packages
// and the TypeScript build; for the commands that execute plans, the Debian packages and the
// native runtime), then forwards to the CLI. A failed setup prints one line and exits 1.
//
// Node's flags are on the first line (`./lfc` and the benches read them there). A large compile
// holds hundreds of MB of instructions and buffers; V8 starts its old generation small and
// collects it whole each time it grows (three full collections on the article's level-3 line),
// so it starts at 1 GiB here: 30b-level3's compile + simulate went from 2.71 s to 2.46 s (medians
// of 5, alternated, bench/compile's layout run in-process). The old generation still grows past
// it, and shrinks back after a collection, as before. Rank processes are started with flags of
// their own (runtime/launch.ts).
import { setupCommandOf, setupOrExit } from '../scripts/setup.mjs';

setupOrExit(setupCommandOf(process.argv.slice(2)));
await import('../dist/cli/main.js');
