// What a view of the app is: it owns one root element, draws the plan it is given, and marks
// the root `data-ready` once that plan is drawn (the browser tests wait for it).

import type { VizPlanSummary } from '../model.js';
import type { VizSource } from './source.js';

export interface ViewContext {
  readonly source: VizSource;
  readonly plans: readonly VizPlanSummary[];
}

export interface View {
  /** draws plan `plan` (an index into ctx.plans); resolves when it is drawn */
  show(plan: number): Promise<void>;
}

export type MountView = (root: HTMLElement, ctx: ViewContext) => View;

/** marks a view drawn: `data-ready` holds the plan index it shows */
export function markReady(root: HTMLElement, plan: number): void {
  root.dataset.ready = String(plan);
}

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  e.append(...children);
  return e;
}

export const SVG_NS = 'http://www.w3.org/2000/svg';

export function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number> = {},
): SVGElementTagNameMap[K] {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

/** 1536 → '1.5 KiB' */
export function formatBytes(b: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (Math.abs(b) >= 1024 && i < units.length - 1) {
    b /= 1024;
    i++;
  }
  return `${i === 0 ? b : b.toFixed(b >= 100 ? 0 : b >= 10 ? 1 : 2)} ${units[i]}`;
}

/** milliseconds, with a unit that fits */
export function formatMs(ms: number): string {
  if (ms >= 1000) return `${(ms / 1000).toFixed(ms >= 10_000 ? 1 : 2)} s`;
  if (ms >= 1) return `${ms.toFixed(ms >= 100 ? 0 : 2)} ms`;
  return `${(ms * 1000).toFixed(1)} µs`;
}
