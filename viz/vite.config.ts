// The viz app's build (`lfc viz` serves it; `lfc viz --output` inlines it into one HTML file):
// viz/app/ → dist/viz-app/, one script and one stylesheet with relative paths, the graph view's
// layout worker inlined (a blob), so the page also runs from file://.

import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

const here = (p: string) => fileURLToPath(new URL(p, import.meta.url));

export default defineConfig({
  root: here('./app'),
  base: './',
  logLevel: 'warn',
  build: {
    outDir: here('../dist/viz-app'),
    emptyOutDir: true,
    target: 'es2022',
    cssCodeSplit: false,
    modulePreload: false,
    reportCompressedSize: false,
    chunkSizeWarningLimit: 2048,
    rolldownOptions: { output: { codeSplitting: false } },
  },
  // a classic worker: Chromium starts one from a blob on a file:// page (a module worker it refuses)
  worker: { format: 'iife' },
});
