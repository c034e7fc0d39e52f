// Errors printed as one line, never a stack trace: a UserError is the user's input to fix (exit
// code 2); an EnvironmentError is the machine's (a runtime not built, a package missing: exit 1).

import { readFileSync } from 'node:fs';

export class UserError extends Error {
  override readonly name = 'UserError';
  /** the message kept on one line whatever it quotes from the user's files (oneLine) */
  constructor(message: string) {
    super(oneLine(message));
  }
}

export class EnvironmentError extends Error {
  override readonly name = 'EnvironmentError';
}

/**
 * Prints the error that ends a command, as `lfc` and a rank process (runtime/rank-main.ts) do, and
 * returns the exit code: a UserError one line and 2, or the code it carries (a failed rank of a
 * launch: runtime/launch.ts RankFailure); an EnvironmentError, or the operating system refusing a
 * file or socket (a full disk, a missing permission: its message names the call and the path, and
 * a stack trace would add nothing), one line and 1; anything else, an internal error, its stack and 1.
 */
export function reportError(e: unknown, err: (text: string) => void): number {
  if (e instanceof UserError) {
    err(`lfc: error: ${e.message}\n`);
    return (e as UserError & { exitCode?: number }).exitCode ?? 2;
  }
  if (isSystemError(e) || e instanceof EnvironmentError) {
    err(`lfc: error: ${e.message}\n`);
    return 1;
  }
  err(`lfc: internal error: ${(e as Error).stack ?? String(e)}\n`);
  return 1;
}

function isSystemError(e: unknown): e is NodeJS.ErrnoException {
  const x = e as NodeJS.ErrnoException;
  return e instanceof Error && typeof x.code === 'string' && typeof x.syscall === 'string';
}

/**
 * Text from a user's file (a key, a name, a value) made safe for a one-line message: its line
 * breaks written as \\n.
 */
export function oneLine(text: string): string {
  return text.replace(/\r\n|\r|\n/g, '\\n');
}

/** Levenshtein distance, for "did you mean" suggestions. */
function distance(a: string, b: string): number {
  const dp = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    let prev = dp[0];
    dp[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const cur = dp[j];
      dp[j] = Math.min(dp[j] + 1, dp[j - 1] + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = cur;
    }
  }
  return dp[b.length];
}

/** The closest candidate by edit distance, ignoring case (ties: the first); undefined if none. */
export function closest(word: string, candidates: Iterable<string>): string | undefined {
  return closestWithDistance(word, candidates)[0];
}

function closestWithDistance(
  word: string,
  candidates: Iterable<string>,
): [string | undefined, number] {
  let best: string | undefined;
  let bestD = Infinity;
  for (const c of candidates) {
    const d = distance(word.toLowerCase(), c.toLowerCase());
    if (d < bestD) [best, bestD] = [c, d];
  }
  return [best, bestD];
}

/** The closest candidate, if it is close enough to be a plausible typo. */
export function nearest(word: string, candidates: Iterable<string>): string | undefined {
  const [best, d] = closestWithDistance(word, candidates);
  return best !== undefined && d <= Math.max(2, Math.floor(word.length / 3)) ? best : undefined;
}

export function didYouMean(word: string, candidates: Iterable<string>): string {
  const n = nearest(word, candidates);
  return n ? ` (did you mean '${n}'?)` : '';
}

/** Why a file cannot be read, for a one-line error: its path and the system's code. */
export function cannotRead(path: string, e: unknown): string {
  return `cannot read ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`;
}

/**
 * A text file parsed (JSON, YAML): an unreadable file or a parse error is a UserError naming the
 * file, with the parser's first message line.
 */
export function parseFile<T>(path: string, format: string, parse: (text: string) => T): T {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new UserError(cannotRead(path, e));
  }
  try {
    return parse(text);
  } catch (e) {
    throw new UserError(`${path}: malformed ${format}: ${(e as Error).message.split('\n')[0]}`);
  }
}
