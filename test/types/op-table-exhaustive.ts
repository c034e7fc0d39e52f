// Type-level check (run by `tsc`, part of `npm test`): the op table and the per-op rule tables
// are keyed by OpKind with `satisfies Record<OpKind, …>`, so an op kind without a record fails
// to compile. Here a kind added to the union without a table entry is rejected.
import { OP_TABLE, type OpInfo, type OpKind } from '../../ir/ops.js';

type WithNewOp = OpKind | 'new_op';

// @ts-expect-error: 'new_op' has no record in OP_TABLE
export const tableWithNewOp: Record<WithNewOp, OpInfo> = OP_TABLE;

// and the table as it stands is exhaustive
export const table: Record<OpKind, OpInfo> = OP_TABLE;

import { GRAD_RULES, type GradEntry } from '../../passes/grad-rules.js';
import { SHARDING_RULES, type ShardEntry } from '../../passes/sharding-rules.js';

// @ts-expect-error: 'new_op' has no gradient entry
export const gradsWithNewOp: Record<WithNewOp, GradEntry> = GRAD_RULES;
// @ts-expect-error: 'new_op' has no sharding entry
export const shardingWithNewOp: Record<WithNewOp, ShardEntry> = SHARDING_RULES;
