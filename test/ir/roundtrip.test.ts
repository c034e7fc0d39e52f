// The text form and JSON are faithful: print → parse → print is a fixed point and the JSON
// round trip gives back the same graph, for every preset's forward graph.
import { describe, expect, it } from 'vitest';
import { graphFromJSON, graphToJSON, parseGraph, printGraph, verifyGraph } from '../../ir/index.js';
import { PRESETS, presetGraph } from '../helpers.js';

describe.each(PRESETS)('%s', (name) => {
  it('verifies', () => {
    expect(verifyGraph(presetGraph(name))).toEqual([]);
  });
  it('print → parse → print is a fixed point', () => {
    const text = printGraph(presetGraph(name));
    const reparsed = parseGraph(text);
    expect(printGraph(reparsed)).toBe(text);
    expect(reparsed).toEqual(presetGraph(name));
  });
  it('JSON round trip gives the same graph', () => {
    const g = presetGraph(name);
    const back = graphFromJSON(graphToJSON(g));
    expect(back).toEqual(g);
    expect(graphToJSON(back)).toBe(graphToJSON(g));
  });
});

describe('parser and JSON errors name the problem', () => {
  it('an unknown op names the line', () => {
    const text = printGraph(presetGraph('tiny-vlm')).replace('= gelu(', '= gelu2(');
    expect(() => parseGraph(text)).toThrow(/line \d+: unknown op 'gelu2'/);
  });
  it('a bad dtype names the line', () => {
    const text = printGraph(presetGraph('tiny-vlm')).replace(
      'input %tokens: i32',
      'input %tokens: i33',
    );
    expect(() => parseGraph(text)).toThrow(/line \d+: .*unknown dtype 'i33'|line \d+: cannot read/);
  });
  it('a missing brace is reported', () => {
    const text = printGraph(presetGraph('tiny-vlm')).replace(/}\n$/, '');
    expect(() => parseGraph(text)).toThrow(/missing closing brace/);
  });
  it('JSON of another version is refused', () => {
    const doc = JSON.parse(graphToJSON(presetGraph('tiny-vlm')));
    doc.version = 99;
    expect(() => graphFromJSON(JSON.stringify(doc))).toThrow(
      /IR version 99; this lfc reads version 1/,
    );
  });
  it('JSON that is not an IR file is refused', () => {
    expect(() => graphFromJSON('{"hello": 1}')).toThrow(/not an lfc IR file/);
    expect(() => graphFromJSON('{')).toThrow(/not JSON/);
  });
});
