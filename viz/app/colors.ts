// The app's colours, in one place so that every view and its legend agree. Categorical colours
// (Tableau 10, readable on white) for stages, streams, phases and parts of the model.

export const CATEGORICAL = [
  '#4e79a7',
  '#f28e2b',
  '#59a14f',
  '#e15759',
  '#76b7b2',
  '#edc948',
  '#b07aa1',
  '#ff9da7',
  '#9c755f',
  '#bab0ac',
] as const;

/** a colour per key, stable for the keys a view names first */
export class Palette {
  private readonly seen = new Map<string, string>();
  constructor(private readonly fixed: Readonly<Record<string, string>> = {}) {}
  of(key: string): string {
    if (key in this.fixed) return this.fixed[key];
    let c = this.seen.get(key);
    if (!c) this.seen.set(key, (c = CATEGORICAL[this.seen.size % CATEGORICAL.length]));
    return c;
  }
  /** the keys coloured so far, with their colours (a legend's rows) */
  entries(): [string, string][] {
    return [...Object.entries(this.fixed), ...this.seen].filter(
      ([k], i, all) => all.findIndex(([j]) => j === k) === i,
    );
  }
}

export const STREAM_COLORS: Readonly<Record<string, string>> = {
  compute: '#4e79a7',
  comm: '#f28e2b',
  copy: '#59a14f',
  p2p: '#b07aa1',
};

export const PART_COLORS: Readonly<Record<string, string>> = {
  encoder: '#59a14f',
  projector: '#edc948',
  decoder: '#4e79a7',
  step: '#9c755f',
};

export const PHASE_COLORS: Readonly<Record<string, string>> = {
  forward: '#4e79a7',
  backward: '#e15759',
  recompute: '#76b7b2',
  optimizer: '#9c755f',
};

/** collectives and p2p drawn apart from compute: their outline */
export const COLLECTIVE_STROKE = '#d62728';
/** waiting for peers, shaded apart from work */
export const WAIT_FILL = 'rgba(120,120,120,0.35)';
export const BUBBLE_FILL = 'rgba(225,87,89,0.12)';

/** a legend: one swatch per row */
export function legend(rows: readonly (readonly [string, string])[], title?: string): HTMLElement {
  const box = document.createElement('div');
  box.className = 'legend';
  if (title) {
    const t = document.createElement('span');
    t.className = 'legend-title';
    t.textContent = title;
    box.append(t);
  }
  for (const [label, color] of rows) {
    const item = document.createElement('span');
    item.className = 'legend-item';
    const sw = document.createElement('span');
    sw.className = 'swatch';
    sw.style.background = color;
    item.append(sw, document.createTextNode(label));
    box.append(item);
  }
  return box;
}
