// Which part of the model an instruction belongs to, from its scope: the vision encoder, the
// projector (the merger that maps visual tokens into the decoder's width), the decoder, or the
// step (gradient sums and the optimizer). The graph view colours by it, the timeline's phases of
// full separation are windows of it.

import type { PlanInstruction } from '../../compiler/plan/format.js';
import type { VizNode } from '../model.js';

export function partOf(x: Pick<PlanInstruction, 'scope' | 'phase'>): VizNode['part'] {
  const s = x.scope;
  if (x.phase === 'optimizer' || s.startsWith('gradient_sync') || s.startsWith('optimizer'))
    return 'step';
  if (/(^|\.)(merger|deepstack_merger_list|projector|multi_modal_projector)(\.|$)/.test(s))
    return 'projector';
  if (/^(visual|vision|vit|image_encoder|encoder_handoff)(\.|$)/.test(s)) return 'encoder';
  return 'decoder';
}
