// `npm test`'s pretest step: everything the tests need, installed on first use.
import { ensureBuilt, ensureKernelCheck, ensureNative } from './setup.mjs';

await ensureBuilt();
ensureNative({ quiet: true });
ensureKernelCheck({ quiet: true });
