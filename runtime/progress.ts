// A one-line progress bar on stderr (redrawn on a terminal; every ~5% of the run otherwise).

export interface Progress {
  update(step: number, text: string): void;
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
    done() {
      if (isTTY && last) write('\n');
    },
  };
}
