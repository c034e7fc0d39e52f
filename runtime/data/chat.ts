// A conversation as the model trains on it: the chat template's text, tokenized, each image's
// placeholder expanded to that image's visual tokens, and two masks over the tokens: which ones
// the loss predicts, and which ones are an assistant's reply (the 'caption' metric).
//
//   1. markers   each `<image>` of a message becomes the tokenizer's placeholder text
//                (`<|vision_start|><|image_pad|><|vision_end|>` for Qwen, `<image>` for LLaVA)
//   2. pieces    the rendered text cut where the masks change, each piece of one kind: prompt
//                (the template's headers, system and user turns), answer (what the model writes
//                after the generation prompt besides the reply: the end-of-turn token), reply
//   3. tokens    each piece tokenized on its own; the concatenation must equal the whole text's
//                tokens, else the sample is refused
//   4. expand    image i's placeholder id repeated visualTokens[i] times
//
// Loss targets (target[i] = 1: the loss predicts token i from the tokens before it; token 0 has
// none before it and is never one):
//   sft       each assistant turn's reply and the end-of-turn text that closes it, `<|im_end|>` in
//             ChatML; not the role header (`<|im_start|>assistant\n`: the generation prompt, which
//             inference writes, not the model), nothing of system and user turns, nothing of an
//             assistant turn whose content is empty. The whitespace after the end-of-turn token
//             (ChatML's '\n') is not a target: generation stops at `<|im_end|>` (the eos), so the
//             model never writes it, and it is the template's glue before the next header, as the
//             header itself is. (LLaMA-Factory's ChatML templates train that '\n'; the assistant
//             masks of HF's `{% generation %}` templates, TRL's assistant-only loss, stop at
//             `<|im_end|>` as here. Either way it is one token a turn, always the same.) What a
//             template writes between the generation prompt and the content (a Qwen3-style empty
//             `<think></think>`) is a target too: the model writes it. A template with no
//             generation prompt leaves the role header after the prompt, so it becomes a target.
//   pretrain  every token but the image placeholders.
// Image placeholders are never targets nor reply tokens.
//
// Where each assistant turn lies: the template is rendered for messages[:k] with the generation
// prompt (the prompt of turn k), for messages[:k+1] (turn k closed), and for the whole
// conversation; the whole must begin with the prompt, the content follows it, and what follows
// the content in both renders (their common start) is the turn's close. Templates whose text
// for a turn depends on what comes after it fail those checks and the sample is refused (a
// DataError), never silently mis-masked.
//
// Why tokenizing piece by piece equals tokenizing the whole (step 3) for ChatML-like templates:
// a tokenizer first cuts the text at its added tokens (`<|im_start|>`, `<|im_end|>`, …) and
// tokenizes the runs between them on their own, so a cut next to an added token changes nothing.
// The remaining cuts are where a reply begins, right after the header's '\n'; a pre-tokenizer
// never joins a newline to the letters after it (Qwen's regex takes newline runs alone, and lets
// a word take one leading character other than a newline; WordLevel's Whitespace drops spaces
// and newlines), and BPE merges stay inside a pre-token. A reply that starts with a newline (which
// joins the header's), or a template whose close is not an added token, can break this; other
// tokenizers (SentencePiece's Metaspace) have rules of their own: step 3 checks every sample
// rather than assume it (the test checks the fixtures on purpose-made hard replies).
//
// Without a chat template (pretrain only; sft needs the turns a template marks): the contents
// joined with '\n' between them, after the bos token and before the eos token when the tokenizer
// has them, roles unwritten. Each separating '\n' goes with the text before it (a newline joins
// punctuation before it, `.\n`, but never a word after it), so after an assistant content it
// counts as a reply token.

import { Template } from '@huggingface/jinja';
import { UserError } from '../../compiler/errors.js';
import { DataError, IMAGE_MARKER, type Message } from './sample.js';
import { writesContentsAsGiven } from './template-contents.js';
import { SPECIAL_TOKEN_NAMES, type TextTokenizer } from './tokenizer.js';

export interface EncodedText {
  /** (T) the sample's ids, image i's placeholder id repeated visualTokens[i] times */
  tokens: Int32Array;
  /** (T) 1 where the loss predicts the token from the tokens before it */
  target: Uint8Array;
  /** (T) 1 on the tokens of an assistant message's content (not the template's around it) */
  reply: Uint8Array;
}

export interface EncodeOptions {
  readonly phase: 'sft' | 'pretrain';
  /** the visual tokens of each of the sample's images, in order */
  readonly visualTokens: readonly number[];
  /** the sample, named in errors */
  readonly where: string;
}

type Kind = 'prompt' | 'answer' | 'reply';

interface Piece {
  readonly text: string;
  readonly kind: Kind;
}

export function encodeConversation(
  tok: TextTokenizer,
  messages: readonly Message[],
  o: EncodeOptions,
): EncodedText {
  // 1. markers
  const markers = messages.reduce((n, m) => n + m.content.split(IMAGE_MARKER).length - 1, 0);
  if (markers !== o.visualTokens.length)
    throw new DataError(o.where, `${markers} <image> markers, ${o.visualTokens.length} images`);
  if (markers > 0 && !tok.image)
    throw new DataError(
      o.where,
      `${markers} <image> markers, but ${tok.where} has no image placeholder (<|image_pad|> or <image>)`,
    );
  const turns = messages.map((m) => ({
    role: m.role,
    content: tok.image ? m.content.split(IMAGE_MARKER).join(tok.image.text) : m.content,
  }));

  // 2. pieces
  let pieces: Piece[];
  if (tok.chatTemplate !== undefined) pieces = templatePieces(tok, turns, o.where);
  else if (o.phase === 'pretrain') pieces = plainPieces(tok, turns);
  else
    throw new UserError(
      `${tok.where}: no chat template (tokenizer_config.json's chat_template, chat_template.jinja or chat_template.json beside it); sft needs one to find the assistant turns`,
    );

  // 3. tokens
  const { ids, kinds } = tokenize(tok, pieces, o.where);

  // 4. expand
  const imageId = tok.image?.id;
  const placeholders = imageId === undefined ? 0 : ids.filter((id) => id === imageId).length;
  if (placeholders !== o.visualTokens.length)
    throw new DataError(
      o.where,
      `the text holds ${placeholders} image placeholders (${tok.image?.token}), ${o.visualTokens.length} images`,
    );
  for (const n of o.visualTokens)
    if (!Number.isInteger(n) || n < 1)
      throw new Error(`${o.where}: an image of ${n} visual tokens (a positive integer expected)`);
  const length = ids.length - placeholders + o.visualTokens.reduce((a, b) => a + b, 0);
  const tokens = new Int32Array(length);
  const target = new Uint8Array(length);
  const reply = new Uint8Array(length);
  let at = 0;
  let image = 0;
  for (let i = 0; i < ids.length; i++) {
    if (ids[i] === imageId) {
      const n = o.visualTokens[image++];
      tokens.fill(ids[i], at, at + n);
      at += n;
      continue;
    }
    tokens[at] = ids[i];
    target[at] = o.phase === 'pretrain' || kinds[i] !== 'prompt' ? 1 : 0;
    reply[at] = kinds[i] === 'reply' ? 1 : 0;
    at++;
  }
  target[0] = 0;
  if (!target.includes(1)) throw new DataError(o.where, 'no loss token');
  return { tokens, target, reply };
}

/** Parsed templates by tokenizer: parsing costs more than rendering a short conversation. */
const parsed = new WeakMap<TextTokenizer, Template>();

function templateOf(tok: TextTokenizer): Template {
  let template = parsed.get(tok);
  if (!template) {
    try {
      template = new Template(tok.chatTemplate!);
    } catch (e) {
      throw new UserError(`${tok.where}: chat template: ${firstLine(e)}`);
    }
    parsed.set(tok, template);
  }
  return template;
}

type Turn = { readonly role: string; readonly content: string };

/** The template's rendering of messages[:upTo], with or without the generation prompt. */
function renderer(
  tok: TextTokenizer,
  turns: readonly Turn[],
  where: string,
): (upTo: number, generationPrompt: boolean) => string {
  const template = templateOf(tok);
  const specials = Object.fromEntries(
    SPECIAL_TOKEN_NAMES.map((n) => [`${n}_token`, tok.specialTokens[n] ?? '']),
  );
  return (upTo, generationPrompt) => {
    try {
      return template.render({
        ...specials,
        messages: turns.slice(0, upTo),
        add_generation_prompt: generationPrompt,
      });
    } catch (e) {
      throw new DataError(where, `the chat template of ${tok.where}: ${firstLine(e)}`);
    }
  };
}

// Rendering is most of a sample's cost (about 50 µs a render of a short ChatML template), and
// cutting the text renders the conversation twice per assistant turn. So the cuts are found once
// per shape of conversation (its roles, in order) on a stand-in whose contents are markers, and a
// sample takes them with the markers replaced by its contents:
//   - without rendering, when the template writes contents as given (template-contents.ts reads
//     it: ChatML's plain templates do);
//   - else when the sample's own rendering, the one render it pays, is the stand-in's text filled
//     in. A template that looks into a content (Qwen3's `'</think>' in content`, a `| trim`)
//     renders another text for some, and such a sample is cut the long way,
// as are contents that hold a marker character or are blank (their turns are skipped, which
// changes the cuts).
const MARK_OPEN = '\uE000';
const MARK_CLOSE = '\uE001';
const MARKS = /\uE000(\d+)\uE001/g;
const MAX_SHAPES = 64;

/** The stand-in's pieces by shape (roles), per tokenizer. */
const shapes = new WeakMap<TextTokenizer, Map<string, Piece[]>>();
/** Whether the tokenizer's template writes contents as given. */
const asGiven = new WeakMap<TextTokenizer, boolean>();

/** The template's text cut into pieces (see the file header); rendering errors are the sample's. */
function templatePieces(tok: TextTokenizer, turns: readonly Turn[], where: string): Piece[] {
  const plain = turns.every(
    (t) =>
      t.content.trim() !== '' && !t.content.includes(MARK_OPEN) && !t.content.includes(MARK_CLOSE),
  );
  if (!plain) return cutPieces(tok, turns, where);
  let byShape = shapes.get(tok);
  if (!byShape) shapes.set(tok, (byShape = new Map()));
  const key = turns.map((t) => t.role).join('\n');
  let stand = byShape.get(key);
  if (!stand) {
    const marked = turns.map((t, i) => ({ role: t.role, content: MARK_OPEN + i + MARK_CLOSE }));
    try {
      stand = cutPieces(tok, marked, where);
    } catch (e) {
      if (!(e instanceof DataError)) throw e;
      return cutPieces(tok, turns, where); // the markers do not pass: this sample's own error
    }
    if (byShape.size >= MAX_SHAPES) byShape.delete(byShape.keys().next().value!);
    byShape.set(key, stand);
  }
  const fill = (text: string) => text.replace(MARKS, (_, i: string) => turns[+i].content);
  let given = asGiven.get(tok);
  if (given === undefined) asGiven.set(tok, (given = writesContentsAsGiven(templateOf(tok))));
  if (given) return stand.map((p) => ({ text: fill(p.text), kind: p.kind }));
  const whole = renderer(tok, turns, where)(turns.length, false);
  if (whole !== fill(stand.map((p) => p.text).join(''))) return cutPieces(tok, turns, where);
  return stand.map((p) => ({ text: fill(p.text), kind: p.kind }));
}

/** The pieces found by rendering each turn's prompt and close (see the file header). */
function cutPieces(tok: TextTokenizer, turns: readonly Turn[], where: string): Piece[] {
  const render = renderer(tok, turns, where);
  const whole = render(turns.length, false);
  const pieces: Piece[] = [];
  let done = 0; // whole[0, done) is in pieces
  for (let k = 0; k < turns.length; k++) {
    if (turns[k].role !== 'assistant' || turns[k].content.trim() === '') continue;
    const prompt = render(k, true);
    if (!whole.startsWith(prompt) || prompt.length < done)
      throw new DataError(
        where,
        `the chat template's prompt for messages[${k}] (messages[:${k}] and the generation prompt) does not begin the conversation's text`,
      );
    // the last turn closed is the whole conversation
    const closed = k + 1 === turns.length ? whole : render(k + 1, false);
    // the content as written, or trimmed (templates that `| trim` it)
    let content = turns[k].content;
    let at = whole.indexOf(content, prompt.length);
    let own = closed.lastIndexOf(content);
    if (at < 0 || own < 0) {
      content = content.trim();
      at = whole.indexOf(content, prompt.length);
      own = closed.lastIndexOf(content);
    }
    if (at < 0 || own < 0)
      throw new DataError(
        where,
        `the chat template does not write the content of messages[${k}] (assistant) as given`,
      );
    const end = at + content.length;
    const close = commonStart(closed.slice(own + content.length), whole.slice(end)).trimEnd();
    pieces.push(
      { text: whole.slice(done, prompt.length), kind: 'prompt' },
      { text: whole.slice(prompt.length, at), kind: 'answer' },
      { text: content, kind: 'reply' },
      { text: close, kind: 'answer' },
    );
    done = end + close.length;
  }
  pieces.push({ text: whole.slice(done), kind: 'prompt' });
  return pieces;
}

/** The contents as plain text (see the file header). */
function plainPieces(
  tok: TextTokenizer,
  turns: readonly { role: string; content: string }[],
): Piece[] {
  const { bos, eos } = tok.specialTokens;
  return [
    { text: bos ?? '', kind: 'prompt' },
    ...turns.map((m, i): Piece => ({
      text: m.content + (i + 1 < turns.length ? '\n' : ''),
      kind: m.role === 'assistant' ? 'reply' : 'prompt',
    })),
    { text: eos ?? '', kind: 'prompt' },
  ];
}

/** The ids of the pieces, each with its piece's kind; refused when they differ from the whole's. */
function tokenize(
  tok: TextTokenizer,
  pieces: readonly Piece[],
  where: string,
): { ids: number[]; kinds: Kind[] } {
  // adjacent pieces of one kind are one piece: no cut where the masks do not change
  const merged: Piece[] = [];
  for (const p of pieces) {
    if (p.text === '') continue;
    const last = merged.at(-1);
    if (last?.kind === p.kind)
      merged[merged.length - 1] = { text: last.text + p.text, kind: p.kind };
    else merged.push(p);
  }
  const ids: number[] = [];
  const kinds: Kind[] = [];
  for (const p of merged)
    for (const id of tok.encode(p.text)) {
      ids.push(id);
      kinds.push(p.kind);
    }
  const whole = tok.encode(merged.map((p) => p.text).join(''));
  const differ = whole.findIndex((id, i) => id !== ids[i]);
  if (differ >= 0 || whole.length !== ids.length)
    throw new DataError(
      where,
      `the text's tokens change when it is cut where the replies begin and end (first at token ${differ >= 0 ? differ : Math.min(whole.length, ids.length)}); a reply that begins or ends with whitespace?`,
    );
  return { ids, kinds };
}

function commonStart(a: string, b: string): string {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return a.slice(0, n);
}

function firstLine(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split('\n')[0];
}
