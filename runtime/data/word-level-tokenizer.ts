// A Hugging Face tokenizer.json whose model is WordLevel (hand-made vocabularies: the tests' and
// the demo's), which @huggingface/tokenizers does not implement. What this reads of the format:
//   added_tokens     special tokens (`<image>`, `<|im_start|>`, …), matched first, longest first
//   normalizer       absent, or Lowercase
//   pre_tokenizer    Whitespace (\w+ | [^\w\s]+), WhitespaceSplit, or absent (Whitespace)
//   model            {type: "WordLevel", vocab: {token: id}, unk_token}
// Anything else is refused naming the file and the key.

import { parseFile, UserError } from '../../compiler/errors.js';

type Json = Record<string, unknown>;

export interface WordLevelTokenizer {
  /** ids of a text: special tokens where they appear, the words between them by the vocabulary */
  encode(text: string): number[];
  /** the tokens of ids, joined by spaces (special tokens as written) */
  decode(ids: readonly number[]): string;
  /** the id of a token (a special one or a word), undefined when unknown */
  idOf(token: string): number | undefined;
  /** the vocabulary's size: one past the largest id */
  readonly vocabSize: number;
}

const PRE_TOKENIZERS: Record<string, RegExp> = {
  Whitespace: /\w+|[^\w\s]+/gu,
  WhitespaceSplit: /\S+/gu,
};

export function loadWordLevelTokenizer(path: string): WordLevelTokenizer {
  return wordLevelTokenizerOf(
    parseFile(path, 'JSON', (t) => JSON.parse(t) as unknown),
    path,
  );
}

/** The tokenizer of a parsed tokenizer.json; `path` names the file in errors. */
export function wordLevelTokenizerOf(parsed: unknown, path: string): WordLevelTokenizer {
  const json = (typeof parsed === 'object' && parsed !== null ? parsed : {}) as Json;
  const fail = (what: string): never => {
    throw new UserError(`${path}: ${what}`);
  };
  const model = json.model as Json | undefined;
  if (model?.type !== 'WordLevel')
    fail(`model.type is ${JSON.stringify(model?.type)}; this reader takes WordLevel`);
  const vocab = model!.vocab as Record<string, unknown> | undefined;
  if (typeof vocab !== 'object' || vocab === null) fail('model.vocab must map tokens to ids');
  const ids = new Map<string, number>();
  for (const [token, id] of Object.entries(vocab!)) {
    if (!Number.isInteger(id) || (id as number) < 0)
      fail(`model.vocab[${JSON.stringify(token)}] is ${JSON.stringify(id)}, not an id`);
    ids.set(token, id as number);
  }
  const unk = model!.unk_token;
  if (typeof unk !== 'string' || !ids.has(unk))
    fail(`model.unk_token ${JSON.stringify(unk)} is not in the vocabulary`);
  const unkId = ids.get(unk as string)!;

  const special = new Map<string, number>();
  for (const [i, t] of ((json.added_tokens as Json[] | undefined) ?? []).entries()) {
    if (typeof t.content !== 'string' || !Number.isInteger(t.id))
      fail(`added_tokens[${i}] needs a string content and an integer id`);
    special.set(t.content as string, t.id as number);
  }
  const normalizer = json.normalizer as Json | null | undefined;
  const lowercase = normalizer?.type === 'Lowercase';
  if (normalizer && !lowercase)
    fail(`normalizer ${JSON.stringify(normalizer.type)} is not supported (Lowercase or none)`);
  const pre = json.pre_tokenizer as Json | null | undefined;
  const split = PRE_TOKENIZERS[(pre?.type as string | undefined) ?? 'Whitespace'];
  if (!split)
    fail(
      `pre_tokenizer ${JSON.stringify(pre?.type)} is not supported (${Object.keys(PRE_TOKENIZERS).join(', ')})`,
    );

  const byId = new Map<number, string>();
  for (const [t, id] of ids) byId.set(id, t);
  for (const [t, id] of special) byId.set(id, t);
  // special tokens in one alternation, longest first, so that at a position where one begins
  // that contains another, the longer wins; the earliest position wins over a longer one later
  const specials = [...special.keys()].sort((a, b) => b.length - a.length);
  const escape = (t: string) => t.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const anySpecial = specials.length ? new RegExp(specials.map(escape).join('|'), 'gu') : undefined;
  const words = (text: string, out: number[]) => {
    for (const m of (lowercase ? text.toLowerCase() : text).matchAll(split))
      out.push(ids.get(m[0]) ?? unkId);
  };

  return {
    encode(text) {
      const out: number[] = [];
      if (!anySpecial) {
        words(text, out);
        return out;
      }
      let done = 0;
      for (const m of text.matchAll(anySpecial)) {
        words(text.slice(done, m.index), out);
        out.push(special.get(m[0])!);
        done = m.index + m[0].length;
      }
      words(text.slice(done), out);
      return out;
    },
    decode(list) {
      return list.map((id) => byId.get(id) ?? unk).join(' ');
    },
    idOf(token) {
      return special.get(token) ?? ids.get(token);
    },
    vocabSize: Math.max(-1, ...byId.keys()) + 1,
  };
}
