// Mixed precision, as Megatron-LM's flags define it. Without --bf16 everything is f32 (Megatron's
// default, and what the PyTorch fixtures check exactly). With --bf16:
//   - activations and the compute copy of every parameter are bf16;
//   - parameter gradients are f32 (Megatron's main_grad, --accumulate-allreduce-grads-in-fp32,
//     on by default), written directly by the weight-gradient ops and summed across ranks in f32;
//     --grad-reduce-in-bf16 keeps them in bf16 instead;
//   - the optimizer keeps fp32 master weights and fp32 AdamW moments (sharded by the distributed
//     optimizer), and rounds the updated master weights into the bf16 parameters;
//   - norms, softmax, the loss and the MoE router compute in f32.
// --fp16 needs loss scaling, which lfc does not build: it is refused.

import type { DType } from '../../ir/dtype.js';
import { UserError } from '../errors.js';

export interface PrecisionFlags {
  /** --bf16 */
  readonly bf16?: boolean;
  /** --fp16 (refused) */
  readonly fp16?: boolean;
  /** --grad-reduce-in-bf16 */
  readonly gradReduceInBf16?: boolean;
  /** --accumulate-allreduce-grads-in-fp32 (Megatron's default with --bf16) */
  readonly accumulateAllreduceGradsInFp32?: boolean;
}

export interface Precision {
  /** element type of activations and parameters (their compute copy) */
  readonly compute: DType;
  /** element type of the parameters' gradients (main gradients) and their sums */
  readonly grad: DType;
}

export const FP32: Precision = { compute: 'f32', grad: 'f32' };

export function resolvePrecision(f: PrecisionFlags = {}): Precision {
  if (f.fp16)
    throw new UserError(
      '--fp16 is not built: fp16 training needs dynamic loss scaling, which lfc does not have; use --bf16',
    );
  if (f.gradReduceInBf16 && f.accumulateAllreduceGradsInFp32)
    throw new UserError(
      '--grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32 contradict each other; give one',
    );
  if (!f.bf16) {
    if (f.gradReduceInBf16) throw new UserError('--grad-reduce-in-bf16 needs --bf16');
    return FP32;
  }
  return { compute: 'bf16', grad: f.gradReduceInBf16 ? 'bf16' : 'f32' };
}

/** one line for the compile report */
export function describePrecision(p: Precision): string {
  if (p.compute === 'f32') return 'f32';
  return `${p.compute} activations and weights, ${p.grad} main gradients, f32 master weights and AdamW state`;
}
