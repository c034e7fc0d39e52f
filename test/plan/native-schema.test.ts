// The C++ view of the schema is generated from the TypeScript declarations and committed; this
// fails when they drift (run `npm run gen:native`).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { NATIVE_SCHEMA_PATH, nativeSchemaHeader } from '../../compiler/plan/native-schema.js';
import { projectRoot } from '../../compiler/paths.js';
import { OP_KINDS } from '../../ir/ops.js';

describe('native schema', () => {
  it('the committed header is what the generator writes', () => {
    expect(readFileSync(join(projectRoot(), NATIVE_SCHEMA_PATH), 'utf8')).toBe(
      nativeSchemaHeader(),
    );
  });
  it('lists every op kind in table order', () => {
    const text = nativeSchemaHeader();
    const names = /kOpNames\[\] = \{([^}]*)\}/
      .exec(text)![1]
      .split(',')
      .map((s) => s.trim().replace(/"/g, ''));
    expect(names).toEqual([...OP_KINDS]);
  });
});
