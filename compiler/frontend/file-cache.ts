// Parsed files kept by path while the file is unchanged (same size and modification time), for
// the loaders a search calls once per layout: lfc tune checks thousands of layouts, and each
// check would otherwise read and parse every preset, part and profile again. Each caller gets its
// own copy of the parsed value, so none can change another's. Failures are not kept: a file that
// does not parse is read again, and fails with the caller's own message.

import { statSync } from 'node:fs';

const parsed = new Map<string, { mtimeMs: number; size: number; value: unknown }>();

/**
 * `load()`'s value for `path`, parsed once while the file stays as it is. `key` tells apart two
 * values read from one file (default: the path).
 */
export function cachedParse<T>(path: string, load: () => T, key = path): T {
  const st = statSync(path, { throwIfNoEntry: false });
  const hit = st ? parsed.get(key) : undefined;
  if (st && hit && hit.mtimeMs === st.mtimeMs && hit.size === st.size)
    return structuredClone(hit.value) as T;
  const value = load();
  if (st) parsed.set(key, { mtimeMs: st.mtimeMs, size: st.size, value: structuredClone(value) });
  return value;
}
