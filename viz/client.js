// lfc viz, in the browser: draws the page's embedded data (viz/data.ts) — the rank grid, each
// stage's layers, memory per program, the step's timeline (a lane per rank and stream, a box per
// instruction, coloured by phase; collectives and copies darker) and the programs by module.
(function () {
  const data = JSON.parse(document.getElementById('data').textContent);
  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const svgEl = (tag, attrs) => {
    const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    return e;
  };
  const PROGRAM_COLORS = [
    '#3b6fb6',
    '#c0504d',
    '#6b9b37',
    '#8064a2',
    '#d08a2e',
    '#2e9aa8',
    '#7f7f7f',
    '#b3477d',
  ];
  const PHASE_COLORS = {
    forward: '#5b8def',
    backward: '#f0a04b',
    optimizer: '#55a868',
    recompute: '#a878d8',
  };
  const programColor = (p) => PROGRAM_COLORS[Number(p.replace(/\D/g, '')) % PROGRAM_COLORS.length];

  $('title').textContent = data.title;
  $('summary').textContent = data.summary;

  // ranks, coloured by the program they run
  for (const r of data.ranks) {
    const box = el(
      'div',
      { class: 'rank', style: `background:${programColor(r.program)}` },
      String(r.rank),
    );
    box.title = `rank ${r.rank}: ${r.program}, stage ${r.stage}\n${r.groups}`;
    $('ranks').appendChild(box);
  }
  for (const s of data.stages)
    $('stages').appendChild(el('li', {}, `stage ${s.stage}: ${s.chunks.join('; ')}`));

  // memory per program
  // GiB, or MiB for a plan whose largest rank needs under 1 GiB (as lfc compile's table)
  const big = data.memory.some((m) => m.device >= 2 ** 30);
  const gib = (b) => (b / 2 ** (big ? 30 : 20)).toFixed(2);
  $('memory-unit').textContent = big ? 'GiB' : 'MiB';
  const mem = $('memory');
  const head = el('tr');
  for (const h of [
    'program',
    'ranks',
    'parameters',
    'gradients',
    'optimizer',
    'batch',
    'activations',
    'device total',
    'host',
  ])
    head.appendChild(el('th', {}, h));
  mem.appendChild(head);
  for (const m of data.memory) {
    const tr = el('tr');
    for (const v of [
      m.program,
      m.ranks,
      gib(m.parameters),
      gib(m.gradients),
      gib(m.optimizer),
      gib(m.batch),
      gib(m.activations),
      gib(m.device),
      gib(m.host),
    ])
      tr.appendChild(el('td', {}, String(v)));
    mem.appendChild(tr);
  }

  // the timeline
  const t = data.timeline;
  $('source').textContent = t.source;
  const LANE = 18;
  const LEFT = 150;
  const svg = svgEl('svg', { id: 'timeline', height: LANE * t.lanes.length + 24 });
  const draw = (width) => {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute('width', LEFT + width + 10);
    const x = (ms) => LEFT + (ms / Math.max(t.endMs, 1e-9)) * width;
    t.lanes.forEach((lane, i) => {
      const label = svgEl('text', { x: 4, y: i * LANE + 13, 'font-size': 11 });
      label.textContent = `rank ${lane.rank} ${lane.stream}`;
      svg.appendChild(label);
      svg.appendChild(
        svgEl('line', {
          x1: LEFT,
          x2: LEFT + width,
          y1: (i + 1) * LANE,
          y2: (i + 1) * LANE,
          stroke: '#eee',
        }),
      );
    });
    for (const [lane, start, dur, op, phase, mb, index] of t.events) {
      const name = t.ops[op];
      const ph = t.phases[phase];
      const comm = /all_|reduce|gather|scatter|broadcast|send|recv|offload|reload/.test(name);
      const rect = svgEl('rect', {
        x: x(start),
        y: lane * LANE + 2,
        width: Math.max(0.5, x(start + dur) - x(start)),
        height: LANE - 4,
        fill: PHASE_COLORS[ph] || '#999',
        'fill-opacity': comm ? 1 : 0.75,
        stroke: comm ? '#222' : 'none',
        'stroke-width': 0.5,
        class: 'event',
      });
      const tip = svgEl('title', {});
      tip.textContent = `${name} (${ph}, microbatch ${mb}, instruction ${index}): ${start.toFixed(3)} ms + ${dur.toFixed(3)} ms`;
      rect.appendChild(tip);
      svg.appendChild(rect);
    }
    for (let k = 0; k <= 10; k++) {
      const ms = (t.endMs * k) / 10;
      const tick = svgEl('text', { x: x(ms), y: LANE * t.lanes.length + 16, 'font-size': 10 });
      tick.textContent = ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`;
      svg.appendChild(tick);
    }
  };
  $('timeline-wrap').appendChild(svg);
  const zoom = $('zoom');
  zoom.addEventListener('input', () => draw(1000 * Number(zoom.value)));
  draw(1000);
  for (const [phase, color] of Object.entries(PHASE_COLORS)) {
    const s = el('span');
    s.appendChild(el('i', { style: `background:${color}` }));
    s.appendChild(document.createTextNode(phase));
    $('legend').appendChild(s);
  }

  // the programs by module
  const mods = $('modules');
  const mh = el('tr');
  for (const h of ['program', 'module', 'instructions', 'time (ms)'])
    mh.appendChild(el('th', {}, h));
  mods.appendChild(mh);
  for (const m of data.modules) {
    const tr = el('tr');
    for (const v of [m.program, m.module, m.instructions, m.ms.toFixed(3)])
      tr.appendChild(el('td', {}, String(v)));
    mods.appendChild(tr);
  }
  document.body.setAttribute('data-drawn', String(t.events.length));
})();
