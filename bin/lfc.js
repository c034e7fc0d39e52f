#!/usr/bin/env node
// The lfc binary: sets up what the command needs on first use (scripts/setup.mjs: npm packages
// and the TypeScript build; for the commands that execute plans, the Debian packages and the
// native runtime), then forwards to the CLI. A failed setup prints one line and exits 1.
import { setupCommandOf, setupOrExit } from '../scripts/setup.mjs';

setupOrExit(setupCommandOf(process.argv.slice(2)));
await import('../dist/cli/main.js');
