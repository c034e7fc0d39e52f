// The local server of `lfc viz DIR…`: the built app (dist/viz-app) and the JSON API its views
// read (app/source.ts), answered from the plans' bundles as the views ask:
//   GET /api/plans                        every plan's summary
//   GET /api/plans/:i/graph/:program      a program's folded graph
//   GET /api/plans/:i/timeline/:rank      a rank's timeline
//   GET /api/plans/:i/memory/:program     a program's memory over the step
// It listens on 127.0.0.1 only. A bad request is a 404 with its reason as text.

import { existsSync, readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { extname, join, normalize, sep } from 'node:path';
import { UserError } from '../compiler/errors.js';
import type { PlanBundle } from './bundle/index.js';
import { appDir } from './page.js';

const TYPES: Readonly<Record<string, string>> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.svg': 'image/svg+xml',
};

/** answers one API path from the bundles; undefined when the path is not the API's */
export function answerApi(bundles: readonly PlanBundle[], path: string): unknown {
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  if (parts[0] !== 'api' || parts[1] !== 'plans') return undefined;
  if (parts.length === 2) return bundles.map((b) => b.summary());
  const i = Number(parts[2]);
  const b = bundles[i];
  if (!Number.isInteger(i) || !b)
    throw new UserError(`plan ${parts[2]}: there are plans 0–${bundles.length - 1}`);
  const [what, key] = [parts[3], parts[4]];
  if (parts.length === 5 && what === 'graph') return b.graph(key);
  if (parts.length === 5 && what === 'memory') return b.memoryOnTimeline(key);
  if (parts.length === 5 && what === 'timeline') {
    const rank = Number(key);
    if (!Number.isInteger(rank)) throw new UserError(`rank ${key}: not a rank number`);
    return b.timeline(rank);
  }
  throw new UserError(`${path}: not an API path`);
}

export interface VizServer {
  readonly server: Server;
  readonly url: string;
  close(): Promise<void>;
}

/** serves the app and the API on 127.0.0.1:port (0: any free port) */
export function serve(bundles: readonly PlanBundle[], port: number): Promise<VizServer> {
  const root = appDir();
  const server = createServer((req, res) => {
    const path = new URL(req.url ?? '/', 'http://localhost').pathname;
    const send = (status: number, type: string, body: string | Buffer) => {
      res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
      res.end(body);
    };
    if (path.startsWith('/api/')) {
      try {
        send(200, TYPES['.json'], JSON.stringify(answerApi(bundles, path)));
      } catch (e) {
        if (!(e instanceof UserError)) throw e;
        send(404, 'text/plain; charset=utf-8', e.message);
      }
      return;
    }
    const file = normalize(join(root, path === '/' ? 'index.html' : path));
    // the app's own files only: not a sibling folder that shares its name's start
    if (!file.startsWith(root + sep) || !existsSync(file)) {
      send(404, 'text/plain; charset=utf-8', `${path}: not found`);
      return;
    }
    send(200, TYPES[extname(file)] ?? 'application/octet-stream', readFileSync(file));
  });
  return new Promise((resolve, reject) => {
    server.once('error', (e: NodeJS.ErrnoException) =>
      reject(
        e.code === 'EADDRINUSE'
          ? new UserError(`--port ${port}: in use (choose another, or --port 0 for any free one)`)
          : e,
      ),
    );
    server.listen(port, '127.0.0.1', () => {
      const { port: bound } = server.address() as AddressInfo;
      resolve({
        server,
        url: `http://127.0.0.1:${bound}/`,
        close: () => new Promise((done) => server.close(() => done())),
      });
    });
  });
}
