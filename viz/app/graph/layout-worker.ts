// The graph view's layout worker: dagre on the folded graph, off the main thread, so the page
// stays responsive while a few hundred nodes are placed. One request in, one reply out.

import { layoutGraph, type LayoutFailure, type LayoutReply, type LayoutRequest } from './layout.js';

self.onmessage = (e: MessageEvent<LayoutRequest>) => {
  let reply: LayoutReply | LayoutFailure;
  try {
    reply = layoutGraph(e.data);
  } catch (err) {
    reply = { id: e.data.id, error: err instanceof Error ? err.message : String(err) };
  }
  self.postMessage(reply);
};
