// encodeConversation (runtime/data/chat.ts) on the project's two tokenizers: the tiny WordLevel
// one (configs/tokenizers/tiny, ChatML after <s>) and the byte-level BPE fixture
// (test/fixtures/tokenizers/bpe-tiny, Qwen2-VL-like ChatML with a default system turn). Every
// expected list is written out by hand: one row per token, [id, the token, target, reply].
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { afterAll, describe, expect, it } from 'vitest';
import { UserError } from '../../compiler/errors.js';
import { encodeConversation, type EncodedText } from '../../runtime/data/chat.js';
import { DataError, type Message } from '../../runtime/data/sample.js';
import { loadTokenizer, type TextTokenizer } from '../../runtime/data/tokenizer.js';

const tiny = loadTokenizer('configs/tokenizers/tiny');
const bpe = loadTokenizer('test/fixtures/tokenizers/bpe-tiny');
const tmp = mkdtempSync(join(tmpdir(), 'lfc-chat-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

type Row = [id: number, token: string, target: 0 | 1, reply: 0 | 1];

/** The encoding against rows; the rows' tokens are checked against the vocabulary too. */
function expectRows(tok: TextTokenizer, got: EncodedText, rows: Row[]): void {
  expect(rows.map(([id]) => tok.decode([id]))).toEqual(rows.map(([, token]) => token));
  expect(Array.from(got.tokens)).toEqual(rows.map(([id]) => id));
  expect(Array.from(got.target)).toEqual(rows.map(([, , target]) => target));
  expect(Array.from(got.reply)).toEqual(rows.map(([, , , reply]) => reply));
}

/** A copy of a tokenizer directory with its tokenizer_config.json replaced. */
function withConfig(from: string, name: string, config: unknown): TextTokenizer {
  const d = join(tmp, name);
  cpSync(from, d, { recursive: true });
  writeFileSync(join(d, 'tokenizer_config.json'), JSON.stringify(config));
  return loadTokenizer(d);
}

/** The DataError `f` throws. */
function dataError(f: () => unknown): DataError {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(DataError);
    expect((e as Error).message).not.toContain('\n');
    return e as DataError;
  }
  throw new Error('expected a DataError');
}

const TWO_TURNS: Message[] = [
  { role: 'user', content: '<image>What colour is the square?' },
  { role: 'assistant', content: 'The square is red.' },
  { role: 'user', content: 'And the background?' },
  { role: 'assistant', content: 'It is blue.' },
];

const CAPTION: Message[] = [
  { role: 'user', content: '<image>Describe the image.' },
  { role: 'assistant', content: 'A red square on a blue background.' },
];

describe('The chat template, placeholder expansion and loss mask of a two-turn SFT sample equal a hand-written expected token list', () => {
  const o = { phase: 'sft', visualTokens: [4], where: 'train.jsonl:7' } as const;

  it('the tiny WordLevel tokenizer (spaces and newlines are not tokens)', () => {
    expectRows(tiny, encodeConversation(tiny, TWO_TURNS, o), [
      [3, '<s>', 0, 0],
      [4, '<|im_start|>', 0, 0],
      [6, 'user', 0, 0],
      [1, '<image>', 0, 0],
      [1, '<image>', 0, 0],
      [1, '<image>', 0, 0],
      [1, '<image>', 0, 0],
      [32, 'what', 0, 0],
      [35, 'colour', 0, 0],
      [33, 'is', 0, 0],
      [20, 'the', 0, 0],
      [18, 'square', 0, 0],
      [38, '?', 0, 0],
      [5, '<|im_end|>', 0, 0],
      [4, '<|im_start|>', 0, 0],
      [7, 'assistant', 0, 0],
      [20, 'the', 1, 1],
      [18, 'square', 1, 1],
      [33, 'is', 1, 1],
      [13, 'red', 1, 1],
      [37, '.', 1, 1],
      [5, '<|im_end|>', 1, 0],
      [4, '<|im_start|>', 0, 0],
      [6, 'user', 0, 0],
      [88, 'and', 0, 0],
      [20, 'the', 0, 0],
      [17, 'background', 0, 0],
      [38, '?', 0, 0],
      [5, '<|im_end|>', 0, 0],
      [4, '<|im_start|>', 0, 0],
      [7, 'assistant', 0, 0],
      [94, 'it', 1, 1],
      [33, 'is', 1, 1],
      [10, 'blue', 1, 1],
      [37, '.', 1, 1],
      [5, '<|im_end|>', 1, 0],
    ]);
  });

  it('the byte-level BPE fixture (Qwen2-VL-like: default system turn, wrapped placeholder)', () => {
    expectRows(bpe, encodeConversation(bpe, TWO_TURNS, o), [
      [408, '<|im_start|>', 0, 0],
      [379, 'system', 0, 0],
      [198, '\n', 0, 0],
      [349, 'You', 0, 0],
      [392, ' are', 0, 0],
      [280, ' a', 0, 0],
      [393, ' helpful', 0, 0],
      [401, ' assistant', 0, 0],
      [13, '.', 0, 0],
      [409, '<|im_end|>', 0, 0],
      [198, '\n', 0, 0],
      [408, '<|im_start|>', 0, 0],
      [380, 'user', 0, 0],
      [198, '\n', 0, 0],
      [410, '<|vision_start|>', 0, 0],
      [412, '<|image_pad|>', 0, 0],
      [412, '<|image_pad|>', 0, 0],
      [412, '<|image_pad|>', 0, 0],
      [412, '<|image_pad|>', 0, 0],
      [411, '<|vision_end|>', 0, 0],
      [284, 'What', 0, 0],
      [327, ' colour', 0, 0],
      [263, ' is', 0, 0],
      [260, ' the', 0, 0],
      [267, ' square', 0, 0],
      [30, '?', 0, 0],
      [409, '<|im_end|>', 0, 0],
      [198, '\n', 0, 0],
      [408, '<|im_start|>', 0, 0],
      [350, 'assistant', 0, 0],
      [198, '\n', 0, 0],
      [273, 'The', 1, 1],
      [267, ' square', 1, 1],
      [263, ' is', 1, 1],
      [294, ' red', 1, 1],
      [13, '.', 1, 1],
      [409, '<|im_end|>', 1, 0],
      [198, '\n', 0, 0], // the newline after <|im_end|> is not a target (chat.ts says why)
      [408, '<|im_start|>', 0, 0],
      [380, 'user', 0, 0],
      [198, '\n', 0, 0],
      [333, 'And', 0, 0],
      [260, ' the', 0, 0],
      [295, ' background', 0, 0],
      [30, '?', 0, 0],
      [409, '<|im_end|>', 0, 0],
      [198, '\n', 0, 0],
      [408, '<|im_start|>', 0, 0],
      [350, 'assistant', 0, 0],
      [198, '\n', 0, 0],
      [342, 'It', 1, 1],
      [263, ' is', 1, 1],
      [296, ' blue', 1, 1],
      [13, '.', 1, 1],
      [409, '<|im_end|>', 1, 0],
      [198, '\n', 0, 0],
    ]);
  });
});

describe('pretrain', () => {
  const o = { phase: 'pretrain', visualTokens: [2], where: 'caption.jsonl:1' } as const;

  it('targets every token but the image placeholders (and the first, which nothing precedes)', () => {
    expectRows(tiny, encodeConversation(tiny, CAPTION, o), [
      [3, '<s>', 0, 0],
      [4, '<|im_start|>', 1, 0],
      [6, 'user', 1, 0],
      [1, '<image>', 0, 0],
      [1, '<image>', 0, 0],
      [29, 'describe', 1, 0],
      [20, 'the', 1, 0],
      [30, 'image', 1, 0],
      [37, '.', 1, 0],
      [5, '<|im_end|>', 1, 0],
      [4, '<|im_start|>', 1, 0],
      [7, 'assistant', 1, 0],
      [25, 'a', 1, 1],
      [13, 'red', 1, 1],
      [18, 'square', 1, 1],
      [19, 'on', 1, 1],
      [25, 'a', 1, 1],
      [10, 'blue', 1, 1],
      [17, 'background', 1, 1],
      [37, '.', 1, 1],
      [5, '<|im_end|>', 1, 0],
    ]);
    expectRows(bpe, encodeConversation(bpe, CAPTION, o), [
      [408, '<|im_start|>', 0, 0],
      [379, 'system', 1, 0],
      [198, '\n', 1, 0],
      [349, 'You', 1, 0],
      [392, ' are', 1, 0],
      [280, ' a', 1, 0],
      [393, ' helpful', 1, 0],
      [401, ' assistant', 1, 0],
      [13, '.', 1, 0],
      [409, '<|im_end|>', 1, 0],
      [198, '\n', 1, 0],
      [408, '<|im_start|>', 1, 0],
      [380, 'user', 1, 0],
      [198, '\n', 1, 0],
      [410, '<|vision_start|>', 1, 0],
      [412, '<|image_pad|>', 0, 0],
      [412, '<|image_pad|>', 0, 0],
      [411, '<|vision_end|>', 1, 0],
      [340, 'Describe', 1, 0],
      [260, ' the', 1, 0],
      [328, ' image', 1, 0],
      [13, '.', 1, 0],
      [409, '<|im_end|>', 1, 0],
      [198, '\n', 1, 0],
      [408, '<|im_start|>', 1, 0],
      [350, 'assistant', 1, 0],
      [198, '\n', 1, 0],
      [32, 'A', 1, 1],
      [294, ' red', 1, 1],
      [267, ' square', 1, 1],
      [330, ' on', 1, 1],
      [280, ' a', 1, 1],
      [296, ' blue', 1, 1],
      [295, ' background', 1, 1],
      [13, '.', 1, 1],
      [409, '<|im_end|>', 1, 0],
      [198, '\n', 1, 0],
    ]);
  });

  it('without a chat template: the contents joined by newlines, then eos', () => {
    const plain = withConfig('test/fixtures/tokenizers/bpe-tiny', 'plain', {
      eos_token: '<|endoftext|>',
    });
    expect(plain.chatTemplate).toBeUndefined();
    const got = encodeConversation(plain, TWO_TURNS, { ...o, visualTokens: [3] });
    // <vs><pad><ve>What colour is the square?\nThe square is red.\nAnd the background?\nIt is
    // blue.<|endoftext|>: each newline goes with the text before it (`?\n` and `.\n` are merges),
    // so the one after an assistant content is a reply token
    expectRows(plain, got, [
      [410, '<|vision_start|>', 0, 0],
      [412, '<|image_pad|>', 0, 0],
      [412, '<|image_pad|>', 0, 0],
      [412, '<|image_pad|>', 0, 0],
      [411, '<|vision_end|>', 1, 0],
      [284, 'What', 1, 0],
      [327, ' colour', 1, 0],
      [263, ' is', 1, 0],
      [260, ' the', 1, 0],
      [267, ' square', 1, 0],
      [331, '?\n', 1, 0],
      [273, 'The', 1, 1],
      [267, ' square', 1, 1],
      [263, ' is', 1, 1],
      [294, ' red', 1, 1],
      [282, '.\n', 1, 1],
      [333, 'And', 1, 0],
      [260, ' the', 1, 0],
      [295, ' background', 1, 0],
      [331, '?\n', 1, 0],
      [342, 'It', 1, 1],
      [263, ' is', 1, 1],
      [296, ' blue', 1, 1],
      [13, '.', 1, 1],
      [407, '<|endoftext|>', 1, 0],
    ]);
  });
});

describe('sft targets', () => {
  const o = { phase: 'sft', visualTokens: [], where: 'sft.jsonl:2' } as const;

  it('nothing of a system turn, nor of an assistant turn with an empty content', () => {
    const got = encodeConversation(
      tiny,
      [
        { role: 'system', content: 'Describe the image.' },
        { role: 'user', content: 'What colour?' },
        { role: 'assistant', content: '' },
        { role: 'user', content: 'What colour?' },
        { role: 'assistant', content: 'Red.' },
      ],
      o,
    );
    const targets = Array.from(got.tokens).filter((_, i) => got.target[i]);
    expect(tiny.decode(targets)).toBe('red . <|im_end|>');
    expect(tiny.decode(Array.from(got.tokens).filter((_, i) => got.reply[i]))).toBe('red .');
  });

  it('the content of a template that trims it', () => {
    const trims = withConfig('configs/tokenizers/tiny', 'trims', {
      chat_template:
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + (m.content | trim) + '<|im_end|>\\n' }}{% endfor %}" +
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    });
    const got = encodeConversation(
      trims,
      [
        { role: 'user', content: 'What colour?' },
        { role: 'assistant', content: '  Red.  ' },
      ],
      o,
    );
    // <|im_start|> user what colour ? <|im_end|> <|im_start|> assistant red . <|im_end|>
    expect(Array.from(got.tokens)).toEqual([4, 6, 32, 35, 38, 5, 4, 7, 13, 37, 5]);
    expect(Array.from(got.target)).toEqual([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]);
    expect(Array.from(got.reply)).toEqual([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0]);
  });
});

describe('cuts found once per shape of conversation (chat.ts: one render a sample)', () => {
  const o = { phase: 'sft', visualTokens: [], where: 'sft.jsonl:3' } as const;
  // a template that looks into a content: a reply holding 'red' gets ' square' after it
  const looks = withConfig('configs/tokenizers/tiny', 'looks', {
    chat_template:
      "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content }}{% if 'red' in m.content %}{{ ' square' }}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}" +
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
  });
  const ask = (reply: string): Message[] => [
    { role: 'user', content: 'What colour?' },
    { role: 'assistant', content: reply },
  ];

  it("a sample the template writes as the stand-in: the stand-in's cuts", () => {
    // <|im_start|> user what colour ? <|im_end|> <|im_start|> assistant blue . <|im_end|>
    const got = encodeConversation(looks, ask('Blue.'), o);
    expect(Array.from(got.tokens)).toEqual([4, 6, 32, 35, 38, 5, 4, 7, 10, 37, 5]);
    expect(Array.from(got.target)).toEqual([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]);
    expect(Array.from(got.reply)).toEqual([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0]);
  });

  it('a sample it writes otherwise: cut the long way, what the template adds is no reply', () => {
    // … <|im_start|> assistant it is red . square <|im_end|>
    const got = encodeConversation(looks, ask('It is red.'), o);
    expect(Array.from(got.tokens)).toEqual([4, 6, 32, 35, 38, 5, 4, 7, 94, 33, 13, 37, 18, 5]);
    expect(Array.from(got.target)).toEqual([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]);
    expect(Array.from(got.reply)).toEqual([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0]);
    // and the next sample of the shape takes the stand-in's cuts again
    expect(Array.from(encodeConversation(looks, ask('Blue.'), o).reply)).toEqual([
      0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0,
    ]);
  });

  it('shapes do not mix: alternating two give what each gives alone', () => {
    const template = (
      JSON.parse(readFileSync('configs/tokenizers/tiny/tokenizer_config.json', 'utf8')) as {
        chat_template: string;
      }
    ).chat_template;
    let made = 0;
    const fresh = () =>
      withConfig('configs/tokenizers/tiny', `fresh-${made++}`, { chat_template: template });
    const q = { ...o, visualTokens: [4] };
    const alone = [
      encodeConversation(fresh(), TWO_TURNS, q),
      encodeConversation(fresh(), CAPTION, q),
    ];
    const one = fresh();
    for (let k = 0; k < 4; k++)
      expect(encodeConversation(one, k % 2 ? CAPTION : TWO_TURNS, q)).toEqual(alone[k % 2]);
  });
});

describe('refuses a sample', () => {
  const o = { phase: 'sft', visualTokens: [4], where: 'train.jsonl:9' } as const;

  it('whose <image> markers and images differ in number', () => {
    expect(
      dataError(() => encodeConversation(bpe, TWO_TURNS, { ...o, visualTokens: [4, 4] })).message,
    ).toBe('train.jsonl:9: 1 <image> markers, 2 images');
    expect(dataError(() => encodeConversation(bpe, TWO_TURNS.slice(1), o)).message).toBe(
      'train.jsonl:9: 0 <image> markers, 1 images',
    );
  });

  it('whose text writes a placeholder token itself', () => {
    const messages: Message[] = [
      { role: 'user', content: '<|image_pad|> <image>What colour?' },
      { role: 'assistant', content: 'Red.' },
    ];
    expect(dataError(() => encodeConversation(bpe, messages, o)).problem).toBe(
      'the text holds 2 image placeholders (<|image_pad|>), 1 images',
    );
  });

  it('with images when the tokenizer has no placeholder', () => {
    const d = join(tmp, 'no-image');
    cpSync('test/fixtures/tokenizers/bpe-tiny', d, { recursive: true });
    const json = JSON.parse(readFileSync(join(d, 'tokenizer.json'), 'utf8')) as {
      added_tokens: { content: string }[];
    };
    json.added_tokens = json.added_tokens.filter(
      (t) => !t.content.startsWith('<|vision') && t.content !== '<|image_pad|>',
    );
    writeFileSync(join(d, 'tokenizer.json'), JSON.stringify(json));
    const tok = loadTokenizer(d);
    expect(tok.image).toBeUndefined();
    expect(dataError(() => encodeConversation(tok, TWO_TURNS, o)).problem).toBe(
      `1 <image> markers, but ${join(d, 'tokenizer.json')} has no image placeholder (<|image_pad|> or <image>)`,
    );
  });

  it('with no loss token: no assistant turn, or only empty replies', () => {
    for (const messages of [
      TWO_TURNS.slice(0, 1),
      [TWO_TURNS[0], { role: 'assistant', content: ' \n' }] satisfies Message[],
    ])
      expect(dataError(() => encodeConversation(bpe, messages, o)).message).toBe(
        'train.jsonl:9: no loss token',
      );
  });

  it('that the template refuses (raise_exception), naming the sample and the tokenizer', () => {
    const strict = withConfig('configs/tokenizers/tiny', 'strict', {
      chat_template:
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system turns') }}{% endif %}{{ m.content }}{% endfor %}",
    });
    const e = dataError(() =>
      encodeConversation(strict, [{ role: 'system', content: 'a' }, ...TWO_TURNS], o),
    );
    expect(e.message).toBe(`train.jsonl:9: the chat template of ${strict.where}: no system turns`);
  });

  it('when the template writes a turn differently once later turns follow', () => {
    // the number of messages up front: no prompt render begins the whole conversation's text
    const counting = withConfig('configs/tokenizers/tiny', 'counting', {
      chat_template:
        "{{ messages | length }}{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}" +
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    });
    expect(dataError(() => encodeConversation(counting, TWO_TURNS, o)).problem).toBe(
      "the chat template's prompt for messages[1] (messages[:1] and the generation prompt) does not begin the conversation's text",
    );
  });

  it('whose reply tokenizes differently cut from its header (a reply opening with a newline)', () => {
    // assistant\n + \nThe…: whole, the two newlines are one pre-token and one token (ĊĊ), at
    // token 27 of the text (placeholders not yet expanded): 11 of the system turn, 3 of the user's
    // header, 3 + 6 of its content, <|im_end|> \n <|im_start|> assistant
    const messages: Message[] = [
      { role: 'user', content: '<image>What colour is the square?' },
      { role: 'assistant', content: '\nThe square is red.' },
    ];
    expect(dataError(() => encodeConversation(bpe, messages, o)).problem).toMatch(
      /^the text's tokens change when it is cut where the replies begin and end \(first at token 27\)/,
    );
  });
});

it('sft without a chat template is refused naming the tokenizer; pretrain takes it', () => {
  const plain = withConfig('configs/tokenizers/tiny', 'no-template', { eos_token: '<|im_end|>' });
  const o = { phase: 'sft', visualTokens: [4], where: 'train.jsonl:1' } as const;
  let error: unknown;
  try {
    encodeConversation(plain, TWO_TURNS, o);
  } catch (e) {
    error = e;
  }
  expect(error).toBeInstanceOf(UserError);
  expect(error).not.toBeInstanceOf(DataError);
  expect((error as Error).message).toMatch(
    new RegExp(`^${plain.where}: no chat template .*; sft needs one to find the assistant turns$`),
  );
  expect(encodeConversation(plain, TWO_TURNS, { ...o, phase: 'pretrain' }).tokens.length).toBe(24);
});

// The pieces encodeConversation tokenizes one by one, cut here by hand where ChatML's replies
// begin (after `<|im_start|>assistant\n`) and end (before `<|im_end|>`), give the whole text's
// tokens, on both fixtures and on texts that stress a pre-tokenizer: digits, punctuation runs,
// newlines inside a reply, non-ASCII letters, spaces.
describe('span-wise tokenization equals whole-text tokenization', () => {
  const replies = [
    'The square is red.',
    'There are 3 squares: 2 red, 1 blue!?',
    'Red.\nBlue.\n\nGreen',
    'Ünïcode ½ 日本語 — “quoted”',
    'It is blue ... really ',
    "It's the top-left one; isn't it?",
  ];
  for (const [name, tok] of [
    ['tiny', tiny],
    ['bpe', bpe],
  ] as const)
    it(name, () => {
      const template = new Template(tok.chatTemplate!);
      for (const reply of replies) {
        const messages = [
          { role: 'user', content: tok.image!.text + 'What colour is the square?' },
          { role: 'assistant', content: reply },
          { role: 'user', content: 'And?' },
          { role: 'assistant', content: reply },
        ];
        const whole = template.render({
          messages,
          add_generation_prompt: false,
          bos_token: tok.specialTokens.bos ?? '',
        });
        const cuts = whole.split(/(?<=<\|im_start\|>assistant\n)|(?=<\|im_end\|>)/);
        expect(cuts.filter((c) => c === reply)).toHaveLength(2);
        expect(cuts.flatMap((c) => tok.encode(c))).toEqual(tok.encode(whole));
        expect(() =>
          encodeConversation(
            tok,
            messages.map((m) => ({
              ...m,
              content: m.content.replace(tok.image!.text, '<image>'),
            })) as Message[],
            {
              phase: 'sft',
              visualTokens: [1],
              where: 'x',
            },
          ),
        ).not.toThrow();
      }
    });
});
