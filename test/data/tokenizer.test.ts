// loadTokenizer (runtime/data/tokenizer.ts) on the project's two tokenizers, the tiny WordLevel
// one (configs/tokenizers/tiny) and the byte-level BPE fixture shaped as Qwen2's
// (test/fixtures/tokenizers/bpe-tiny), and on variants of them written to a temporary directory:
// a file or its directory, the size, the special tokens, the image placeholder of each kind of
// vocabulary, the places a chat template is found, and the files it refuses, naming them.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { UserError } from '../../compiler/errors.js';
import { loadTokenizer } from '../../runtime/data/tokenizer.js';

const TINY = 'configs/tokenizers/tiny';
const BPE = 'test/fixtures/tokenizers/bpe-tiny';
const tmp = mkdtempSync(join(tmpdir(), 'lfc-tokenizer-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

type Json = Record<string, unknown>;
const read = (path: string) => JSON.parse(readFileSync(path, 'utf8')) as Json;

/** A directory `name` under tmp with these files (objects as JSON, strings as they are). */
function dir(name: string, files: Record<string, unknown>): string {
  const d = join(tmp, name);
  mkdirSync(d, { recursive: true });
  for (const [file, content] of Object.entries(files))
    writeFileSync(join(d, file), typeof content === 'string' ? content : JSON.stringify(content));
  return d;
}

/** The BPE fixture's tokenizer.json with its added tokens replaced. */
function bpeWithAdded(contents: string[]): Json {
  const json = read(join(BPE, 'tokenizer.json'));
  const model = json.model as { vocab: Record<string, number> };
  const first = Object.keys(model.vocab).length;
  return {
    ...json,
    added_tokens: contents.map((content, i) => ({ id: first + i, content, special: true })),
  };
}

/** The error `load` throws: a UserError of one line. */
function refusal(load: () => unknown): string {
  try {
    load();
  } catch (e) {
    expect(e).toBeInstanceOf(UserError);
    expect((e as Error).message).not.toContain('\n');
    return (e as Error).message;
  }
  throw new Error('expected a refusal');
}

describe('the tiny WordLevel tokenizer', () => {
  const tok = loadTokenizer(TINY);

  it('has at most the tiny models’ 512 ids, <pad> 0 and <image> 1 (their pad and image ids)', () => {
    expect(tok.vocabSize).toBe(508);
    expect(tok.where).toBe(join(TINY, 'tokenizer.json'));
    expect(tok.padId).toBe(0);
    expect(tok.idOf('<pad>')).toBe(0);
    expect(tok.image).toEqual({ token: '<image>', id: 1, text: '<image>' });
    expect(tok.specialTokens).toEqual({
      bos: '<s>',
      eos: '<|im_end|>',
      pad: '<pad>',
      unk: '[UNK]',
    });
    expect(tok.chatTemplate).toContain('<|im_start|>');
  });

  it('knows the caption task’s words, lowercased, and sends the rest to [UNK] (2)', () => {
    // <|im_start|> user <image> describe the picture . what colour is the square ? zebra
    expect(
      tok.encode('<|im_start|>user\n<image>Describe the picture. What colour is the square? Zebra'),
    ).toEqual([4, 6, 1, 29, 20, 31, 37, 32, 35, 33, 20, 18, 38, 2]);
    for (const w of ['black', 'blue', 'green', 'cyan', 'red', 'magenta', 'yellow', 'white'])
      expect(tok.idOf(w), w).toBeGreaterThan(5);
  });
});

describe('the byte-level BPE fixture (Qwen2-shaped)', () => {
  const tok = loadTokenizer(BPE);

  it('loads with @huggingface/tokenizers: 407 model ids, then the 6 added tokens', () => {
    expect(tok.vocabSize).toBe(413);
    expect(tok.idOf('<|endoftext|>')).toBe(407);
    expect(tok.padId).toBe(407);
    expect(tok.specialTokens).toEqual({ eos: '<|im_end|>', pad: '<|endoftext|>' });
    expect(tok.image).toEqual({
      token: '<|image_pad|>',
      id: 412,
      text: '<|vision_start|><|image_pad|><|vision_end|>',
    });
  });

  it('encodes learned words whole, unknown ones byte by byte, special tokens as written', () => {
    // <|im_start|> user Ċ What Ġcolour Ġis Ġthe Ġsquare ? <|im_end|>
    expect(tok.encode('<|im_start|>user\nWhat colour is the square?<|im_end|>')).toEqual([
      408, 380, 198, 284, 327, 263, 260, 267, 30, 409,
    ]);
    // H ello (ello learned from yellow); Ġ ! ĊĊ (one pre-token: punctuation takes the newlines
    // after it; ĊĊ a learned merge); red .Ċ (another)
    expect(tok.encode('Hello !\n\nred.\n')).toEqual([39, 304, 220, 0, 383, 291, 282]);
  });

  it('round-trips any text, byte-level: unicode, tabs, newlines, special tokens', () => {
    for (const text of [
      'Zebra 123 ünïcode 日本語 ½ \t tab\r\n',
      '<|im_start|>assistant\nThe square is red.<|im_end|>\n',
      "It's  two  spaces. ?!",
      '',
    ])
      expect(tok.decode(tok.encode(text))).toBe(text);
  });
});

describe('loadTokenizer', () => {
  it('takes a tokenizer.json or its directory, and reads the files beside it either way', () => {
    for (const base of [TINY, BPE]) {
      const fromDir = loadTokenizer(base);
      const fromFile = loadTokenizer(join(base, 'tokenizer.json'));
      expect(fromFile.where).toBe(fromDir.where);
      expect(fromFile.vocabSize).toBe(fromDir.vocabSize);
      expect(fromFile.chatTemplate).toBe(fromDir.chatTemplate);
      expect(fromFile.specialTokens).toEqual(fromDir.specialTokens);
      expect(fromFile.image).toEqual(fromDir.image);
      expect(fromFile.encode('<|im_start|>the square')).toEqual(
        fromDir.encode('<|im_start|>the square'),
      );
    }
  });

  it('without tokenizer_config.json: no template, no special tokens, pad 0', () => {
    const d = dir('bare', { 'tokenizer.json': read(join(BPE, 'tokenizer.json')) });
    const tok = loadTokenizer(d);
    expect(tok.chatTemplate).toBeUndefined();
    expect(tok.specialTokens).toEqual({});
    expect(tok.padId).toBe(0);
  });

  it('reads models other than BPE with the library too: WordPiece', () => {
    const d = dir('wordpiece', {
      'tokenizer.json': {
        normalizer: { type: 'BertNormalizer', lowercase: true },
        pre_tokenizer: { type: 'BertPreTokenizer' },
        decoder: { type: 'WordPiece', prefix: '##' },
        model: {
          type: 'WordPiece',
          unk_token: '[UNK]',
          continuing_subword_prefix: '##',
          vocab: { '[UNK]': 0, the: 1, square: 2, '##s': 3, '.': 4 },
        },
      },
    });
    const tok = loadTokenizer(d);
    expect(tok.encode('The squares. Zebra')).toEqual([1, 2, 3, 4, 0]);
    expect(tok.vocabSize).toBe(5);
  });

  it('counts added tokens past the model’s vocabulary in vocabSize', () => {
    const json = bpeWithAdded(['<|endoftext|>']);
    (json.added_tokens as Json[]).push({ id: 500, content: '<|far|>', special: true });
    const tok = loadTokenizer(join(dir('far', { 'tokenizer.json': json }), 'tokenizer.json'));
    expect(tok.vocabSize).toBe(501);
    expect(tok.encode('a<|far|>')).toEqual([64, 500]);
  });

  it.each([
    [
      'Qwen-style, wrapped',
      ['<|vision_start|>', '<|vision_end|>', '<|image_pad|>'],
      { token: '<|image_pad|>', id: 409, text: '<|vision_start|><|image_pad|><|vision_end|>' },
    ],
    [
      'Qwen-style, bare',
      ['<|image_pad|>'],
      { token: '<|image_pad|>', id: 407, text: '<|image_pad|>' },
    ],
    ['LLaVA-style', ['<s>', '<image>'], { token: '<image>', id: 408, text: '<image>' }],
    [
      'Qwen-style over LLaVA-style',
      ['<image>', '<|image_pad|>'],
      { token: '<|image_pad|>', id: 408, text: '<|image_pad|>' },
    ],
    ['neither', ['<|endoftext|>'], undefined],
  ])('finds the image placeholder of a %s vocabulary', (name, added, image) => {
    const d = dir(`image-${name.replace(/\W+/g, '-')}`, { 'tokenizer.json': bpeWithAdded(added) });
    expect(loadTokenizer(d).image).toEqual(image);
  });

  it('reads special tokens given as {content}', () => {
    const d = dir('content', {
      'tokenizer.json': read(join(TINY, 'tokenizer.json')),
      'tokenizer_config.json': {
        eos_token: { __type: 'AddedToken', content: '<|im_end|>' },
        pad_token: null,
      },
    });
    const tok = loadTokenizer(d);
    expect(tok.specialTokens).toEqual({ eos: '<|im_end|>' });
    expect(tok.padId).toBe(0);
  });

  describe('finds the chat template', () => {
    const tokenizer = read(join(TINY, 'tokenizer.json'));
    it.each([
      [
        'a string in tokenizer_config.json',
        { 'tokenizer_config.json': { chat_template: 'A{{ x }}' } },
        'A{{ x }}',
      ],
      [
        "the 'default' of a list in tokenizer_config.json",
        {
          'tokenizer_config.json': {
            chat_template: [
              { name: 'tool_use', template: 'T' },
              { name: 'default', template: 'D' },
            ],
          },
        },
        'D',
      ],
      [
        'chat_template.jinja, when the config has none',
        { 'tokenizer_config.json': {}, 'chat_template.jinja': 'J{{ messages }}' },
        'J{{ messages }}',
      ],
      [
        'chat_template.json, when nothing else has one',
        { 'chat_template.json': { chat_template: 'P' } },
        'P',
      ],
      [
        'the config’s first, then chat_template.jinja',
        {
          'tokenizer_config.json': { chat_template: 'C' },
          'chat_template.jinja': 'J',
          'chat_template.json': { chat_template: 'P' },
        },
        'C',
      ],
    ])('as %s', (name, files, template) => {
      const d = dir(`template-${name.replace(/\W+/g, '-')}`, {
        'tokenizer.json': tokenizer,
        ...files,
      });
      expect(loadTokenizer(d).chatTemplate).toBe(template);
    });
  });

  describe('refuses, in one line naming the file', () => {
    const tiny = read(join(TINY, 'tokenizer.json'));

    it('a missing path, and a directory without tokenizer.json', () => {
      expect(refusal(() => loadTokenizer(join(tmp, 'nowhere')))).toBe(
        `cannot read ${join(tmp, 'nowhere')}: ENOENT`,
      );
      const d = dir('empty', {});
      expect(refusal(() => loadTokenizer(d))).toBe(
        `cannot read ${join(d, 'tokenizer.json')}: ENOENT`,
      );
    });

    it('malformed JSON in tokenizer.json or tokenizer_config.json', () => {
      const bad = dir('bad-json', { 'tokenizer.json': '{"model": {' });
      expect(refusal(() => loadTokenizer(bad))).toMatch(
        new RegExp(`^${join(bad, 'tokenizer.json')}: malformed JSON: `),
      );
      const badConfig = dir('bad-config', {
        'tokenizer.json': tiny,
        'tokenizer_config.json': '[1,',
      });
      expect(refusal(() => loadTokenizer(badConfig))).toMatch(
        new RegExp(`^${join(badConfig, 'tokenizer_config.json')}: malformed JSON: `),
      );
    });

    it.each([
      [
        'a model it does not know',
        { ...tiny, model: { type: 'Tiktoken' } },
        {},
        /tokenizer\.json: model\.type "Tiktoken" is not supported \(BPE, Unigram, WordPiece, WordLevel\)$/,
      ],
      [
        'no model',
        { added_tokens: [] },
        {},
        /tokenizer\.json: model\.type undefined is not supported/,
      ],
      [
        'a WordLevel model it cannot read',
        { ...tiny, normalizer: { type: 'NFKC' } },
        {},
        /tokenizer\.json: normalizer "NFKC" is not supported/,
      ],
      [
        'a pre-tokenizer the library does not know',
        { ...read(join(BPE, 'tokenizer.json')), pre_tokenizer: { type: 'Magic' } },
        {},
        /tokenizer\.json: Unknown PreTokenizer type: Magic$/,
      ],
      [
        'a special token not in the vocabulary',
        tiny,
        { pad_token: '<nope>' },
        /tokenizer_config\.json: pad_token "<nope>" is not a token of .*tokenizer\.json$/,
      ],
      [
        'a special token of another type',
        tiny,
        { eos_token: 3 },
        /tokenizer_config\.json: eos_token is 3, not a token/,
      ],
      [
        'a template list without a default',
        tiny,
        { chat_template: [{ name: 'tool_use', template: 'T' }] },
        /tokenizer_config\.json: chat_template must be a string or a list of \{name, template\} with a 'default' one$/,
      ],
      [
        'a template that does not parse',
        tiny,
        { chat_template: '{% for m in messages %}' },
        /tokenizer_config\.json: chat_template: /,
      ],
      [
        'an <image> that is a plain vocabulary word',
        {
          ...tiny,
          added_tokens: [],
          model: { type: 'WordLevel', vocab: { '[UNK]': 0, '<image>': 1 }, unk_token: '[UNK]' },
          pre_tokenizer: { type: 'WhitespaceSplit' },
        },
        {},
        /tokenizer\.json: <image> is in the vocabulary but not in added_tokens, so a text cannot name it$/,
      ],
    ])('%s', (name, tokenizer, config, message) => {
      const d = dir(`refuse-${name.replace(/\W+/g, '-')}`, {
        'tokenizer.json': tokenizer,
        'tokenizer_config.json': config,
      });
      const text = refusal(() => loadTokenizer(d));
      expect(text).toMatch(message);
      expect(text.startsWith(d)).toBe(true);
    });
  });
});
