// The printed forward graphs of the tiny presets, as golden text.
import { describe, it } from 'vitest';
import { printGraph } from '../../ir/printer.js';
import { expectGolden } from '../golden.js';
import { presetGraph } from '../helpers.js';

describe('forward graph goldens', () => {
  it.each(['tiny-vlm', 'tiny-vlm-moe'])('%s', (name) => {
    expectGolden(`${name}.forward.ir`, printGraph(presetGraph(name)));
  });
});
