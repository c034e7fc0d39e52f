// `npm test`'s pretest step: everything the tests need, installed on first use.
import { ensureBuilt, ensureKernelCheck } from './setup.mjs';

await ensureBuilt();
ensureKernelCheck({ quiet: true });
