// A Hugging Face tokenizer as the data path uses it: a tokenizer.json and what the files beside it
// say of it (Megatron's --tokenizer-model takes the same directory). What is read:
//   tokenizer.json         the model: WordLevel by word-level-tokenizer.ts (hand-made vocabularies,
//                          which @huggingface/tokenizers lacks), BPE (byte-level as Qwen's, or
//                          not), Unigram and WordPiece by @huggingface/tokenizers
//   tokenizer_config.json  bos/eos/pad/unk/sep/cls/mask tokens (a string or {content}), the chat
//                          template (a string, or the 'default' of a list), clean_up_tokenization_spaces
//   chat_template.jinja    the chat template, when tokenizer_config.json has none (newer HF saves)
//   chat_template.json     its chat_template, when neither has one (a processor's file)
// The three beside files are optional. Anything unreadable or malformed is a UserError naming the
// file and the key.

import { existsSync, readFileSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import { cannotRead, parseFile, UserError } from '../../compiler/errors.js';
import { wordLevelTokenizerOf } from './word-level-tokenizer.js';

type Json = Record<string, unknown>;

/** The special tokens tokenizer_config.json can name, as HF's special_tokens_map has them. */
export const SPECIAL_TOKEN_NAMES = ['bos', 'eos', 'unk', 'sep', 'pad', 'cls', 'mask'] as const;
export type SpecialTokenName = (typeof SPECIAL_TOKEN_NAMES)[number];

/** The image placeholder of a vocabulary: one id per image in the text, expanded later. */
export interface ImagePlaceholder {
  /** the token that stands for the image's visual tokens */
  readonly token: string;
  readonly id: number;
  /** the text that replaces a sample's `<image>` marker (the token, wrapped as the model wants) */
  readonly text: string;
}

export interface TextTokenizer {
  /** the tokenizer.json path, for messages */
  readonly where: string;
  /** one past the largest id, added tokens included */
  readonly vocabSize: number;
  /** the ids of a text: special tokens where the text writes them, none added */
  encode(text: string): number[];
  decode(ids: readonly number[]): string;
  /** the id of a token (an added one or one of the model's vocabulary), undefined when unknown */
  idOf(token: string): number | undefined;
  /** the Jinja chat template, when one is found */
  readonly chatTemplate?: string;
  /** the special tokens tokenizer_config.json names (each one a token of the vocabulary) */
  readonly specialTokens: Readonly<Partial<Record<SpecialTokenName, string>>>;
  /** the pad token's id, else 0 */
  readonly padId: number;
  /**
   * the image placeholder: Qwen's `<|image_pad|>` (its text wrapped as
   * `<|vision_start|><|image_pad|><|vision_end|>` when those exist), LLaVA's `<image>`; undefined
   * when the vocabulary has neither
   */
  readonly image?: ImagePlaceholder;
}

/** The core a model gives: what differs between the WordLevel reader and @huggingface/tokenizers. */
interface Model {
  encode(text: string): number[];
  decode(ids: readonly number[]): string;
  idOf(token: string): number | undefined;
  readonly vocabSize: number;
}

const MODEL_TYPES = ['BPE', 'Unigram', 'WordPiece', 'WordLevel'];

/** The tokenizer of `path`: a tokenizer.json, or a directory holding one. */
export function loadTokenizer(path: string): TextTokenizer {
  let isDir: boolean;
  try {
    isDir = statSync(path).isDirectory();
  } catch (e) {
    throw new UserError(cannotRead(path, e));
  }
  const where = isDir ? join(path, 'tokenizer.json') : path;
  // a file given by name is read with the files beside it all the same: HF's files travel together
  const dir = isDir ? path : dirname(path);
  const json = readObject(where);
  const configPath = join(dir, 'tokenizer_config.json');
  const config = existsSync(configPath) ? readObject(configPath) : {};

  const type = (json.model as Json | undefined)?.type;
  if (typeof type !== 'string' || !MODEL_TYPES.includes(type))
    throw new UserError(
      `${where}: model.type ${JSON.stringify(type)} is not supported (${MODEL_TYPES.join(', ')})`,
    );
  const specialTokens = specialTokensOf(config, configPath);
  const model =
    type === 'WordLevel'
      ? wordLevelTokenizerOf(json, where)
      : libraryModel(json, config, specialTokens, where);

  for (const [name, token] of Object.entries(specialTokens))
    if (model.idOf(token) === undefined)
      throw new UserError(
        `${configPath}: ${name}_token ${JSON.stringify(token)} is not a token of ${where}`,
      );
  const image = placeholderOf(model, where);
  const chatTemplate = chatTemplateOf(config, configPath, dir);
  return {
    where,
    vocabSize: model.vocabSize,
    encode: (text) => model.encode(text),
    decode: (ids) => model.decode(ids),
    idOf: (token) => model.idOf(token),
    ...(chatTemplate === undefined ? {} : { chatTemplate }),
    specialTokens,
    padId: specialTokens.pad === undefined ? 0 : model.idOf(specialTokens.pad)!,
    ...(image ? { image } : {}),
  };
}

function readObject(path: string): Json {
  const json = parseFile(path, 'JSON', (t) => JSON.parse(t) as unknown);
  if (typeof json !== 'object' || json === null || Array.isArray(json))
    throw new UserError(`${path}: not a JSON object`);
  return json as Json;
}

/** `bos_token` and the others: a string, an AddedToken's {content}, or null (none). */
function specialTokensOf(config: Json, path: string): Partial<Record<SpecialTokenName, string>> {
  const out: Partial<Record<SpecialTokenName, string>> = {};
  for (const name of SPECIAL_TOKEN_NAMES) {
    const v = config[`${name}_token`];
    if (v === undefined || v === null) continue;
    const content = typeof v === 'object' ? (v as Json).content : v;
    if (typeof content !== 'string' || content === '')
      throw new UserError(
        `${path}: ${name}_token is ${JSON.stringify(v)}, not a token (a string or {content})`,
      );
    out[name] = content;
  }
  return out;
}

/**
 * A BPE, Unigram or WordPiece tokenizer.json by @huggingface/tokenizers. It is given the config
 * with the special tokens as strings (Unigram reads eos_token), and decodes without HF's clean-up
 * of spaces before punctuation unless the config sets clean_up_tokenization_spaces (the library's
 * own default is on, and 'a .' would decode as 'a.': no round trip).
 */
function libraryModel(
  json: Json,
  config: Json,
  special: Partial<Record<SpecialTokenName, string>>,
  where: string,
): Model {
  // the library insists on these keys, which HF's files always have (null when unused)
  const full: Json = { added_tokens: [], ...json };
  for (const key of ['normalizer', 'pre_tokenizer', 'post_processor', 'decoder'])
    if (!(key in full)) full[key] = null;
  const libConfig: Json = { ...config };
  for (const name of SPECIAL_TOKEN_NAMES) libConfig[`${name}_token`] = special[name];
  const extra = config.additional_special_tokens;
  libConfig.additional_special_tokens = Array.isArray(extra)
    ? extra.map((t) => (typeof t === 'object' && t !== null ? (t as Json).content : t))
    : [];
  let lib: Tokenizer;
  try {
    lib = new Tokenizer(full, libConfig);
  } catch (e) {
    throw new UserError(`${where}: ${(e as Error).message.split('\n')[0]}`);
  }
  let vocabSize = 0;
  for (const id of lib.get_vocab(true).values()) vocabSize = Math.max(vocabSize, id + 1);
  const cleanUp = config.clean_up_tokenization_spaces === true;
  return {
    encode(text) {
      const { ids, tokens } = lib.encode(text, { add_special_tokens: false });
      const bad = ids.findIndex((id: number) => !Number.isInteger(id));
      if (bad >= 0)
        throw new UserError(
          `${where}: the piece ${JSON.stringify(tokens[bad])} is not in the vocabulary and the model has no unk_token`,
        );
      return ids;
    },
    decode(ids) {
      if (ids.length === 0) return '';
      for (const id of ids)
        if (lib.id_to_token(id) === undefined)
          throw new RangeError(`${where}: id ${id} is not in the vocabulary`);
      return lib.decode([...ids], {
        skip_special_tokens: false,
        clean_up_tokenization_spaces: cleanUp,
      });
    },
    idOf: (token) => lib.token_to_id(token),
    vocabSize,
  };
}

/**
 * Qwen-VL's placeholder, else LLaVA's. It must be an added token: only then is it one id wherever
 * a text writes it (a plain vocabulary entry `<image>` is cut into pieces, or read as part of a
 * word, when text touches it; two in a row show it).
 */
function placeholderOf(model: Model, where: string): ImagePlaceholder | undefined {
  const qwen = model.idOf('<|image_pad|>');
  const llava = model.idOf('<image>');
  let image: ImagePlaceholder | undefined;
  if (qwen !== undefined) {
    const wrapped =
      model.idOf('<|vision_start|>') !== undefined && model.idOf('<|vision_end|>') !== undefined;
    const text = wrapped ? '<|vision_start|><|image_pad|><|vision_end|>' : '<|image_pad|>';
    image = { token: '<|image_pad|>', id: qwen, text };
  } else if (llava !== undefined) image = { token: '<image>', id: llava, text: '<image>' };
  if (image && !sameIds(model.encode(image.token + image.token), [image.id, image.id]))
    throw new UserError(
      `${where}: ${image.token} is in the vocabulary but not in added_tokens, so a text cannot name it`,
    );
  return image;
}

function sameIds(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/** The chat template, in the order of the file header; parsed here so that a bad one fails now. */
function chatTemplateOf(config: Json, configPath: string, dir: string): string | undefined {
  let text: string | undefined;
  let from = configPath;
  const t = config.chat_template;
  if (typeof t === 'string') text = t;
  else if (t !== undefined && t !== null) text = defaultTemplate(t, configPath);
  else if (existsSync(join(dir, 'chat_template.jinja'))) {
    from = join(dir, 'chat_template.jinja');
    try {
      text = readFileSync(from, 'utf8');
    } catch (e) {
      throw new UserError(cannotRead(from, e));
    }
  } else if (existsSync(join(dir, 'chat_template.json'))) {
    from = join(dir, 'chat_template.json');
    const v = readObject(from).chat_template;
    if (typeof v !== 'string')
      throw new UserError(`${from}: chat_template must be a string, not ${JSON.stringify(v)}`);
    text = v;
  }
  if (text === undefined) return undefined;
  try {
    new Template(text);
  } catch (e) {
    throw new UserError(`${from}: chat_template: ${(e as Error).message.split('\n')[0]}`);
  }
  return text;
}

/** A list of named templates ([{name, template}], HF's) or a {name: template} map: 'default'. */
function defaultTemplate(t: unknown, path: string): string {
  const entries = Array.isArray(t)
    ? t.map((e) => [(e as Json)?.name, (e as Json)?.template])
    : typeof t === 'object' && t !== null
      ? Object.entries(t)
      : [];
  const found = entries.find(([name]) => name === 'default');
  if (typeof found?.[1] !== 'string')
    throw new UserError(
      `${path}: chat_template must be a string or a list of {name, template} with a 'default' one`,
    );
  return found[1] as string;
}
