// `npm test`'s pretest step: everything the tests need, installed on first use.
import { ensureBuilt } from './setup.mjs';

await ensureBuilt();
