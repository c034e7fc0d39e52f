// The IR's public surface.
export * from './dtype.js';
export * from './shape.js';
export * from './types.js';
export * from './ops.js';
export * from './graph.js';
export * from './printer.js';
export * from './parser.js';
export * from './json.js';
export * from './verify.js';
