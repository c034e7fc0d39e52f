// JSON form of a graph: the same data as the in-memory graph, with a format tag and version.

import { parseGraph, ParseError } from './parser.js';
import { printGraph } from './printer.js';
import type { Graph } from './graph.js';

export const IR_JSON_FORMAT = 'lfc-ir';
export const IR_JSON_VERSION = 1;

export function graphToJSON(g: Graph): string {
  return JSON.stringify({ format: IR_JSON_FORMAT, version: IR_JSON_VERSION, graph: g });
}

/**
 * Reads a graph from JSON. Structure is checked by a round trip through the text form's
 * parser (which validates every field); semantic checks are the verifier's job.
 */
export function graphFromJSON(text: string): Graph {
  let doc: { format?: unknown; version?: unknown; graph?: unknown };
  try {
    doc = JSON.parse(text) as typeof doc;
  } catch (e) {
    throw new ParseError(`not JSON: ${(e as Error).message}`);
  }
  if (doc.format !== IR_JSON_FORMAT)
    throw new ParseError(`not an lfc IR file (format ${JSON.stringify(doc.format)})`);
  if (doc.version !== IR_JSON_VERSION) {
    throw new ParseError(
      `IR version ${JSON.stringify(doc.version)}; this lfc reads version ${IR_JSON_VERSION}`,
    );
  }
  const g = doc.graph as Graph;
  try {
    return parseGraph(printGraph(g));
  } catch (e) {
    throw new ParseError(`malformed graph: ${(e as Error).message}`);
  }
}
