// The stable text form of a graph: the golden-test format. parse(print(g)) prints the same text.
//
//   graph "tiny-vlm" {
//     sym S <= 128 "tokens of a microbatch"
//     input %tokens: i32[S] "token ids"
//     param @model.norm.weight: f32[128] role=param trainable=true module=text_decoder init=ones
//     %7: f32[S, 128] = rmsnorm(%6, @model.norm.weight) {eps=0.000001} scope=model.norm forward
//     output %loss
//   }

import { formatShape } from './shape.js';
import type { Graph, Node } from './graph.js';
import type { AttrValue, TensorType } from './types.js';

export function formatType(t: TensorType): string {
  return `${t.dtype}${t.space === 'host' ? '@host' : ''}${formatShape(t.shape)}`;
}

export function formatAttrValue(v: AttrValue): string {
  return JSON.stringify(v).replace(/,/g, ', ');
}

export function formatAttrs(attrs: Node['attrs']): string {
  const keys = Object.keys(attrs).sort();
  if (!keys.length) return '';
  return ` {${keys.map((k) => `${k}=${formatAttrValue(attrs[k])}`).join(', ')}}`;
}

export function formatNode(n: Node, isParam: (name: string) => boolean): string {
  const ref = (v: string) => `${isParam(v) ? '@' : '%'}${v}`;
  const outs = n.outputs.map((o) => `%${o.name}: ${formatType(o.type)}`).join(', ');
  const lhs = outs ? `${outs} = ` : '';
  return `${lhs}${n.op}(${n.inputs.map(ref).join(', ')})${formatAttrs(n.attrs)} scope=${n.scope || '-'} ${n.phase}`;
}

export function printGraph(g: Graph): string {
  const params = new Set(g.params.map((p) => p.name));
  const isParam = (n: string) => params.has(n);
  const lines = [`graph ${JSON.stringify(g.name)} {`];
  for (const s of g.symbols) {
    const expected = s.expected !== undefined ? ` ~ ${s.expected}` : '';
    lines.push(`  sym ${s.name} <= ${s.bound}${expected} ${JSON.stringify(s.doc)}`);
  }
  for (const i of g.inputs)
    lines.push(`  input %${i.name}: ${formatType(i.type)} ${JSON.stringify(i.doc)}`);
  for (const p of g.params) {
    lines.push(
      `  param @${p.name}: ${formatType(p.type)} role=${p.role} trainable=${p.trainable} ` +
        `module=${p.module} init=${p.init}${p.dist ? ` dist=${JSON.stringify(p.dist)}` : ''}`,
    );
  }
  for (const n of g.nodes) lines.push(`  ${formatNode(n, isParam)}`);
  for (const o of g.outputs)
    lines.push(`  output ${o.label} = ${isParam(o.value) ? '@' : '%'}${o.value}`);
  lines.push('}');
  return lines.join('\n') + '\n';
}
