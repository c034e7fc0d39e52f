// The unit the data path moves: one sample of a dataset as its file gives it (a JSONL line, or the
// files of one key in a WebDataset shard), before tokenization and image processing. The readers
// (jsonl.ts, webdataset.ts) make these; text.ts turns the messages into tokens, images.ts the
// images into pixels; packer.ts packs the results into microbatches.

import { oneLine, UserError } from '../../compiler/errors.js';

/** One turn of a conversation, roles as chat templates name them. */
export interface Message {
  readonly role: 'system' | 'user' | 'assistant';
  /** the text, with one `<image>` marker where each of the sample's images goes, in order */
  readonly content: string;
}

/** An image of a sample: where it comes from (for messages) and its encoded bytes (PNG, JPEG). */
export interface ImageSource {
  /** the path, or `shard.tar:member`, named in errors */
  readonly where: string;
  /** the file's bytes; throws a DataError naming `where` when it cannot be read */
  read(): Buffer;
}

export interface RawSample {
  /** `file.jsonl:LINE` or `shard.tar:KEY`, named in errors */
  readonly where: string;
  readonly messages: readonly Message[];
  readonly images: readonly ImageSource[];
}

/** The image marker of the datasets (LLaVA's): one per image, in the message text. */
export const IMAGE_MARKER = '<image>';

/**
 * A bad sample: its message names the file and line, or the tar member. The loader skips and
 * counts these, or stops with exit 2 under --strict-data; a bad dataset as a whole (a missing
 * file, a bad flag) is a plain UserError.
 */
export class DataError extends UserError {
  constructor(
    readonly where: string,
    readonly problem: string,
  ) {
    super(oneLine(`${where}: ${problem}`)); // a role, a file name from the record: one line still
  }
}
