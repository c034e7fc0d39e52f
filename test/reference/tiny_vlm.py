#!/usr/bin/env python3
"""Independent PyTorch reference for the tiny models of lfc.

Written from `shared/reference/tiny-vlm.md` alone (not from the compiler's
sources). It builds `tiny-vlm` (dense decoder) and `tiny-vlm-moe` (MoE
decoder) as plain nn.Modules whose parameter names are the checkpoint names,
generates a seeded synthetic global batch, runs three AdamW training steps on
it and writes the step exchange files:

    OUT/<model>/weights.safetensors      parameters before step 1
    OUT/<model>/batch.safetensors        the global batch (3 microbatches)
    OUT/<model>/grads.safetensors        gradients at step 1, before clipping
    OUT/<model>/params_step3.safetensors parameters after 3 steps
    OUT/<model>/step.json                loss figures and optimizer settings

Usage (torch 1.13, CPU; everything in float32):

    /usr/bin/python3 test/reference/tiny_vlm.py --out test/fixtures
    /usr/bin/python3 test/reference/tiny_vlm.py --out test/fixtures --check

`--check` additionally runs the self-checks: finite differences in float64,
bit-exact read-back of every written safetensors file, and a hand-computed
AdamW update.
"""

import argparse
import json
import math
import os
import random
import struct
import sys
import zlib
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

# --------------------------------------------------------------------------
# Configuration (the "Sizes" table of tiny-vlm.md)
# --------------------------------------------------------------------------


@dataclass
class Config:
    name: str
    patch: int = 4
    merge: int = 2  # 2x2 spatial merge
    v_hidden: int = 64
    v_heads: int = 4
    v_ffn: int = 256
    v_layers: int = 2
    max_side: int = 32  # pixels -> 8 patches per side
    hidden: int = 128
    layers: int = 4
    heads: int = 8
    kv_heads: int = 4
    head_dim: int = 16
    ffn: int = 384  # dense only
    experts: int = 0  # 0 = dense decoder
    top_k: int = 2
    expert_ffn: int = 128
    aux_coef: float = 0.001
    # Megatron's --moe-expert-capacity-factor; None: no
    # token is dropped
    capacity_factor: Optional[float] = None
    # Megatron's --moe-token-drop-policy (with a capacity factor)
    drop_policy: str = 'probs'
    vocab: int = 512
    seq: int = 128
    rope_theta: float = 1e6
    eps: float = 1e-6


CONFIGS = {
    'tiny-vlm': Config(name='tiny-vlm'),
    'tiny-vlm-moe': Config(name='tiny-vlm-moe', experts=8, top_k=2, expert_ffn=128),
    # drop policy position: the policy probs (Megatron's and lfc's default) is checked against a
    # plain reference in lfc's own tests; this fixture keeps seed 3's routing margins
    'tiny-vlm-moe-capacity': Config(
        name='tiny-vlm-moe-capacity', experts=8, top_k=2, expert_ffn=128, capacity_factor=0.5,
        drop_policy='position',
    ),
}

PLACEHOLDER = 1
PAD = 0

OPTIMIZER = {
    'lr': 1e-3,
    'beta1': 0.9,
    'beta2': 0.95,
    'eps': 1e-8,
    'weight_decay': 0.1,
    'clip_norm': 1.0,
}
NUM_STEPS = 3

# --------------------------------------------------------------------------
# Safetensors (hand-written: no safetensors package for torch 1.13 here)
# --------------------------------------------------------------------------

_DTYPES = {torch.float32: 'F32', torch.int32: 'I32', torch.uint8: 'U8', torch.float64: 'F64'}
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().cpu()
    if t.dtype not in _DTYPES:
        raise TypeError(f'unsupported dtype {t.dtype}')
    # Keep the tensor's own storage layout; x86/ARM are little-endian, which
    # is what the format requires.
    assert sys.byteorder == 'little'
    return t.numpy().tobytes()


def save_safetensors(path: str, tensors: Dict[str, torch.Tensor]) -> None:
    """Header: 8-byte little-endian length, JSON (names sorted), then the
    raw bytes of the tensors in the same order."""
    names = sorted(tensors)
    header = {}
    blobs = []
    offset = 0
    for name in names:
        t = tensors[name]
        data = _tensor_bytes(t)
        header[name] = {
            'dtype': _DTYPES[t.dtype],
            'shape': list(t.shape),
            'data_offsets': [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(',', ':')).encode('utf-8')
    hjson += b' ' * ((8 - len(hjson) % 8) % 8)  # pad the header to 8 bytes
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def load_safetensors(path: str) -> Dict[str, torch.Tensor]:
    with open(path, 'rb') as f:
        raw = f.read()
    (n,) = struct.unpack('<Q', raw[:8])
    header = json.loads(raw[8 : 8 + n].decode('utf-8'))
    body = raw[8 + n :]
    out = {}
    for name, info in header.items():
        if name == '__metadata__':
            continue
        begin, end = info['data_offsets']
        dtype = _TORCH_DTYPES[info['dtype']]
        buf = bytearray(body[begin:end])
        if len(buf) == 0:
            t = torch.empty(info['shape'], dtype=dtype)
        else:
            t = torch.frombuffer(buf, dtype=dtype).reshape(info['shape']).clone()
        out[name] = t
    return out


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate='tanh')


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


def masked_attention(q, k, v, allowed):
    """q, k, v: [heads, T, d]; allowed: [T, T] bool (query, key).
    Explicit scaled dot-product attention with a boolean mask."""
    d = q.shape[-1]
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
    scores = scores.masked_fill(~allowed, float('-inf'))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v)


# ---- vision --------------------------------------------------------------


class PatchEmbed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.proj = nn.Linear(3 * cfg.patch * cfg.patch, cfg.v_hidden, bias=True)


class VisionAttention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.heads = cfg.v_heads
        self.qkv = nn.Linear(cfg.v_hidden, 3 * cfg.v_hidden, bias=True)
        self.proj = nn.Linear(cfg.v_hidden, cfg.v_hidden, bias=True)

    def forward(self, x, allowed):
        T, H = x.shape
        hd = H // self.heads
        q, k, v = self.qkv(x).split(H, dim=-1)
        q, k, v = (t.view(T, self.heads, hd).transpose(0, 1) for t in (q, k, v))
        o = masked_attention(q, k, v, allowed)  # [heads, T, hd]
        return self.proj(o.transpose(0, 1).reshape(T, H))


class VisionMLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.fc1 = nn.Linear(cfg.v_hidden, cfg.v_ffn, bias=True)
        self.fc2 = nn.Linear(cfg.v_ffn, cfg.v_hidden, bias=True)

    def forward(self, x):
        return self.fc2(gelu_tanh(self.fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.v_hidden, eps=cfg.eps)
        self.attn = VisionAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.v_hidden, eps=cfg.eps)
        self.mlp = VisionMLP(cfg)

    def forward(self, x, allowed):
        x = x + self.attn(self.norm1(x), allowed)
        x = x + self.mlp(self.norm2(x))
        return x


class Merger(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        m = cfg.merge * cfg.merge
        self.norm = nn.LayerNorm(cfg.v_hidden, eps=cfg.eps)
        self.fc1 = nn.Linear(m * cfg.v_hidden, m * cfg.v_hidden, bias=True)
        self.fc2 = nn.Linear(m * cfg.v_hidden, cfg.hidden, bias=True)
        self.m = m

    def forward(self, x):
        x = self.norm(x)
        x = x.reshape(-1, self.m * x.shape[-1])  # runs of 4 consecutive patches
        return self.fc2(gelu_tanh(self.fc1(x)))


def patchify(img: torch.Tensor, patch: int, merge: int):
    """[3, H, W] -> (patches [N, 3*p*p], rows [N], cols [N]).

    Patch flattening: (channel, row, col). Patch order: 2x2 merge blocks,
    block rows top to bottom, block columns left to right, inside a block
    TL, TR, BL, BR."""
    C, H, W = img.shape
    assert H % (patch * merge) == 0 and W % (patch * merge) == 0
    ph, pw = H // patch, W // patch
    bh, bw = ph // merge, pw // merge
    # dims: c, block_row, in_block_row, pixel_row, block_col, in_block_col, pixel_col
    x = img.reshape(C, bh, merge, patch, bw, merge, patch)
    x = x.permute(1, 4, 2, 5, 0, 3, 6)  # br, bc, i, j, c, pr, pc
    patches = x.reshape(bh * bw * merge * merge, C * patch * patch)
    br = torch.arange(bh).view(bh, 1, 1, 1)
    bc = torch.arange(bw).view(1, bw, 1, 1)
    i = torch.arange(merge).view(1, 1, merge, 1)
    j = torch.arange(merge).view(1, 1, 1, merge)
    rows = (br * merge + i).expand(bh, bw, merge, merge).reshape(-1)
    cols = (bc * merge + j).expand(bh, bw, merge, merge).reshape(-1)
    return patches, rows, cols


class VisionModel(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        n = cfg.max_side // cfg.patch
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed_row = nn.Parameter(torch.zeros(n, cfg.v_hidden))
        self.pos_embed_col = nn.Parameter(torch.zeros(n, cfg.v_hidden))
        self.blocks = nn.ModuleList([VisionBlock(cfg) for _ in range(cfg.v_layers)])
        self.merger = Merger(cfg)

    def forward(self, images: List[torch.Tensor]) -> torch.Tensor:
        """All images of one microbatch -> visual tokens [sum H*W/64, Hd],
        in image order."""
        cfg = self.cfg
        patches, rows, cols, image_id = [], [], [], []
        for idx, img in enumerate(images):
            p, r, c = patchify(img, cfg.patch, cfg.merge)
            patches.append(p)
            rows.append(r)
            cols.append(c)
            image_id.append(torch.full((p.shape[0],), idx, dtype=torch.long))
        patches = torch.cat(patches)
        rows, cols, image_id = torch.cat(rows), torch.cat(cols), torch.cat(image_id)
        x = self.patch_embed.proj(patches.to(self.pos_embed_row.dtype))
        x = x + self.pos_embed_row[rows] + self.pos_embed_col[cols]
        # bidirectional, only between patches of the same image
        allowed = image_id[:, None] == image_id[None, :]
        for blk in self.blocks:
            x = blk(x, allowed)
        return self.merger(x)


# ---- decoder -------------------------------------------------------------


def rope_cos_sin(positions: torch.Tensor, d: int, theta: float, dtype):
    """Angles p * theta^(-2j/d) for j < d/2, computed in float64 and rounded
    once to the compute dtype."""
    j = torch.arange(d // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * j / d)
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, d/2]
    ang = torch.cat([ang, ang], dim=-1)  # [T, d]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    """x [heads, T, d]; cos/sin [T, d]."""
    return x * cos + rotate_half(x) * sin


class SelfAttention(nn.Module):
    def __init__(self, cfg: Config):
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
        T = x.shape[0]
        d = cfg.head_dim
        q = self.q_norm(self.q_proj(x).view(T, cfg.heads, d)).transpose(0, 1)
        k = self.k_norm(self.k_proj(x).view(T, cfg.kv_heads, d)).transpose(0, 1)
        v = self.v_proj(x).view(T, cfg.kv_heads, d).transpose(0, 1)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        g = cfg.heads // cfg.kv_heads
        # KV head h serves query heads h*g ... h*g+g-1
        k = k.repeat_interleave(g, dim=0)
        v = v.repeat_interleave(g, dim=0)
        o = masked_attention(q, k, v, allowed)  # [heads, T, d]
        return self.o_proj(o.transpose(0, 1).reshape(T, cfg.heads * d))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def capacity_mask(chosen: torch.Tensor, weights: torch.Tensor, E: int, factor: Optional[float],
                  policy: str) -> torch.Tensor:
    """[T, k] True where an assignment is kept. With a capacity factor (Megatron's
    get_capacity: ceil(T·k / E · factor) per expert) each expert keeps that many of its
    assignments: drop policy probs (Megatron's default) those of the highest routing weight,
    ties to the earlier assignment; position its earliest in token order. A dropped one adds
    nothing to its token's output, and the kept weights are not renormalized. Padding tokens are
    routed and count too."""
    keep = torch.ones_like(chosen, dtype=torch.bool)
    if factor is None:
        return keep
    T, k = chosen.shape
    capacity = math.ceil(T * k / E * factor)
    w = weights.detach()
    for e in range(E):
        tok, slot = torch.nonzero(chosen == e, as_tuple=True)  # row-major: token order
        if policy == 'probs':
            # stable descending sort by weight: equal weights stay in assignment order
            order = torch.sort(w[tok, slot], descending=True, stable=True).indices
            tok, slot = tok[order], slot[order]
        keep[tok[capacity:], slot[capacity:]] = False
    return keep


class MoE(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(cfg.hidden, cfg.experts, bias=False)  # router
        self.experts = nn.ModuleList(
            [SwiGLU(cfg.hidden, cfg.expert_ffn) for _ in range(cfg.experts)]
        )
        self.dropped = 0  # assignments of non-padding tokens dropped by capacity, summed

    def forward(self, x, nonpad):
        cfg = self.cfg
        E, k = cfg.experts, cfg.top_k
        probs = torch.softmax(self.gate(x), dim=-1)  # [T, E], full softmax
        # top-k, ties to the lower expert index: stable descending sort
        sorted_p, order = torch.sort(probs.detach(), dim=-1, descending=True, stable=True)
        chosen = order[:, :k]  # [T, k]
        top_p = probs.gather(1, chosen)  # with gradient
        weights = top_p / top_p.sum(-1, keepdim=True)
        keep = capacity_mask(chosen, weights, E, cfg.capacity_factor, cfg.drop_policy)
        self.dropped += int((~keep[nonpad]).sum())
        out = torch.zeros_like(x)
        for e in range(E):
            tok, slot = torch.nonzero((chosen == e) & keep, as_tuple=True)
            if tok.numel() == 0:
                continue
            y = self.experts[e](x[tok]) * weights[tok, slot][:, None]
            out = out.index_add(0, tok, y)
        # load-balancing term over the microbatch's non-padding tokens
        n = int(nonpad.sum())
        counts = torch.bincount(chosen[nonpad].reshape(-1), minlength=E).to(x.dtype)
        f = counts / (n * k)  # fraction of top-k assignments, no gradient
        P = probs[nonpad].mean(0)
        aux = E * (f * P).sum()
        margin = (sorted_p[nonpad, k - 1] - sorted_p[nonpad, k]).min().item()
        return out, aux, margin


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Config):
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
            y, aux, margin = self.mlp(h, nonpad)
        else:
            y, aux, margin = self.mlp(h), None, None
        return x + y, aux, margin


class Decoder(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.layers)])
        self.norm = RMSNorm(cfg.hidden, cfg.eps)


def decoder_mask(segments: torch.Tensor) -> torch.Tensor:
    """allowed[i, j]: causal within the same sample; padding (segment -1)
    attends only to itself and is attended by nobody else."""
    T = segments.shape[0]
    idx = torch.arange(T)
    same = segments[:, None] == segments[None, :]
    causal = idx[None, :] <= idx[:, None]
    real = (segments >= 0)[:, None]
    return (same & causal & real) | torch.eye(T, dtype=torch.bool)


class TinyVLM(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.visual = VisionModel(cfg)
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, mb):
        """One microbatch -> (logits [S, V], aux sum over MoE layers or None,
        min top-k margin or None)."""
        cfg = self.cfg
        tokens, positions, segments = mb['tokens'].long(), mb['positions'], mb['segments']
        x = self.model.embed_tokens(tokens)
        is_ph = tokens == PLACEHOLDER
        if mb['images']:
            vis = self.visual(mb['images'])
            assert vis.shape[0] == int(is_ph.sum()), 'placeholder count != visual tokens'
            idx = torch.nonzero(is_ph, as_tuple=True)[0]
            x = x.index_copy(0, idx, vis.to(x.dtype))  # replaced in order
        else:
            assert int(is_ph.sum()) == 0
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, x.dtype)
        allowed = decoder_mask(segments)
        nonpad = segments >= 0
        aux_total, margin = None, None
        for layer in self.model.layers:
            x, aux, m = layer(x, cos, sin, allowed, nonpad)
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
                margin = m if margin is None else min(margin, m)
        logits = self.lm_head(self.model.norm(x))
        return logits, aux_total, margin


def global_loss(model: TinyVLM, batch: List[dict]):
    """Loss of tiny-vlm.md over the whole global batch.

    loss = sum CE over masked-in positions / their number
         + aux_coef * mean over microbatches of sum over MoE layers of aux."""
    cfg = model.cfg
    ce_sum = None
    n_tok = 0
    aux_sum = None
    margin = None
    for mb in batch:
        logits, aux, m = model(mb)
        mask = mb['loss_mask'].bool()
        n_tok += int(mask.sum())
        ce = F.cross_entropy(logits[mask], mb['labels'].long()[mask], reduction='sum')
        ce_sum = ce if ce_sum is None else ce_sum + ce
        if aux is not None:
            aux_sum = aux if aux_sum is None else aux_sum + aux
            margin = m if margin is None else min(margin, m)
    if n_tok == 0:
        raise ValueError('global batch has no loss token')
    ce_loss = ce_sum / n_tok
    if aux_sum is not None:
        aux_loss = cfg.aux_coef * (aux_sum / len(batch))
    else:
        aux_loss = torch.zeros((), dtype=ce_loss.dtype)
    loss = ce_loss + aux_loss
    return loss, ce_loss, aux_loss, n_tok, margin


# --------------------------------------------------------------------------
# Init (seeded per parameter name, so shared parameters are identical in
# both models)
# --------------------------------------------------------------------------


def init_weights(model: TinyVLM, seed: int) -> None:
    """- Linear weights (incl. lm_head): N(0, 0.02); biases N(0, 0.02).
    - LayerNorm/RMSNorm weights: 1 + N(0, 0.1); LayerNorm biases N(0, 0.02).
    - embed_tokens, pos_embed_row/col: N(0, 0.02).
    - MoE router mlp.gate.weight: N(0, 0.1): router logits of
      std ~1, so the k-th and (k+1)-th probabilities are well apart
      (with std 0.5 the softmax is nearly one-hot and p2 - p3 ~ 1e-9).
    Each parameter draws from its own generator seeded with
    seed * 1_000_003 + crc32(name)."""
    norm_weights = set()
    norm_biases = set()
    for mname, mod in model.named_modules():
        if isinstance(mod, (nn.LayerNorm, RMSNorm)):
            norm_weights.add(f'{mname}.weight')
            if isinstance(mod, nn.LayerNorm):
                norm_biases.add(f'{mname}.bias')
    with torch.no_grad():
        for name, p in model.named_parameters():
            g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name in norm_weights:
                v = 1.0 + 0.1 * noise
            elif name in norm_biases:
                v = 0.02 * noise
            elif name.endswith('mlp.gate.weight'):
                v = 0.1 * noise
            else:
                v = 0.02 * noise
            p.copy_(v)


# --------------------------------------------------------------------------
# Synthetic batch
# --------------------------------------------------------------------------

# 8 colours: corners of the RGB cube, pulled inside [0, 1]
_LEVELS = (0.15, 0.85)
COLOURS = [(_LEVELS[(c >> 2) & 1], _LEVELS[(c >> 1) & 1], _LEVELS[c & 1]) for c in range(8)]
TOK_BG = 2  # background colour c -> 2 + c   (2..9)
TOK_SQ = 10  # square colour c     -> 10 + c  (10..17)
TOK_QUAD = 18  # quadrant q        -> 18 + q  (18..21); 22..25 unused
TOK_FILLER = 26


def make_image(rng: random.Random, gen: torch.Generator, a: int, b: int):
    """8a x 8b pixels: solid background, a filled square of another colour
    centred in one quadrant (0 TL, 1 TR, 2 BL, 3 BR), plus N(0, 0.03) noise,
    clamped to [0, 1]."""
    H, W = 8 * a, 8 * b
    bg = rng.randrange(8)
    sq = rng.choice([c for c in range(8) if c != bg])
    quad = rng.randrange(4)
    img = torch.tensor(COLOURS[bg], dtype=torch.float32).view(3, 1, 1).repeat(1, H, W)
    s = min(H, W) // 2
    top = (quad // 2) * (H // 2) + (H // 2 - s) // 2
    left = (quad % 2) * (W // 2) + (W // 2 - s) // 2
    img[:, top : top + s, left : left + s] = torch.tensor(COLOURS[sq]).view(3, 1, 1)
    img = (img + 0.03 * torch.randn(img.shape, generator=gen)).clamp(0.0, 1.0)
    caption = [TOK_BG + bg, TOK_SQ + sq, TOK_QUAD + quad]
    return img, caption


def make_filler(rng: random.Random, n: int) -> List[int]:
    """Arithmetic sequence of n tokens >= 26, all < 512."""
    step = rng.randint(1, 6)
    start = rng.randint(TOK_FILLER, 511 - step * (n - 1))
    return [start + i * step for i in range(n)]


def pack(samples: List[List[int]], seq: int):
    """samples -> tokens, labels, loss_mask, positions, segments (padding at
    the end)."""
    tokens, labels, mask, positions, segments = [], [], [], [], []
    for s_idx, toks in enumerate(samples):
        for i, t in enumerate(toks):
            nxt = toks[i + 1] if i + 1 < len(toks) else None
            text = nxt is not None and nxt not in (PLACEHOLDER, PAD)
            tokens.append(t)
            labels.append(nxt if text else 0)
            mask.append(1 if text else 0)
            positions.append(i)
            segments.append(s_idx)
    assert len(tokens) < seq, f'packed length {len(tokens)} does not fit {seq}'
    n_pad = seq - len(tokens)
    tokens += [PAD] * n_pad
    labels += [0] * n_pad
    mask += [0] * n_pad
    positions += [0] * n_pad
    segments += [-1] * n_pad
    return {
        'tokens': torch.tensor(tokens, dtype=torch.int32),
        'labels': torch.tensor(labels, dtype=torch.int32),
        'loss_mask': torch.tensor(mask, dtype=torch.uint8),
        'positions': torch.tensor(positions, dtype=torch.int32),
        'segments': torch.tensor(segments, dtype=torch.int32),
    }


def make_batch(seed: int, seq: int = 128) -> List[dict]:
    """Global batch of 3 microbatches:
    mb0: two image samples with images of different shapes (one of them
         non-square with both sides >= 16 pixels);
    mb1: one image sample + one text-only sample;
    mb2: three text-only samples (no image)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed + 7)

    def image_sample(a, b):
        img, caption = make_image(rng, gen, a, b)
        toks = [PLACEHOLDER] * (a * b) + caption + make_filler(rng, rng.randint(8, 20))
        return img, toks

    def text_sample():
        return make_filler(rng, rng.randint(10, 30))

    # mb0 sizes: different shapes, one with a != b and a, b >= 2
    while True:
        s0 = (rng.randint(1, 4), rng.randint(1, 4))
        s1 = (rng.randint(1, 4), rng.randint(1, 4))
        if s0 != s1 and any(a != b and min(a, b) >= 2 for a, b in (s0, s1)):
            break
    batch = []
    img0, t0 = image_sample(*s0)
    img1, t1 = image_sample(*s1)
    batch.append(dict(pack([t0, t1], seq), images=[img0, img1]))
    img2, t2 = image_sample(rng.randint(1, 4), rng.randint(1, 4))
    batch.append(dict(pack([t2, text_sample()], seq), images=[img2]))
    batch.append(dict(pack([text_sample() for _ in range(3)], seq), images=[]))
    return batch


def batch_tensors(batch: List[dict]) -> Dict[str, torch.Tensor]:
    out = {}
    for j, mb in enumerate(batch):
        for key in ('tokens', 'labels', 'loss_mask', 'positions', 'segments'):
            out[f'mb{j}.{key}'] = mb[key]
        for i, img in enumerate(mb['images']):
            out[f'mb{j}.image{i}'] = img
    return out


# --------------------------------------------------------------------------
# Training step
# --------------------------------------------------------------------------


def make_optimizer(model: TinyVLM):
    decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [
            {'params': decay, 'weight_decay': OPTIMIZER['weight_decay']},
            {'params': no_decay, 'weight_decay': 0.0},
        ],
        lr=OPTIMIZER['lr'],
        betas=(OPTIMIZER['beta1'], OPTIMIZER['beta2']),
        eps=OPTIMIZER['eps'],
    )


def run_model(name: str, seed: int, batch: List[dict], watch: List[str]):
    """Build + init the model and run NUM_STEPS steps on `batch`.
    Returns a dict of results; `watch` names parameters whose clipped grads
    are recorded for the hand AdamW check."""
    cfg = CONFIGS[name]
    torch.manual_seed(0)  # module construction only; init_weights overwrites all
    model = TinyVLM(cfg)
    init_weights(model, seed)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = make_optimizer(model)
    res = {'weights': weights, 'losses': [], 'grad_norms': [], 'margins': [], 'clipped': []}
    res['dropped'] = []
    params = dict(model.named_parameters())
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    for step in range(NUM_STEPS):
        opt.zero_grad(set_to_none=True)
        for m in moes:
            m.dropped = 0
        loss, ce, aux, n_tok, margin = global_loss(model, batch)
        res['dropped'].append(sum(m.dropped for m in moes))
        loss.backward()
        # An expert that no token reached in this step gets a zero gradient, as with Megatron's
        # grouped GEMM (and lfc): AdamW still decays it and updates its moments. Plain PyTorch
        # would leave p.grad None and skip the parameter.
        for p in model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        if step == 0:
            res['grads'] = {
                n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                for n, p in model.named_parameters()
            }
            res['loss'], res['ce_loss'], res['aux_loss'] = float(loss), float(ce), float(aux)
            res['loss_tokens'] = n_tok
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIMIZER['clip_norm'])
        res['losses'].append(float(loss))
        res['grad_norms'].append(float(gn))
        res['margins'].append(margin)
        res['clipped'].append({n: params[n].grad.detach().clone() for n in watch})
        opt.step()
    res['params_step3'] = {n: p.detach().clone() for n, p in model.named_parameters()}
    res['grad_norm'] = res['grad_norms'][0]
    res['model'] = model
    return res


# --------------------------------------------------------------------------
# Self-checks
# --------------------------------------------------------------------------


def batch_to(batch, dtype):
    return [dict(mb, images=[im.to(dtype) for im in mb['images']]) for mb in batch]


def fd_check(name: str, seed: int, batch: List[dict], n_coords: int = 3, h: float = 1e-6):
    """Central differences in float64 on a few coordinates of a few
    parameters vs autograd. Returns the worst error |fd - ad| / (|ad| + 1e-4)
    (relative for gradients above 1e-4, absolute x 1e4 below)."""
    cfg = CONFIGS[name]
    model = TinyVLM(cfg)
    init_weights(model, seed)
    model = model.double()
    b64 = batch_to(batch, torch.float64)
    loss, *_ = global_loss(model, b64)
    model.zero_grad()
    loss.backward()
    params = dict(model.named_parameters())
    picks = [
        'visual.patch_embed.proj.weight',
        'visual.patch_embed.proj.bias',
        'visual.pos_embed_row',
        'visual.pos_embed_col',
        'visual.blocks.0.norm1.bias',
        'visual.blocks.1.attn.qkv.weight',
        'visual.blocks.0.attn.qkv.bias',
        'visual.merger.norm.weight',
        'visual.merger.fc1.bias',
        'visual.merger.fc2.weight',
        'model.embed_tokens.weight',
        'model.layers.0.self_attn.q_norm.weight',
        'model.layers.2.self_attn.k_proj.weight',
        'model.layers.3.input_layernorm.weight',
        'model.norm.weight',
        'lm_head.weight',
    ]
    if cfg.experts:
        picks += ['model.layers.1.mlp.gate.weight', 'model.layers.2.mlp.experts.3.up_proj.weight']
    else:
        picks += ['model.layers.1.mlp.down_proj.weight']
    rng = random.Random(seed + 99)
    worst = 0.0
    lines = []
    for pname in picks:
        p = params[pname]
        g = p.grad.reshape(-1)
        coords = rng.sample(range(p.numel()), n_coords)
        top = int(g.abs().argmax())  # one coordinate with a clearly non-zero grad
        coords += [top] if top not in coords else []
        for c in coords:
            flat = p.data.view(-1)
            orig = flat[c].item()
            with torch.no_grad():
                flat[c] = orig + h
                lp = float(global_loss(model, b64)[0])
                flat[c] = orig - h
                lm = float(global_loss(model, b64)[0])
                flat[c] = orig
            fd = (lp - lm) / (2 * h)
            ad = g[c].item()
            # float64 round-off of the difference quotient is ~ 1e-16 * loss / h
            # ~ 1e-9 absolute, so small gradients are judged absolutely.
            err = abs(fd - ad) / (abs(ad) + 1e-4)
            worst = max(worst, err)
            lines.append(f'    {pname}[{c}]: autograd {ad:+.9e} fd {fd:+.9e} err {err:.1e}')
    return worst, lines


def adamw_by_hand(w0: torch.Tensor, clipped: List[torch.Tensor], wd: float) -> torch.Tensor:
    """The update of tiny-vlm.md, in float64."""
    o = OPTIMIZER
    p = w0.double().clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    for t, g in enumerate(clipped, start=1):
        g = g.double()
        p = p - o['lr'] * wd * p
        m = o['beta1'] * m + (1 - o['beta1']) * g
        v = o['beta2'] * v + (1 - o['beta2']) * g * g
        mhat = m / (1 - o['beta1'] ** t)
        vhat = v / (1 - o['beta2'] ** t)
        p = p - o['lr'] * mhat / (vhat.sqrt() + o['eps'])
    return p


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

WATCH = ['model.layers.0.self_attn.q_proj.weight', 'model.layers.0.input_layernorm.weight']
MARGIN_MIN = 1e-4


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument('--out', default='test/fixtures', help='output directory')
    ap.add_argument('--seed', type=int, default=0, help='first seed to try')
    ap.add_argument('--check', action='store_true', help='run the self-checks')
    args = ap.parse_args()
    torch.set_num_threads(1)  # reproducible reductions
    torch.set_default_dtype(torch.float32)

    # Pick the first seed whose MoE routing has clear top-k margins in all
    # three steps (both models use the same seed: same batch, and the same
    # values for every parameter the two models share).
    seed = args.seed
    while True:
        batch = make_batch(seed)
        moe = run_model('tiny-vlm-moe', seed, batch, WATCH)
        capacity = run_model('tiny-vlm-moe-capacity', seed, batch, WATCH)
        margin = min(moe['margins'] + capacity['margins'])
        if margin > MARGIN_MIN:
            break
        print(f'seed {seed}: min top-k margin {margin:.3e} too small, next seed')
        seed += 1
    results = {
        'tiny-vlm': run_model('tiny-vlm', seed, batch, WATCH),
        'tiny-vlm-moe': moe,
        'tiny-vlm-moe-capacity': capacity,
    }

    written = []
    for name, res in results.items():
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        files = {
            'weights.safetensors': res['weights'],
            'batch.safetensors': batch_tensors(batch),
            'grads.safetensors': res['grads'],
            'params_step3.safetensors': res['params_step3'],
        }
        for fname, tensors in files.items():
            path = os.path.join(d, fname)
            save_safetensors(path, tensors)
            written.append((path, tensors))
        step = {
            'model': name,
            'seed': seed,
            'num_microbatches': len(batch),
            'loss': res['loss'],
            'ce_loss': res['ce_loss'],
            'aux_loss': res['aux_loss'],
            'loss_tokens': res['loss_tokens'],
            'grad_norm': res['grad_norm'],
            'losses': res['losses'],
            'grad_norms': res['grad_norms'],
            'optimizer': OPTIMIZER,
        }
        if CONFIGS[name].experts:
            step['min_topk_margin'] = min(res['margins'])
            step['min_topk_margin_per_step'] = res['margins']
        if CONFIGS[name].capacity_factor is not None:
            step['moe_expert_capacity_factor'] = CONFIGS[name].capacity_factor
            step['moe_token_drop_policy'] = CONFIGS[name].drop_policy
            step['dropped_per_step'] = res['dropped']
        with open(os.path.join(d, 'step.json'), 'w') as f:
            json.dump(step, f, indent=2)
            f.write('\n')

    ok = True
    if args.check:
        print('== self-checks')
        # 1. bit-exact read-back
        for path, tensors in written:
            back = load_safetensors(path)
            same = set(back) == set(tensors) and all(
                back[n].dtype == tensors[n].dtype
                and back[n].shape == tensors[n].shape
                and _tensor_bytes(back[n]) == _tensor_bytes(tensors[n])
                for n in tensors
            )
            ok &= same
            print(f'  read-back {path}: {"bit-exact" if same else "MISMATCH"}')
        # 2. finite differences (float64)
        for name in results:
            worst, lines = fd_check(name, seed, batch)
            good = worst < 1e-5
            ok &= good
            print(f'  finite differences {name}: worst err {worst:.2e} {"ok" if good else "FAIL"}')
            for line in lines:
                print(line)
        # 3. AdamW by hand
        for name, res in results.items():
            for pname in WATCH:
                wd = OPTIMIZER['weight_decay'] if res['weights'][pname].dim() >= 2 else 0.0
                ref = adamw_by_hand(res['weights'][pname], [c[pname] for c in res['clipped']], wd)
                got = res['params_step3'][pname].double()
                err = (ref - got).abs().max().item()
                good = err < 1e-6
                ok &= good
                print(f'  AdamW by hand {name} {pname} (wd {wd}): max abs diff {err:.2e} {"ok" if good else "FAIL"}')
        # 4. patch order against a naive loop over merge blocks
        img = torch.arange(3 * 24 * 32, dtype=torch.float32).view(3, 24, 32)
        patches, rows, cols = patchify(img, 4, 2)
        naive, nr, nc = [], [], []
        for br in range(24 // 8):
            for bc in range(32 // 8):
                for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)):  # TL, TR, BL, BR
                    r, c = 2 * br + i, 2 * bc + j
                    naive.append(img[:, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4].reshape(-1))
                    nr.append(r)
                    nc.append(c)
        same = (
            torch.equal(patches, torch.stack(naive))
            and rows.tolist() == nr
            and cols.tolist() == nc
        )
        ok &= same
        print(f'  patch order vs naive loop: {"ok" if same else "FAIL"}')
        # 5. the two models share every non-decoder-MLP parameter value
        shared = [n for n in results['tiny-vlm']['weights'] if n in results['tiny-vlm-moe']['weights']]
        same = all(
            torch.equal(results['tiny-vlm']['weights'][n], results['tiny-vlm-moe']['weights'][n])
            for n in shared
        )
        print(f'  shared parameters identical across models: {same}')

    print('== summary (seed %d)' % seed)
    for mbi, mb in enumerate(batch):
        shapes = [tuple(im.shape[1:]) for im in mb['images']]
        n_real = int((mb['segments'] >= 0).sum())
        print(
            f'  mb{mbi}: samples {int(mb["segments"].max()) + 1}, images {shapes}, '
            f'real tokens {n_real}, loss tokens {int(mb["loss_mask"].sum())}'
        )
    for name, res in results.items():
        extra = f' min_topk_margin {min(res["margins"]):.6e}' if CONFIGS[name].experts else ''
        print(
            f'  {name}: loss {res["loss"]!r} ce {res["ce_loss"]!r} aux {res["aux_loss"]!r} '
            f'grad_norm {res["grad_norm"]!r} tokens {res["loss_tokens"]}{extra}'
        )
        print(f'    losses {res["losses"]}  grad_norms {res["grad_norms"]}')
    if not ok:
        print('SELF-CHECK FAILED')
        sys.exit(1)


if __name__ == '__main__':
    main()
