// `npm test`'s pretest step: everything the tests need, installed on first use (setup.mjs,
// COMMANDS['npm test']), before any test worker starts.
import { setupOrExit } from './setup.mjs';

setupOrExit('npm test');
