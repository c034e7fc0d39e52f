// Programs' JSON texts, byte for byte JSON.stringify's, made faster where programs share objects.
//
// The article's level-3 line writes 8 programs of 19 MB each (155 MB), and JSON.stringify took
// about 1 s of that. Five of the 8 are their stage's template relabeled (compiler/emit/
// alike-programs.ts): they hold the template's very instruction and buffer objects but for the
// encoder's moved slots. So the buffer and instruction lists are stringified in chunks of CHUNK
// elements; a program noted as relabeled from a template that is written in the same call takes
// the template's text for every chunk whose elements are all the template's objects at the same
// places, and stringifies only the others. JSON.stringify of an array is its elements' texts
// joined by commas inside brackets, so the chunks' texts joined the same way are the same bytes
// (test/plan/program-json.test.ts holds every program of level-3 layouts to JSON.stringify's).
// Only the templates' chunk texts are kept, and only while their relabels are written. A text
// comes as pieces, written one after another (writePlan): joining 19 MB of chunks into one string
// would copy it twice more.

import type { ProgramFile } from './format.js';

/** elements a chunk: small enough that a relabel dirties few, large enough for stringify's speed */
const CHUNK = 256;

interface Chunks {
  readonly buffers: readonly string[];
  readonly instructions: readonly string[];
}

const templates = new WeakMap<ProgramFile, ProgramFile>();

/** Notes that `p` is `template` with some objects replaced (its JSON may reuse the template's). */
export function noteRelabeled(p: ProgramFile, template: ProgramFile): void {
  templates.set(p, template);
}

/**
 * Each program with its JSON text as pieces that, concatenated, are JSON.stringify's bytes, in
 * order (see the header).
 */
export function* programJsons(
  programs: readonly ProgramFile[],
): Generator<[ProgramFile, string[]], void, undefined> {
  const given = new Set(programs);
  const likeOf = (p: ProgramFile) => {
    const t = templates.get(p);
    return t && given.has(t) ? t : undefined;
  };
  // the templates' chunks, until their last relabel is written
  const kept = new Map<ProgramFile, Chunks>();
  const lastUse = new Map<ProgramFile, number>();
  programs.forEach((p, k) => {
    const t = likeOf(p);
    if (t) lastUse.set(t, k);
  });
  for (let k = 0; k < programs.length; k++) {
    const p = programs[k];
    const t = likeOf(p);
    let like = t && kept.get(t);
    if (t && !like) kept.set(t, (like = chunksOf(t)));
    const own: Chunks = {
      buffers: chunkTexts(p.buffers, t?.buffers, like?.buffers),
      instructions: chunkTexts(p.instructions, t?.instructions, like?.instructions),
    };
    if ((lastUse.get(p) ?? -1) > k) kept.set(p, own);
    for (const [q, last] of lastUse) if (last <= k) kept.delete(q);
    yield [p, joined(p, own)];
  }
}

/** JSON.stringify(p)'s bytes, as pieces, from its lists' chunk texts */
function joined(p: ProgramFile, own: Chunks): string[] {
  // the other fields as JSON.stringify writes them, in the program's key order, with the two
  // lists put where their placeholders stand
  const head = JSON.stringify({ ...p, buffers: BUFFERS, instructions: INSTRUCTIONS });
  const at = (mark: string) => {
    const k = head.indexOf(JSON.stringify(mark));
    if (k < 0) throw new Error(`programJsons: no placeholder for ${mark} in program ${p.id}`);
    return { from: k, to: k + JSON.stringify(mark).length };
  };
  const lists = [
    { ...at(BUFFERS), chunks: own.buffers },
    { ...at(INSTRUCTIONS), chunks: own.instructions },
  ].sort((a, b) => a.from - b.from);
  const pieces: string[] = [];
  let done = 0;
  for (const { from, to, chunks } of lists) {
    pieces.push(head.slice(done, from), '[');
    chunks.forEach((c, k) => pieces.push(k ? ',' : '', c));
    pieces.push(']');
    done = to;
  }
  pieces.push(head.slice(done));
  return pieces;
}

// placeholders no field of a program holds (names never carry NUL)
const BUFFERS = '\u0000lfc-buffers\u0000';
const INSTRUCTIONS = '\u0000lfc-instructions\u0000';

const chunksOf = (p: ProgramFile): Chunks => ({
  buffers: chunkTexts(p.buffers),
  instructions: chunkTexts(p.instructions),
});

/**
 * Each chunk's elements' JSON texts joined by commas; a chunk whose elements are all `like`'s
 * objects at the same places takes `likeTexts`' text of it.
 */
function chunkTexts<T>(
  xs: readonly T[],
  like?: readonly T[],
  likeTexts?: readonly string[],
): string[] {
  const out: string[] = [];
  const comparable = like !== undefined && likeTexts !== undefined && like.length === xs.length;
  for (let c = 0, k = 0; k < xs.length; c++, k += CHUNK) {
    const end = Math.min(xs.length, k + CHUNK);
    let shared = comparable;
    for (let j = k; shared && j < end; j++) shared = xs[j] === like![j];
    out.push(shared ? likeTexts![c] : JSON.stringify(xs.slice(k, end)).slice(1, -1));
  }
  return out;
}
