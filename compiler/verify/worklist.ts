// A FIFO of slots (a rank's stream: rank × streams + stream), each queued at most once: the
// event-driven loop of the progress check (check-progress.ts) and the step simulator
// (compiler/sim/simulate.ts), which both step streams that may have become able to move.

export class Worklist {
  private readonly queue: Int32Array;
  private readonly queued: Uint8Array;
  private head = 0;
  private count = 0;

  constructor(private readonly size: number) {
    this.queue = new Int32Array(size);
    this.queued = new Uint8Array(size);
  }

  push(slot: number): void {
    if (this.queued[slot]) return;
    this.queued[slot] = 1;
    this.queue[(this.head + this.count++) % this.size] = slot;
  }

  /** Runs `step` on queued slots until none is left (`step` may push more). */
  drain(step: (slot: number) => void): void {
    while (this.count > 0) {
      const slot = this.queue[this.head];
      this.head = (this.head + 1) % this.size;
      this.count--;
      this.queued[slot] = 0;
      step(slot);
    }
  }
}
