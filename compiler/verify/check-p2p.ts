// Rule p2p-match: every send(peer, tag) on rank r has exactly one recv(peer = r, tag) on rank peer,
// receiving the dtype and shape that is sent, and every recv has exactly one such send. A peer is
// a global rank, or with a `group` attribute the index of a member of the rank's group of that kind.

import { NONE, problemAt, type PlanIndex, type ProgramIndex } from './plan-index.js';
import type { PlanProblem } from './problem.js';

const RULE = 'p2p-match';

export function checkP2p(ix: PlanIndex): PlanProblem[] {
  const out: PlanProblem[] = [];
  for (const p of ix.programs) {
    for (let o = 0; o < p.p2pInstr.length; o++) {
      const i = p.p2pInstr[o];
      const { attrs } = p.file.instructions[i];
      const bad = p.ranks.filter((r) => {
        const peer = ix.peerOf(r, p, o);
        return peer < 0 || peer >= ix.world;
      });
      if (bad.length) {
        const what = attrs.group === undefined ? '' : ` of group ${String(attrs.group)}`;
        out.push(problemAt(RULE, bad, p, i, `peer ${String(attrs.peer)}${what} is not a rank`));
      }
      if (p.p2pTag[o] === NONE)
        out.push(
          problemAt(RULE, p.ranks, p, i, `tag ${String(attrs.tag)} is not a 32-bit integer`),
        );
    }
  }
  const { pairs } = ix;
  const duplicate = new Uint8Array(pairs.count);
  for (const q of pairs.next.values()) duplicate[q] = 1;
  const at = (rank: number): ProgramIndex => ix.programs[ix.programOf[rank]];
  for (let q = 0; q < pairs.count; q++) {
    const [src, dst, tag] = [pairs.src[q], pairs.dst[q], pairs.tag[q]];
    const send = pairs.sendInstr[q];
    const recv = pairs.recvInstr[q];
    if (duplicate[q]) {
      const [rank, i, what] = send >= 0 ? [src, send, 'send'] : [dst, recv, 'recv'];
      const msg = `more than one ${what} from rank ${src} to rank ${dst} with tag ${tag}`;
      out.push(problemAt(RULE, [rank], at(rank), i, msg));
    } else if (send < 0) {
      const msg = `receives from rank ${src} with tag ${tag}, but rank ${src} sends nothing to rank ${dst} with that tag`;
      out.push(problemAt(RULE, [dst], at(dst), recv, msg));
    } else if (recv < 0) {
      const msg = `sends to rank ${dst} with tag ${tag}, but rank ${dst} receives nothing from rank ${src} with that tag`;
      out.push(problemAt(RULE, [src], at(src), send, msg));
    } else {
      const payload = (rank: number, i: number) => at(rank).p2pPayload[at(rank).slot[i]];
      const [sent, got] = [payload(src, send), payload(dst, recv)];
      if (sent === got) continue;
      const text = (id: number) => (id >= 0 ? ix.payloadText[id] : 'an unreadable type');
      const msg = `receives ${text(got)} from rank ${src} (tag ${tag}), which sends ${text(sent)}`;
      out.push(problemAt(RULE, [dst], at(dst), recv, msg));
    }
  }
  return out;
}
