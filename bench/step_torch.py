#!/usr/bin/env python3
"""PyTorch baseline: time per training step of tiny-vlm / tiny-vlm-moe.

The models of shared/reference/tiny-vlm.md, written the way a PyTorch user
would write them (eager mode, float32, CPU):

- every projection is an nn.Linear (batched matmuls over the whole packed
  sequence);
- attention is an explicit masked softmax (torch 1.13 has no
  scaled_dot_product_attention), per microbatch over its packed sequence,
  with a block-diagonal causal mask built once per microbatch and shared by
  all layers (vision: one bidirectional per-image mask, also once per
  microbatch);
- the MoE layer is a loop over the experts: each expert's tokens are
  gathered with index_select, run through its SwiGLU, scaled by their
  routing weights and scattered back with index_add_;
- one step = zero_grad, then forward + backward of every microbatch in turn
  (gradient accumulation; each microbatch's loss is its CE sum divided by
  the global loss-token count, plus aux_coef * its aux term / number of
  microbatches, so the sum over microbatches is the loss of tiny-vlm.md),
  then clip_grad_norm_(1.0) and torch.optim.AdamW (two groups: wd 0.1 on
  params with >= 2 dims, 0 otherwise; lr 1e-3, betas (0.9, 0.95), eps 1e-8).

The math is that of test/reference/tiny_vlm.py; what differs is only what a
user would do differently for speed: RoPE tables in float32 from an
inv_freq buffer (the reference computes them in float64), top-k through
torch.topk (the reference uses a stable sort to pin ties to the lower
expert index; the fixtures have no ties), no routing-margin bookkeeping.

Usage:
    /usr/bin/python3 bench/step_torch.py --model tiny-vlm \\
        --weights test/fixtures/tiny-vlm/weights.safetensors \\
        --batch test/fixtures/tiny-vlm/batch.safetensors \\
        --steps 20 --warmup 3 --threads 1

prints one JSON line: model, threads, steps, median_ms, min_ms, mean_ms,
step_ms (every timed step), loss_first (loss of the very first step run,
warm-up included), loss_last (loss of the last timed step), and one extra
keys, median_cpu_ms (median process CPU time per step, all threads) and
blas_threads (the OpenBLAS pool size, capped to --threads as well: Debian's
torch 1.13 does its matmuls in a pthreads OpenBLAS that
torch.set_num_threads does not reach), and omp_wait_policy (PASSIVE
unless the environment sets it, see below the imports).

    /usr/bin/python3 bench/step_torch.py --config CONFIG.json --weights ... --batch ...

takes the model's sizes from a JSON object of Config fields instead of a
tiny preset (bench/mfu.ts writes one for vlm-moe-150m).

    ... --check-loss

runs one step only and prints one JSON line with its loss, ce_loss,
aux_loss, loss_tokens and grad_norm (before clipping). If a step.json sits
next to the weights file (as in test/fixtures/<model>/), the loss and
grad_norm are compared with it (relative tolerance --rtol, default 1e-5);
the exit status is 1 on a mismatch.
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from typing import List

# libgomp reads this when torch loads it, so it has to be set before the
# import. Debian's torch 1.13 has two thread pools: torch's OpenMP pool and
# the pthreads OpenBLAS pool that runs its matmuls. With the default
# (active) policy, idle OpenMP workers spin and take the cores away from the
# OpenBLAS workers. At --threads 2 on 2 cores that makes a step 2-2.5 times
# slower than at 1 thread. PASSIVE avoids this. An OMP_WAIT_POLICY already
# in the environment is kept.
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# The configuration, the safetensors reader and the pieces a user would write no differently
# (norm, patch embedding and patch order, vision attention, masked attention, rotate_half) are
# the reference's (test/reference/tiny_vlm.py); the rest is written the way a user would write
# it for speed.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'test', 'reference'))
from tiny_vlm import (  # noqa: E402,F401
    CONFIGS,
    PLACEHOLDER,
    Config,
    PatchEmbed,
    RMSNorm,
    VisionAttention,
    load_safetensors,
    masked_attention as attention,
    patchify,
    rotate_half,
)


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


# ---- vision --------------------------------------------------------------


class VisionMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc1 = nn.Linear(cfg.v_hidden, cfg.v_ffn)
        self.fc2 = nn.Linear(cfg.v_ffn, cfg.v_hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate='tanh'))


class VisionBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.v_hidden, eps=cfg.eps)
        self.attn = VisionAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.v_hidden, eps=cfg.eps)
        self.mlp = VisionMLP(cfg)

    def forward(self, x, allowed):
        x = x + self.attn(self.norm1(x), allowed)
        return x + self.mlp(self.norm2(x))


class Merger(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        m = cfg.merge * cfg.merge
        self.norm = nn.LayerNorm(cfg.v_hidden, eps=cfg.eps)
        self.fc1 = nn.Linear(m * cfg.v_hidden, m * cfg.v_hidden)
        self.fc2 = nn.Linear(m * cfg.v_hidden, cfg.hidden)
        self.m = m

    def forward(self, x):
        x = self.norm(x).reshape(-1, self.m * x.shape[-1])  # runs of 4 patches
        return self.fc2(F.gelu(self.fc1(x), approximate='tanh'))


class VisionModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        n = cfg.max_side // cfg.patch
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed_row = nn.Parameter(torch.zeros(n, cfg.v_hidden))
        self.pos_embed_col = nn.Parameter(torch.zeros(n, cfg.v_hidden))
        self.blocks = nn.ModuleList([VisionBlock(cfg) for _ in range(cfg.v_layers)])
        self.merger = Merger(cfg)

    def forward(self, images):
        """All images of a microbatch, encoded together -> [sum HW/64, Hd]."""
        cfg = self.cfg
        patches, rows, cols, image_id = [], [], [], []
        for idx, img in enumerate(images):
            p, r, c = patchify(img, cfg.patch, cfg.merge)
            patches.append(p)
            rows.append(r)
            cols.append(c)
            image_id.append(torch.full((p.shape[0],), idx, dtype=torch.long))
        rows, cols, image_id = torch.cat(rows), torch.cat(cols), torch.cat(image_id)
        x = self.patch_embed.proj(torch.cat(patches))
        x = x + self.pos_embed_row[rows] + self.pos_embed_col[cols]
        allowed = image_id[:, None] == image_id[None, :]  # once per microbatch
        for blk in self.blocks:
            x = blk(x, allowed)
        return self.merger(x)


# ---- decoder -------------------------------------------------------------


class SelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.heads * d, cfg.hidden, bias=False)
        self.q_norm = RMSNorm(d, cfg.eps)
        self.k_norm = RMSNorm(d, cfg.eps)

    def forward(self, x, cos, sin, allowed):
        cfg = self.cfg
        T, d = x.shape[0], cfg.head_dim
        q = self.q_norm(self.q_proj(x).view(T, cfg.heads, d)).transpose(0, 1)
        k = self.k_norm(self.k_proj(x).view(T, cfg.kv_heads, d)).transpose(0, 1)
        v = self.v_proj(x).view(T, cfg.kv_heads, d).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        g = cfg.heads // cfg.kv_heads  # KV head h serves query heads h*g .. h*g+g-1
        k = k.repeat_interleave(g, dim=0)
        v = v.repeat_interleave(g, dim=0)
        o = attention(q, k, v, allowed)
        return self.o_proj(o.transpose(0, 1).reshape(T, cfg.heads * d))


class SwiGLU(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.experts = nn.ModuleList([SwiGLU(cfg.hidden, cfg.expert_ffn)
                                      for _ in range(cfg.experts)])

    def forward(self, x, nonpad):
        E, k = self.cfg.experts, self.cfg.top_k
        probs = torch.softmax(self.gate(x), dim=-1)  # [T, E], full softmax
        top_p, chosen = torch.topk(probs, k, dim=-1)  # [T, k]
        weights = top_p / top_p.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(E):
            tok, slot = torch.where(chosen == e)
            if tok.numel() == 0:
                continue
            y = self.experts[e](x.index_select(0, tok)) * weights[tok, slot].unsqueeze(-1)
            out.index_add_(0, tok, y)
        # load balancing over the non-padding tokens of the microbatch
        counts = torch.bincount(chosen[nonpad].reshape(-1), minlength=E).to(x.dtype)
        f = counts / counts.sum()  # fraction of top-k assignments, no gradient
        P = probs[nonpad].mean(0)
        return out, E * (f * P).sum()


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.self_attn = SelfAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.moe = cfg.experts > 0
        self.mlp = MoE(cfg) if self.moe else SwiGLU(cfg.hidden, cfg.ffn)

    def forward(self, x, cos, sin, allowed, nonpad):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, allowed)
        h = self.post_attention_layernorm(x)
        if self.moe:
            y, aux = self.mlp(h, nonpad)
            return x + y, aux
        return x + self.mlp(h), None


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.layers)])
        self.norm = RMSNorm(cfg.hidden, cfg.eps)


class TinyVLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.visual = VisionModel(cfg)
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        d = cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer('inv_freq', inv_freq, persistent=False)

    def forward(self, mb):
        """One packed microbatch -> (logits [S, V], sum of MoE aux or None)."""
        tokens, segments = mb['tokens'], mb['segments']
        x = self.model.embed_tokens(tokens)
        if mb['images']:
            vis = self.visual(mb['images'])
            x = x.index_copy(0, mb['placeholder_idx'], vis)  # in order
        ang = mb['positions'].float()[:, None] * self.inv_freq[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        cos, sin = ang.cos(), ang.sin()
        # block-diagonal causal mask, once per microbatch; padding sees itself
        T = tokens.shape[0]
        idx = torch.arange(T)
        allowed = ((segments[:, None] == segments[None, :]) & (idx[None, :] <= idx[:, None])
                   & (segments >= 0)[:, None]) | torch.eye(T, dtype=torch.bool)
        nonpad = segments >= 0
        aux_total = None
        for layer in self.model.layers:
            x, aux = layer(x, cos, sin, allowed, nonpad)
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
        return self.lm_head(self.model.norm(x)), aux_total


# --------------------------------------------------------------------------
# Data, optimizer, step
# --------------------------------------------------------------------------


def load_batch(path) -> List[dict]:
    """Exchange format -> list of microbatches (the "data loader": dtype
    conversions happen here, outside the timed step)."""
    t = load_safetensors(path)
    n_mb = 1 + max(int(name.split('.')[0][2:]) for name in t)
    batch = []
    for j in range(n_mb):
        imgs = sorted(((int(n.split('.image')[1]), v) for n, v in t.items()
                       if n.startswith(f'mb{j}.image')), key=lambda kv: kv[0])
        tokens = t[f'mb{j}.tokens'].long()
        batch.append({
            'tokens': tokens,
            'labels': t[f'mb{j}.labels'].long(),
            'loss_mask': t[f'mb{j}.loss_mask'].bool(),
            'positions': t[f'mb{j}.positions'].long(),
            'segments': t[f'mb{j}.segments'].long(),
            'images': [v.float() for _, v in imgs],
            'placeholder_idx': torch.nonzero(tokens == PLACEHOLDER, as_tuple=True)[0],
        })
    return batch


def build(cfg, weights_path):
    model_name = cfg.name
    model = TinyVLM(cfg)
    w = load_safetensors(weights_path)
    missing, unexpected = model.load_state_dict(w, strict=False)
    if missing or unexpected:
        raise SystemExit(f'weights do not match {model_name}: missing {missing[:5]}, '
                         f'unexpected {unexpected[:5]}')
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': 0.1},
                             {'params': no_decay, 'weight_decay': 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    return model, opt


def train_step(model, opt, batch):
    """zero_grad, forward+backward per microbatch, clip, AdamW.
    Returns (loss, ce_loss, aux_loss, loss_tokens, grad_norm) as floats."""
    cfg = model.cfg
    opt.zero_grad(set_to_none=True)
    n_tok = sum(int(mb['loss_mask'].sum()) for mb in batch)
    if n_tok == 0:
        raise ValueError('global batch has no loss token')
    ce_total, aux_total = 0.0, 0.0
    for mb in batch:
        logits, aux = model(mb)
        m = mb['loss_mask']
        ce = F.cross_entropy(logits[m], mb['labels'][m], reduction='sum') / n_tok
        loss = ce
        if aux is not None:
            aux = cfg.aux_coef * aux / len(batch)
            loss = loss + aux
            aux_total += aux.item()
        loss.backward()
        ce_total += ce.item()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return ce_total + aux_total, ce_total, aux_total, n_tok, float(gn)


def set_blas_threads(n):
    """torch.set_num_threads does not reach a pthreads OpenBLAS (Debian's
    torch 1.13 does its matmuls there, BLAS_INFO=generic): that pool keeps
    one thread per core. Cap it too, so that --threads T means T threads.
    Returns the OpenBLAS thread count, or None without OpenBLAS."""
    try:
        with open('/proc/self/maps') as f:
            paths = {line.split()[-1] for line in f if 'openblas' in line.lower()}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_set_num_threads(n)
            return lib.openblas_get_num_threads()
        except (OSError, AttributeError):
            continue
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--model', choices=sorted(CONFIGS),
                    help='a tiny model of test/reference/tiny_vlm.py (or give --config)')
    ap.add_argument('--config',
                    help='instead of --model: a JSON file of Config fields (test/reference/'
                         'tiny_vlm.py), the same architecture at other sizes (bench/mfu.ts)')
    ap.add_argument('--weights', required=True)
    ap.add_argument('--batch', required=True)
    ap.add_argument('--steps', type=int, default=10)
    ap.add_argument('--warmup', type=int, default=2)
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--check-loss', action='store_true',
                    help='run one step, print its loss (and compare with step.json '
                         'beside the weights if there is one)')
    ap.add_argument('--rtol', type=float, default=1e-5)
    args = ap.parse_args()
    if (args.model is None) == (args.config is None):
        ap.error('give one of --model and --config')
    if args.config is not None:
        with open(args.config) as f:
            cfg = Config(**json.load(f))
        args.model = cfg.name
    else:
        cfg = CONFIGS[args.model]

    torch.set_num_threads(args.threads)
    blas_threads = set_blas_threads(args.threads)
    torch.manual_seed(0)
    model, opt = build(cfg, args.weights)
    batch = load_batch(args.batch)

    if args.check_loss:
        loss, ce, aux, n_tok, gn = train_step(model, opt, batch)
        out = {'model': args.model, 'threads': args.threads, 'loss': loss, 'ce_loss': ce,
               'aux_loss': aux, 'loss_tokens': n_tok, 'grad_norm': gn}
        ref_path = os.path.join(os.path.dirname(os.path.abspath(args.weights)), 'step.json')
        ok = True
        if os.path.exists(ref_path):
            with open(ref_path) as f:
                ref = json.load(f)
            out['reference'] = ref_path
            for key, got in (('loss', loss), ('grad_norm', gn)):
                if key in ref:
                    rel = abs(got - ref[key]) / max(abs(ref[key]), 1e-30)
                    out[f'ref_{key}'] = ref[key]
                    out[f'rel_err_{key}'] = rel
                    ok &= rel <= args.rtol
            if 'loss_tokens' in ref:
                ok &= ref['loss_tokens'] == n_tok
            out['ok'] = ok
        print(json.dumps(out))
        sys.exit(0 if ok else 1)

    losses, times, cpu_times = [], [], []
    for i in range(args.warmup + args.steps):
        c0 = time.process_time()
        t0 = time.perf_counter()
        loss = train_step(model, opt, batch)[0]
        t1 = time.perf_counter()
        c1 = time.process_time()
        losses.append(loss)
        if i >= args.warmup:
            times.append((t1 - t0) * 1e3)
            cpu_times.append((c1 - c0) * 1e3)
    out = {
        'model': args.model,
        'threads': args.threads,
        'steps': args.steps,
        'median_ms': statistics.median(times) if times else None,
        'min_ms': min(times) if times else None,
        'mean_ms': statistics.fmean(times) if times else None,
        'step_ms': [round(t, 4) for t in times],
        'loss_first': losses[0] if losses else None,
        'loss_last': losses[-1] if losses else None,
        # extra: CPU time of this process per step (all its threads), less
        # sensitive than wall time to other jobs on a shared host
        'median_cpu_ms': statistics.median(cpu_times) if cpu_times else None,
        'blas_threads': blas_threads,  # extra: OpenBLAS pool size (None: no OpenBLAS)
        'omp_wait_policy': os.environ.get('OMP_WAIT_POLICY'),  # extra
    }
    print(json.dumps(out))


if __name__ == '__main__':
    main()
