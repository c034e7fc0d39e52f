#!/usr/bin/env node
// The lfc binary: builds on first use (or when sources changed), then forwards to the CLI.
import { ensureBuilt, ensureNative } from '../scripts/setup.mjs';

await ensureBuilt({ quiet: true });
ensureNative({ quiet: true });
await import('../dist/compiler/cli/main.js');
