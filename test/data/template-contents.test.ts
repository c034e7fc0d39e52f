// writesContentsAsGiven (runtime/data/template-contents.ts): which chat templates write each
// content as given, so that chat.ts cuts a conversation from its shape alone without rendering
// it. Templates that do are taken; every other use of a content, or of a message whole, is
// refused. Then the same conversations through a template taken and through the same template
// with a content test added that changes nothing it writes (so refused, and rendered): the
// encodings are equal.
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { afterAll, describe, expect, it } from 'vitest';
import { encodeConversation } from '../../runtime/data/chat.js';
import type { Message } from '../../runtime/data/sample.js';
import { writesContentsAsGiven } from '../../runtime/data/template-contents.js';
import { loadTokenizer } from '../../runtime/data/tokenizer.js';

const chatml =
  "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/** a Qwen-VL-like template: a default system turn, contents as strings or lists of parts */
const qwenLike =
  "{% set images = namespace(n=0) %}{% for message in messages %}{% if loop.first and message.role != 'system' %}<|im_start|>system\nYou help.<|im_end|>\n{% endif %}" +
  '<|im_start|>{{ message.role }}\n{% if message.content is string %}{{ message.content }}<|im_end|>\n' +
  "{% else %}{% for part in message.content %}{% if part.type == 'image' %}{% set images.n = images.n + 1 %}<|image_pad|>{% else %}{{ part.text }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}" +
  '{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}';

const taken: [string, string][] = [
  ['ChatML', chatml],
  ['a Qwen-VL-like template (its list branch never runs for a string)', qwenLike],
  [
    'ChatML with ~ and a system turn read by index',
    "{% if messages[0]['role'] == 'system' %}[{{ messages[0]['content'] }}]{% endif %}{% for m in messages[1:] %}{{ m.role ~ ': ' ~ m.content }}{% endfor %}",
  ],
  [
    'a ternary writing a content',
    "{% for m in messages %}{{ m.content if m.role == 'user' else '> ' + m.content }}{{ eos_token }}{% endfor %}",
  ],
  [
    'the number of messages',
    '{{ messages | length }}{% for m in messages %}{{ m.content }}{% endfor %}',
  ],
  [
    'a content tested for being a string, negated',
    "{% for m in messages %}{% if m.content is not string %}{{ raise_exception('lists') }}{% endif %}{{ m.content }}{% endfor %}",
  ],
];

const refused: [string, string][] = [
  ['| trim', '{% for m in messages %}{{ m.content | trim }}{% endfor %}'],
  [
    "'</think>' in content",
    "{% for m in messages %}{% if '</think>' in m.content %}x{% endif %}{{ m.content }}{% endfor %}",
  ],
  [
    '.startswith',
    "{% for m in messages %}{% if m.content.startswith('<tool>') %}x{% endif %}{{ m.content }}{% endfor %}",
  ],
  [
    'a content tested for truth',
    '{% for m in messages %}{% if m.content %}{{ m.content }}{% endif %}{% endfor %}',
  ],
  [
    'a content set to a variable',
    '{% for m in messages %}{% set c = m.content %}{{ c }}{% endfor %}',
  ],
  [
    'a content passed to a macro',
    '{% macro w(x) %}{{ x }}{% endmacro %}{% for m in messages %}{{ w(m.content) }}{% endfor %}',
  ],
  [
    'a message passed to a macro',
    '{% macro w(x) %}{{ x.content }}{% endmacro %}{% for m in messages %}{{ w(m) }}{% endfor %}',
  ],
  ['a message as JSON', '{% for m in messages %}{{ m | tojson }}{% endfor %}'],
  ['a message printed', '{% for m in messages %}{{ m }}{% endfor %}'],
  ['messages printed', '{{ messages }}'],
  [".get('content')", "{% for m in messages %}{{ m.get('content') }}{% endfor %}"],
  [
    'another field of a message',
    '{% for m in messages %}{{ m.content }}{% if m.tool_calls is defined %}t{% endif %}{% endfor %}',
  ],
  [
    'messages filtered',
    "{% for m in messages | selectattr('role', 'equalto', 'user') %}{{ m.content }}{% endfor %}",
  ],
  [
    'loop.previtem',
    '{% for m in messages %}{{ m.content }}{% if not loop.first %}{{ loop.previtem }}{% endif %}{% endfor %}',
  ],
  [
    'a content in a set block',
    '{% for m in messages %}{% set b %}{{ m.content }}{% endset %}{{ b }}{% endfor %}',
  ],
  [
    'a loop over a content',
    '{% for m in messages %}{% for c in m.content %}{{ c }}{% endfor %}{% endfor %}',
  ],
];

describe('writesContentsAsGiven', () => {
  it.each(taken)('takes %s', (_, t) => expect(writesContentsAsGiven(new Template(t))).toBe(true));
  it.each(refused)('refuses %s', (_, t) =>
    expect(writesContentsAsGiven(new Template(t))).toBe(false),
  );
  it("takes the project's tokenizers' templates", () => {
    for (const dir of ['configs/tokenizers/tiny', 'test/fixtures/tokenizers/bpe-tiny']) {
      const config = JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8')) as {
        chat_template: string;
      };
      expect(writesContentsAsGiven(new Template(config.chat_template)), dir).toBe(true);
    }
  });
});

describe('a conversation cut from its shape alone, against one rendered', () => {
  const tmp = mkdtempSync(join(tmpdir(), 'lfc-template-contents-'));
  afterAll(() => rmSync(tmp, { recursive: true, force: true }));
  const withTemplate = (name: string, template: string) => {
    const d = join(tmp, name);
    cpSync('test/fixtures/tokenizers/bpe-tiny', d, { recursive: true });
    const config = JSON.parse(readFileSync(join(d, 'tokenizer_config.json'), 'utf8')) as Record<
      string,
      unknown
    >;
    writeFileSync(
      join(d, 'tokenizer_config.json'),
      JSON.stringify({ ...config, chat_template: template }),
    );
    return loadTokenizer(d);
  };
  const template = (
    JSON.parse(readFileSync('test/fixtures/tokenizers/bpe-tiny/tokenizer_config.json', 'utf8')) as {
      chat_template: string;
    }
  ).chat_template;
  const fast = withTemplate('fast', template);
  // a test of the first content that writes nothing whatever it finds: refused, so rendered
  const rendered = withTemplate(
    'rendered',
    `{% if 'zz' in messages[0]['content'] %}{% endif %}${template}`,
  );
  expect(writesContentsAsGiven(new Template(template))).toBe(true);

  it('gives the same tokens, targets and replies for 200 conversations of varied shapes', () => {
    const words = [
      'The',
      'square',
      'is',
      'red.',
      'What',
      'colour?',
      'a',
      'blue',
      'background',
      '!',
    ];
    let seed = 7;
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) >>> 0;
      return (seed >>> 8) % n;
    };
    const text = () =>
      Array.from({ length: 1 + rand(8) }, () => words[rand(words.length)]).join(
        rand(4) ? ' ' : '\n',
      );
    for (let k = 0; k < 200; k++) {
      const messages: Message[] = [];
      if (rand(3) === 0) messages.push({ role: 'system', content: text() });
      const turns = 1 + rand(3);
      let images = 0;
      for (let t = 0; t < turns; t++) {
        const image = rand(3) === 0;
        images += +image;
        messages.push({ role: 'user', content: (image ? '<image>' : '') + text() });
        messages.push({ role: 'assistant', content: text() });
      }
      const o = { phase: 'sft', visualTokens: Array(images).fill(4), where: `k${k}` } as const;
      expect(encodeConversation(fast, messages, o), `conversation ${k}`).toEqual(
        encodeConversation(rendered, messages, o),
      );
    }
  });
});
