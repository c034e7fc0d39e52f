// The built viz app (viz/app/, built by `vite build` into dist/viz-app), and the one HTML file
// `lfc viz --output` writes from it: its script and stylesheet inlined, the plans' data embedded
// as JSON in <script id="lfc-viz-data">, so the page needs no server and no network.

import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { EnvironmentError } from '../compiler/errors.js';
import { projectRoot } from '../compiler/paths.js';
import type { VizEmbedded } from './model.js';

/** the built app's folder; an EnvironmentError when it is not built */
export function appDir(): string {
  const dir = join(projectRoot(), 'dist', 'viz-app');
  if (!existsSync(join(dir, 'index.html')))
    throw new EnvironmentError(
      `the viz app is not built (${dir}): run node scripts/setup.mjs "lfc viz" (./lfc viz does it on first use)`,
    );
  return dir;
}

/** JSON that cannot end its script element early */
const embed = (x: unknown) => JSON.stringify(x).replace(/</g, '\\u003c');

/** the app as one file, with `data` embedded */
export function selfContainedPage(data: VizEmbedded): string {
  const dir = appDir();
  const html = readFileSync(join(dir, 'index.html'), 'utf8');
  const asset = (href: string) => readFileSync(join(dir, href), 'utf8');
  const title = data.plans.map((p) => p.title).join(' · ');
  return html
    .replace(/<title>[^<]*<\/title>/, `<title>lfc viz: ${title.replace(/</g, '&lt;')}</title>`)
    .replace(
      /<link rel="stylesheet"[^>]*href="\.\/([^"]+)"[^>]*>/g,
      (_, href: string) => `<style>\n${asset(href)}\n</style>`,
    )
    .replace(
      /<script type="module"[^>]*src="\.\/([^"]+)"[^>]*><\/script>/g,
      // a function replacement: the script's own `$` patterns stay as they are
      (_, src: string) =>
        `<script type="application/json" id="lfc-viz-data">${embed(data)}</script>\n<script type="module">\n${asset(src).replace(/<\/script/gi, '<\\/script')}\n</script>`,
    );
}
