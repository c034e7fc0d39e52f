// Writes the C++ view of the plan schema (see compiler/plan/native-schema.ts).
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { NATIVE_SCHEMA_PATH, nativeSchemaHeader } from '../compiler/plan/native-schema.js';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const out = join(root, NATIVE_SCHEMA_PATH);
mkdirSync(dirname(out), { recursive: true });
writeFileSync(out, nativeSchemaHeader());
console.log(`wrote ${NATIVE_SCHEMA_PATH}`);
