// A worker thread of lfc tune's pool (tune-pool.ts): estimates and prices the layouts it is sent
// on a LocalPricer of its own, one request at a time, and answers each with its outcomes.

import { parentPort, workerData } from 'node:worker_threads';
import { LocalPricer } from '../compiler/tune/search.js';
import { pricingRequestOf, type PoolReply, type PoolRequest, type TuneSpec } from './tune-pool.js';

const { spec } = workerData as { spec: TuneSpec };
const pricer = new LocalPricer(pricingRequestOf(spec));
const port = parentPort!;

port.on('message', (q: PoolRequest) => {
  let reply: PoolReply;
  try {
    reply =
      q.kind === 'estimate'
        ? {
            id: q.id,
            kind: 'estimate',
            outcomes: q.layouts.map((l) => pricer.estimateOne(l)),
            graphs: pricer.graphs,
          }
        : {
            id: q.id,
            kind: 'price',
            outcome: pricer.priceOne(q.layout, q.estimate, q.mode),
            graphs: pricer.graphs,
          };
  } catch (e) {
    reply = { id: q.id, kind: 'failed', message: e instanceof Error ? e.message : String(e) };
  }
  port.postMessage(reply);
});
