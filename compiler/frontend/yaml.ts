// The YAML library, loaded on first use: a rank process (runtime/rank-main.ts) reaches the config
// and data-profile modules for a few helpers that never parse YAML, and loading the library cost
// each rank ~170 ms of CPU at start (measured with --cpu-prof on a 4-rank tiny-vlm-moe run).
import { createRequire } from 'node:module';

type Yaml = typeof import('yaml');
let loaded: Yaml | undefined;

/** the yaml package (its CommonJS build, required synchronously the first time) */
export function yaml(): Yaml {
  return (loaded ??= createRequire(import.meta.url)('yaml') as Yaml);
}
