// A one-line progress bar on stderr (redrawn on a terminal; every ~5% of the run otherwise), and
// the line a training step shows in it.

import type { EvalMetrics, StepMetrics } from './metrics.js';

export interface Progress {
  update(step: number, text: string): void;
  /** a line of its own above the bar (an evaluation's figures) */
  note(text: string): void;
  done(): void;
}

export function progressBar(
  total: number,
  write: (s: string) => void,
  isTTY: boolean,
  first = 1,
): Progress {
  const width = 24;
  const every = Math.max(1, Math.round(total / 20));
  let last = '';
  return {
    update(step, text) {
      const frac = Math.min(1, step / total);
      const filled = Math.round(frac * width);
      const bar = `[${'='.repeat(Math.max(0, filled - 1))}${filled ? '>' : ''}${' '.repeat(width - filled)}]`;
      last = `step ${String(step).padStart(String(total).length)}/${total} ${bar} ${text}`;
      if (isTTY) write(`\r\x1b[2K${last}`);
      else if (step === first || step % every === 0 || step === total) write(`${last}\n`);
    },
    note(text) {
      if (isTTY) write(`\r\x1b[2K${text}\n${last}`);
      else write(`${text}\n`);
    },
    done() {
      if (isTTY && last) write('\n');
    },
  };
}

/** A step's figures as the progress line shows them: `loss 2.3026 caption 2.301 | 1.2k tok/s | 40 ms`. */
export function describeStep(m: StepMetrics): string {
  const caption = m.captionLoss === null ? '' : ` caption ${m.captionLoss.toFixed(3)}`;
  const aux = m.auxLoss ? ` aux ${m.auxLoss.toFixed(4)}` : '';
  return `loss ${m.loss.toFixed(4)}${caption}${aux} | ${(m.tokensPerSecond / 1000).toFixed(1)}k tok/s | ${m.stepMs.toFixed(0)} ms`;
}

/** An evaluation's line: `validation after step 20: loss 1.2345 caption 1.234 (10 batches)`. */
export function describeEval(e: EvalMetrics): string {
  const caption = e.captionLoss === null ? '' : ` caption ${e.captionLoss.toFixed(3)}`;
  return `validation after step ${e.step}: loss ${e.loss.toFixed(4)}${caption} (${e.batches} batches, ${e.lossTokens} loss tokens)`;
}
