// Errors printed as one line, never a stack trace: a UserError is the user's input to fix (exit
// code 2); an EnvironmentError is the machine's (a runtime not built, a package missing: exit 1).

export class UserError extends Error {
  override readonly name = 'UserError';
}

export class EnvironmentError extends Error {
  override readonly name = 'EnvironmentError';
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
