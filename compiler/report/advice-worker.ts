// A worker thread of the fits advice (advice.ts): plans the changes it is sent, one at a time,
// and answers each with its remedy (null: a layout the rules refuse) or the error that stopped it.

import { parentPort } from 'node:worker_threads';
import { remedyOf, type AdviceReply, type AdviceRequest } from './advice.js';

const port = parentPort!;
port.on('message', ({ i, alt, device }: AdviceRequest) => {
  let reply: AdviceReply;
  try {
    reply = { i, remedy: remedyOf(alt, device) ?? null };
  } catch (e) {
    reply = { i, error: e instanceof Error ? e.message : String(e) };
  }
  port.postMessage(reply);
});
