// Learning-rate schedules, Megatron's: linear warm-up from 0 over `warmup` steps, then constant
// or cosine decay to `minLr` at the last step. Steps count from 1.

export interface LrSchedule {
  readonly lr: number;
  readonly minLr: number;
  readonly warmupIters: number;
  readonly decayStyle: 'constant' | 'cosine';
  readonly totalIters: number;
}

export function lrAt(s: LrSchedule, step: number): number {
  if (s.warmupIters > 0 && step <= s.warmupIters) return (s.lr * step) / s.warmupIters;
  if (s.decayStyle === 'constant') return s.lr;
  const span = Math.max(1, s.totalIters - s.warmupIters);
  const progress = Math.min(1, (step - s.warmupIters) / span);
  return s.minLr + 0.5 * (s.lr - s.minLr) * (1 + Math.cos(Math.PI * progress));
}
