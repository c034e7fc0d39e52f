#!/usr/bin/env node
// The lfc binary: sets up what the command needs on first use (npm packages and the TypeScript
// build; for commands that execute plans, the system packages and the native runtime), then
// forwards to the CLI.
import { ensureBuilt, ensureNative } from '../scripts/setup.mjs';

const EXECUTES = new Set(['run', 'demo']);
try {
  await ensureBuilt({ quiet: true });
  if (EXECUTES.has(process.argv[2])) ensureNative({ quiet: true });
} catch (e) {
  process.stderr.write(
    `lfc: setup failed: ${e instanceof Error ? e.message.split('\n')[0] : String(e)}\n`,
  );
  process.exit(1);
}
await import('../dist/compiler/cli/main.js');
