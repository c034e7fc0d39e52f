// Emission pass 4, p2p: the pipeline's sends and receives, batched between schedule steps.
//
// Holds before: a p2p mark before each step (plain 1F1B: before each pass) and after the last
//   (lowering), each with the sends of the step (pass) before and the recvs of its own (their
//   buffers already read by its passes).
// Holds after: at each mark whose lists are not empty, one batch on the comm stream: the sends,
//   then the recvs, posted together (Megatron's batched send/recv, so neighbours never wait on
//   each other's order), numbered in their `batch` attribute. The batch's first instruction waits
//   for the last instruction issued before it off the comm stream (the data it sends is made), and
//   the first instruction after it off the comm stream waits for its last (the data it receives
//   has come), or the optimizer step does when nothing follows. No p2p marks remain.

import { instructionWith, type PlanInstruction } from '../plan/format.js';
import { insertAtMarks, lastNonComm, nextNonComm, scheduled, type ProgramDraft } from './draft.js';

export function batchTransfers(d: ProgramDraft): ProgramDraft {
  let events = d.events;
  let batches = 0;
  const instructions = [...d.instructions];
  const inserts = new Map<number, PlanInstruction[]>();
  /** by mark: the event its batch's last instruction records */
  const done = new Map<number, number>();
  d.marks.forEach((m, k) => {
    if (m.kind !== 'p2p' || (!m.sends.length && !m.recvs.length)) return;
    const batch = batches++;
    const before = lastNonComm(instructions, m.pos);
    const wait: number[] = [];
    if (before >= 0) {
      const e = events++;
      wait.push(e);
      const x = instructions[before];
      instructions[before] = instructionWith(x, { record: [...x.record, e] });
    }
    const list = [...m.sends, ...m.recvs].map((x, i) =>
      scheduled({ ...x, attrs: { ...x.attrs, batch } }, i === 0 ? wait : []),
    );
    const e = events++;
    const last = list[list.length - 1];
    list[list.length - 1] = instructionWith(last, { record: [...last.record, e] });
    inserts.set(k, list);
    done.set(k, e);
  });
  const r = insertAtMarks(instructions, d.marks, inserts);
  let openWaits = d.openWaits;
  for (const [k, e] of done) {
    const after = r.marks[k].pos + inserts.get(k)!.length;
    const i = nextNonComm(r.instructions, after);
    if (i < 0) openWaits = [...openWaits, e];
    else
      r.instructions[i] = instructionWith(r.instructions[i], {
        wait: [...r.instructions[i].wait, e],
      });
  }
  return {
    ...d,
    instructions: r.instructions,
    events,
    marks: r.marks.filter((m) => m.kind !== 'p2p'),
    openWaits,
  };
}
