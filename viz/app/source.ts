// Where the app's data comes from: the local server `lfc viz DIR…` runs (/api), or the JSON a
// self-contained page (`lfc viz --output`) embeds. The views ask through VizSource only.

import type { VizEmbedded, VizGraph, VizMemory, VizPlanSummary, VizTimeline } from '../model.js';

export interface VizSource {
  plans(): Promise<readonly VizPlanSummary[]>;
  /** one program's folded dataflow (model.ts VizGraph) */
  graph(plan: number, program: string): Promise<VizGraph>;
  /** one rank's lanes of the step's timeline */
  timeline(plan: number, rank: number): Promise<VizTimeline>;
  /** one program's device bytes over the step */
  memory(plan: number, program: string): Promise<VizMemory>;
}

async function getJson<T>(url: string): Promise<T> {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: ${r.status} ${await r.text()}`);
  return (await r.json()) as T;
}

/** the local server's API (viz/server.ts) */
export function serverSource(base = ''): VizSource {
  const cache = new Map<string, Promise<unknown>>();
  const get = <T>(url: string): Promise<T> => {
    let p = cache.get(url);
    if (!p) cache.set(url, (p = getJson<T>(base + url)));
    return p as Promise<T>;
  };
  return {
    plans: () => get('/api/plans'),
    graph: (plan, program) => get(`/api/plans/${plan}/graph/${encodeURIComponent(program)}`),
    timeline: (plan, rank) => get(`/api/plans/${plan}/timeline/${rank}`),
    memory: (plan, program) => get(`/api/plans/${plan}/memory/${encodeURIComponent(program)}`),
  };
}

/** the data a self-contained page embeds; what it did not embed is named in the error */
export function embeddedSource(data: VizEmbedded): VizSource {
  const pick = <T>(table: Readonly<Record<string, T>>, key: string, what: string): Promise<T> =>
    key in table
      ? Promise.resolve(table[key])
      : Promise.reject(
          new Error(
            `this page does not hold the ${what} (lfc viz --output embeds the first rank of each program)`,
          ),
        );
  return {
    plans: async () => data.plans,
    graph: (plan, program) => pick(data.graphs, `${plan}/${program}`, `graph of ${program}`),
    timeline: (plan, rank) => pick(data.timelines, `${plan}/${rank}`, `timeline of rank ${rank}`),
    memory: (plan, program) => pick(data.memory, `${plan}/${program}`, `memory of ${program}`),
  };
}
