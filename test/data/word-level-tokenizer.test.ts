// The WordLevel tokenizer.json reader (runtime/data/word-level-tokenizer.ts) on a hand-made
// vocabulary in Hugging Face's format: special tokens first, words by the vocabulary, unknown
// words to unk, the normalizer and pre-tokenizer it knows; anything else refused naming the file.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { loadWordLevelTokenizer } from '../../runtime/data/word-level-tokenizer.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-tokenizer-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const VOCAB = { '[UNK]': 0, a: 1, red: 2, square: 3, on: 4, blue: 5, '.': 6, '?': 7 };
const SPECIAL = [
  { id: 8, content: '<image>', special: true },
  { id: 9, content: '<|im_start|>', special: true },
  { id: 10, content: '<|im_end|>', special: true },
];

function file(name: string, json: unknown): string {
  const path = join(dir, name);
  writeFileSync(path, JSON.stringify(json));
  return path;
}

const base = {
  version: '1.0',
  added_tokens: SPECIAL,
  normalizer: { type: 'Lowercase' },
  pre_tokenizer: { type: 'Whitespace' },
  model: { type: 'WordLevel', vocab: VOCAB, unk_token: '[UNK]' },
};

describe('a WordLevel tokenizer.json', () => {
  const tok = loadWordLevelTokenizer(file('tokenizer.json', base));

  it('encodes special tokens where they stand and words by the vocabulary', () => {
    // <|im_start|> <image> a red square on blue . green(unknown: 0) ? <|im_end|>
    expect(tok.encode('<|im_start|><image>\nA red square on BLUE. green ?<|im_end|>')).toEqual([
      9, 8, 1, 2, 3, 4, 5, 6, 0, 7, 10,
    ]);
    // Whitespace's pieces are runs of word characters or of other non-space characters, as HF's
    // \w+|[^\w\s]+: ".?" is one piece, not in the vocabulary
    expect(tok.encode('blue.?')).toEqual([5, 0]);
  });

  it('decodes, knows its ids and its size', () => {
    expect(tok.decode([9, 1, 2, 10])).toBe('<|im_start|> a red <|im_end|>');
    expect(tok.idOf('<image>')).toBe(8);
    expect(tok.idOf('square')).toBe(3);
    expect(tok.idOf('green')).toBeUndefined();
    expect(tok.vocabSize).toBe(11);
  });

  it('splits on whitespace only with WhitespaceSplit, and keeps case without a normalizer', () => {
    const t = loadWordLevelTokenizer(
      file('split.json', { ...base, normalizer: null, pre_tokenizer: { type: 'WhitespaceSplit' } }),
    );
    expect(t.encode('a red. Blue')).toEqual([1, 0, 0]);
  });

  it.each([
    ['a BPE model', { ...base, model: { type: 'BPE', vocab: VOCAB } }, /model\.type is "BPE"/],
    [
      'an unknown unk token',
      { ...base, model: { type: 'WordLevel', vocab: VOCAB, unk_token: '<unk>' } },
      /model\.unk_token "<unk>" is not in the vocabulary/,
    ],
    [
      'a normalizer it does not know',
      { ...base, normalizer: { type: 'NFKC' } },
      /normalizer "NFKC" is not supported/,
    ],
  ])('refuses %s, naming the file', (name, json, message) => {
    const path = file(`${name.replace(/\W+/g, '-')}.json`, json);
    expect(() => loadWordLevelTokenizer(path)).toThrow(message);
    expect(() => loadWordLevelTokenizer(path)).toThrow(path);
  });

  it('refuses malformed JSON', () => {
    const path = join(dir, 'bad.json');
    writeFileSync(path, '{"model": ');
    expect(() => loadWordLevelTokenizer(path)).toThrow(/bad\.json: malformed JSON/);
  });
});
