// Tensor types and attributes shared by the op table and the graph.

import { DTYPE_BYTES, type DType } from './dtype.js';
import { numel, type Shape } from './shape.js';

export type MemorySpace = 'device' | 'host';

export interface TensorType {
  readonly dtype: DType;
  readonly shape: Shape;
  /** where the value lives; device unless an offload put it on the host */
  readonly space?: MemorySpace;
}

export type AttrValue = number | string | boolean | readonly number[] | readonly string[];
export type Attrs = Readonly<Record<string, AttrValue>>;

export function tensorBytes(t: TensorType, sizes: (sym: string) => number): number {
  return numel(t.shape, sizes) * DTYPE_BYTES[t.dtype];
}
