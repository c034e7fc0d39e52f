#!/usr/bin/env python3
"""Independent PyTorch reference for lfc's two tiny Qwen presets.

`qwen2.5-vl-tiny` (Qwen2.5-VL: window attention, RMSNorm + SwiGLU ViT, sectioned M-RoPE,
q/k/v bias, tied embeddings) and `qwen3-vl-moe-tiny` (Qwen3-VL-MoE: interpolated position
table, LayerNorm + GELU ViT, deepstack, interleaved M-RoPE, q/k norm, fused MoE experts),
written from docs/qwen-vl.md and Hugging Face's modeling_qwen2_5_vl.py / modeling_qwen3_vl.py /
modeling_qwen3_vl_moe.py, not from lfc's compiler or runtime. Parameter names are the Hugging
Face checkpoint names. Everything else follows test/reference/tiny_vlm.py, whose batch
generator, safetensors reader/writer, loss and optimizer settings it imports:

    OUT/<model>/weights.safetensors      parameters before step 1 (HF names)
    OUT/<model>/batch.safetensors        the global batch in the batch contract (3 microbatches)
    OUT/<model>/grads.safetensors        gradients at step 1, before clipping
    OUT/<model>/params_step3.safetensors parameters after 3 AdamW steps on that batch
    OUT/<model>/step.json                loss figures and optimizer settings

Usage (torch 1.13, CPU):

    /usr/bin/python3 test/reference/qwen_vl.py --out test/fixtures
    /usr/bin/python3 test/reference/qwen_vl.py --out test/fixtures --check
    /usr/bin/python3 test/reference/qwen_vl.py --load-hf DIR --batch FILE

`--check` adds the self-checks (finite differences in float64, bit-exact read-back, AdamW by
hand, get_rope_index and window indices against hand-worked arrays, the window-reorder path
against a mask-by-window-id attention, ...). `--load-hf` loads a Hugging Face model directory
(config.json + model.safetensors or a sharded index) and prints the loss of lfc's definition on
a batch file of the batch contract as JSON.
"""

import argparse
import json
import math
import os
import random
import struct
import sys
from dataclasses import dataclass, replace
from typing import Dict, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_vlm as tv  # noqa: E402  (batch generator, safetensors I/O, loss, optimizer)

# --------------------------------------------------------------------------
# Configuration (docs/qwen-vl.md, "The tiny presets")
# --------------------------------------------------------------------------


@dataclass
class QwenConfig:
    name: str
    family: str  # 'qwen2_5_vl' (visual.*, model.*) or 'qwen3_vl' (model.visual.*, model.language_model.*)
    # vision
    in_channels: int = 3
    patch: int = 4
    temporal: int = 2
    merge: int = 2
    v_hidden: int = 64
    v_heads: int = 4
    v_layers: int = 4
    v_ffn: int = 128
    v_norm: str = 'rmsnorm'  # or 'layernorm'
    v_mlp: str = 'swiglu'  # SwiGLU (silu) with biases, or 'gelu_tanh' / 'gelu' (fc1, act, fc2)
    patch_bias: bool = False
    pos_table: int = 0  # num_position_embeddings (n², interpolated); 0: none
    v_rope_theta: float = 10000.0
    window_size: int = 0  # pixels; 0: no window attention
    fullatt_blocks: Tuple[int, ...] = ()
    deepstack: Tuple[int, ...] = ()
    # decoder
    hidden: int = 128
    layers: int = 4
    heads: int = 8
    kv_heads: int = 4
    head_dim: int = 16
    ffn: int = 384
    experts: int = 0
    top_k: int = 2
    expert_ffn: int = 128
    aux_coef: float = 0.001
    qkv_bias: bool = False
    qk_norm: bool = False
    mrope_section: Tuple[int, ...] = (2, 3, 3)
    mrope_interleaved: bool = False
    rope_theta: float = 1e6
    vocab: int = 512
    tied: bool = False
    eps: float = 1e-6
    image_token_id: int = 1
    seq: int = 128

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal * self.patch * self.patch


CONFIGS = {
    'qwen2.5-vl-tiny': QwenConfig(
        name='qwen2.5-vl-tiny', family='qwen2_5_vl',
        v_layers=4, v_ffn=128, v_norm='rmsnorm', v_mlp='swiglu', patch_bias=False,
        window_size=16, fullatt_blocks=(1, 3),
        ffn=384, qkv_bias=True, mrope_section=(2, 3, 3), tied=True,
    ),
    'qwen3-vl-moe-tiny': QwenConfig(
        name='qwen3-vl-moe-tiny', family='qwen3_vl',
        v_layers=3, v_ffn=256, v_norm='layernorm', v_mlp='gelu_tanh', patch_bias=True,
        pos_table=16, deepstack=(0, 1),
        experts=8, top_k=2, expert_ffn=128, qk_norm=True,
        mrope_section=(4, 2, 2), mrope_interleaved=True, tied=False,
    ),
}

IMAGE_TOKEN = tv.PLACEHOLDER  # 1
OPTIMIZER = tv.OPTIMIZER
NUM_STEPS = tv.NUM_STEPS
MARGIN_MIN = tv.MARGIN_MIN

# --------------------------------------------------------------------------
# Geometry of images: patches, rows/cols, windows, position ids
# --------------------------------------------------------------------------


def pixel_patches(img: torch.Tensor, cfg: QwenConfig) -> torch.Tensor:
    """[C, H, W] -> [N, C·T·P·P]: a still image repeated T times in time, P×P patches in
    merge-block order (block rows, block columns, then row by row inside a block), each
    patch's values in (channel, time, row, col) order."""
    C, H, W = img.shape
    P, m, T = cfg.patch, cfg.merge, cfg.temporal
    assert H % (P * m) == 0 and W % (P * m) == 0
    bh, bw = H // (P * m), W // (P * m)
    x = img.reshape(C, bh, m, P, bw, m, P).permute(1, 4, 2, 5, 0, 3, 6)  # br bc i j c pr pc
    x = x.reshape(bh * bw * m * m, C, 1, P, P).expand(-1, C, T, P, P)
    return x.reshape(-1, C * T * P * P).contiguous()


def grid_of(img: torch.Tensor, cfg: QwenConfig) -> List[int]:
    return [1, img.shape[1] // cfg.patch, img.shape[2] // cfg.patch]


def patch_rows_cols(grid_thw: torch.Tensor, merge: int):
    """Row and column (in patches, within its image) of every patch, merge-block order,
    frames one after another."""
    rows, cols = [], []
    for t, h, w in grid_thw.tolist():
        for _ in range(t):
            for br in range(h // merge):
                for bc in range(w // merge):
                    for i in range(merge):
                        for j in range(merge):
                            rows.append(br * merge + i)
                            cols.append(bc * merge + j)
    return torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)


def image_lengths(grid_thw: torch.Tensor) -> List[int]:
    """Patches per attention unit for full attention: each frame of each image (cu_seqlens)."""
    out = []
    for t, h, w in grid_thw.tolist():
        out += [h * w] * t
    return out


def get_window_index(grid_thw: torch.Tensor, cfg: QwenConfig):
    """Hugging Face's window reorder (Qwen2.5-VL get_window_index), written out as loops.

    Windows are `window_size / merge / patch` merged tokens a side (2 here). Each image's merged
    grid (h_m, w_m) is padded at the bottom and right by `s - h_m mod s` rows and `s - w_m mod s`
    columns (a whole empty window when it divides, as HF does), giving
    (h_m div s + 1) × (w_m div s + 1) windows, taken row-major; the merged tokens of a window
    row-major. Returns `window_index` (new position -> merged token, over the microbatch) and
    `cu_window_seqlens` in patches, one entry per window, empty windows included (HF removes
    the repeats with unique_consecutive)."""
    s = cfg.window_size // cfg.merge // cfg.patch
    unit = cfg.merge * cfg.merge
    window_index: List[int] = []
    cu = [0]
    base = 0
    for t, h, w in grid_thw.tolist():
        hm, wm = h // cfg.merge, w // cfg.merge
        n_h, n_w = (hm + s - hm % s) // s, (wm + s - wm % s) // s
        for f in range(t):
            for wr in range(n_h):
                for wc in range(n_w):
                    members = [
                        base + f * hm * wm + r * wm + c
                        for r in range(wr * s, min(wr * s + s, hm))
                        for c in range(wc * s, min(wc * s + s, wm))
                    ]
                    window_index += members
                    cu.append(cu[-1] + len(members) * unit)
        base += t * hm * wm
    return torch.tensor(window_index, dtype=torch.long), cu


def window_segments(grid_thw: torch.Tensor, cfg: QwenConfig) -> torch.Tensor:
    """The batch contract's window id of each patch (merge-block order): merged token (r, c) of
    an image lies in window (r div s)·ceil(w_m / s) + (c div s) of that image; ids are unique
    over the microbatch, images numbered one after another."""
    s = cfg.window_size // cfg.merge // cfg.patch
    ids = []
    offset = 0
    for t, h, w in grid_thw.tolist():
        hm, wm = h // cfg.merge, w // cfg.merge
        per_row = -(-wm // s)
        n_win = -(-hm // s) * per_row
        for f in range(t):
            for r in range(hm):
                for c in range(wm):
                    ids += [offset + f * n_win + (r // s) * per_row + c // s] * (cfg.merge ** 2)
        offset += t * n_win
    return torch.tensor(ids, dtype=torch.int32)


def pos_interp_indices(grid_thw: torch.Tensor, n_side: int, merge: int):
    """fast_pos_embed_interpolate's corners and weights, [4, N] each, merge-block order.

    hi = linspace(0, n−1, h), wi = linspace(0, n−1, w) in float32; corners floor and
    min(floor + 1, n − 1); weights (1−dh)(1−dw), (1−dh)dw, dh(1−dw), dh·dw (float32)."""
    idx = [[] for _ in range(4)]
    wts = [[] for _ in range(4)]
    for t, h, w in grid_thw.tolist():
        hi = torch.linspace(0, n_side - 1, h, dtype=torch.float32)
        wi = torch.linspace(0, n_side - 1, w, dtype=torch.float32)
        h0, w0 = hi.floor().long(), wi.floor().long()
        h1, w1 = (h0 + 1).clamp(max=n_side - 1), (w0 + 1).clamp(max=n_side - 1)
        dh, dw = hi - h0.float(), wi - w0.float()
        rows, cols = patch_rows_cols(torch.tensor([[t, h, w]]), merge)
        corners = [(h0, w0), (h0, w1), (h1, w0), (h1, w1)]
        weights = [
            (1 - dh)[rows] * (1 - dw)[cols],
            (1 - dh)[rows] * dw[cols],
            dh[rows] * (1 - dw)[cols],
            dh[rows] * dw[cols],
        ]
        for k, (ch, cw) in enumerate(corners):
            idx[k].append(ch[rows] * n_side + cw[cols])
            wts[k].append(weights[k])
    return torch.stack([torch.cat(i) for i in idx]), torch.stack([torch.cat(w) for w in wts])


def get_rope_index(tokens: List[int], grids: List[List[int]], merge: int, image_token_id: int):
    """M-RoPE position ids [3, L] of one sample (Hugging Face's get_rope_index for images).

    Text tokens get t = h = w = p, counting on from the previous item. An image (the next run
    of h_m·w_m placeholders, grids taken in order) starting after text whose ids reached s − 1
    gets t = s, h = s + r, w = s + c for merged token (r, c), row-major; the text after it
    continues at 1 + the largest id of the image. Returns (ids, number of grids used)."""
    L = len(tokens)
    pos = torch.zeros(3, L, dtype=torch.long)
    st = 0  # next token to place
    nxt = 0  # next id
    used = 0
    while st < L:
        try:
            ed = tokens.index(image_token_id, st)
        except ValueError:
            ed = L
        for i in range(st, ed):  # text
            pos[:, i] = nxt
            nxt += 1
        if ed == L:
            break
        t, h, w = grids[used]
        used += 1
        hm, wm = h // merge, w // merge
        assert t == 1, 'still images only'
        assert tokens[ed : ed + hm * wm] == [image_token_id] * (hm * wm), 'placeholder run too short'
        for r in range(hm):
            for c in range(wm):
                i = ed + r * wm + c
                pos[0, i] = nxt
                pos[1, i] = nxt + r
                pos[2, i] = nxt + c
        nxt = nxt + max(hm, wm)  # = 1 + the largest id of the image
        st = ed + hm * wm
    return pos, used


def mrope_positions(tokens: torch.Tensor, segments: torch.Tensor, grid_thw: torch.Tensor,
                    merge: int, image_token_id: int) -> torch.Tensor:
    """[3, S] for a packed microbatch: get_rope_index per sample (ids restart at 0 in each
    sample); padding (segment −1) gets 0. The images are taken in order."""
    S = tokens.shape[0]
    pos = torch.zeros(3, S, dtype=torch.long)
    grids = grid_thw.tolist()
    used = 0
    for s in range(int(segments.max()) + 1 if S else 0):
        where = torch.nonzero(segments == s, as_tuple=True)[0]
        if where.numel() == 0:
            continue
        p, n = get_rope_index(tokens[where].tolist(), grids[used:], merge, image_token_id)
        used += n
        pos[:, where] = p
    assert used == len(grids), 'images left over'
    return pos.to(torch.int32)


# --------------------------------------------------------------------------
# Rotary embeddings
# --------------------------------------------------------------------------


def vision_rope_cos_sin(rows: torch.Tensor, cols: torch.Tensor, d: int, theta: float, dtype):
    """2-D rotary: d/4 frequencies theta^(−4k/d); rotate-half pair (j, j + d/2) turns by
    row·f_j for j < d/4 and col·f_(j−d/4) for d/4 ≤ j < d/2. Angles in float64, cos and sin
    rounded once to the compute dtype."""
    k = torch.arange(d // 4, dtype=torch.float64)
    f = theta ** (-4.0 * k / d)
    ang = torch.cat([rows.double()[:, None] * f, cols.double()[:, None] * f], dim=-1)  # [N, d/2]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def mrope_axes(cfg: QwenConfig) -> List[int]:
    """Axis (0 t, 1 h, 2 w) that rotary frequency j < d/2 follows."""
    half = cfg.head_dim // 2
    s_t, s_h, s_w = cfg.mrope_section
    assert s_t + s_h + s_w == half
    if not cfg.mrope_interleaved:  # sectioned: [t × s_t, h × s_h, w × s_w]
        return [0] * s_t + [1] * s_h + [2] * s_w
    axes = []
    for j in range(half):  # interleaved (apply_interleaved_mrope): T H W T H W ... T T
        if j % 3 == 1 and j < 3 * s_h:
            axes.append(1)
        elif j % 3 == 2 and j < 3 * s_w:
            axes.append(2)
        else:
            axes.append(0)
    return axes


def mrope_cos_sin(positions: torch.Tensor, cfg: QwenConfig, dtype):
    """positions [3, S] -> cos, sin [S, d]: angle of pair (j, j + d/2) is
    p_axis(j) · theta^(−2j/d); float64 angles, rounded once."""
    d = cfg.head_dim
    j = torch.arange(d // 2, dtype=torch.float64)
    inv_freq = cfg.rope_theta ** (-2.0 * j / d)
    axes = torch.tensor(mrope_axes(cfg), dtype=torch.long)
    p = positions.to(torch.float64)[axes, :].t()  # [S, d/2]: the position each frequency uses
    ang = p * inv_freq[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x [..., T, d] or [T, heads, d] (cos/sin broadcast accordingly)."""
    return x * cos + tv.rotate_half(x) * sin


# --------------------------------------------------------------------------
# Vision encoder
# --------------------------------------------------------------------------


def softmax_attention(q, k, v, allowed=None):
    """q, k, v [heads, T, d]; explicit softmax(q·kᵀ/√d) v, the softmax in float32 (or in
    float64 for the finite-difference model)."""
    if allowed is None:
        d = q.shape[-1]
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
        return torch.matmul(torch.softmax(scores, dim=-1), v)
    return tv.masked_attention(q, k, v, allowed)


class PatchEmbed(nn.Module):
    """HF's Conv3d(C, Hv, kernel = stride = (T, P, P)): the weight is [Hv, C, T, P, P]; applied
    as the linear map of the flattened (c, t, row, col) patch."""

    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.proj = nn.Conv3d(cfg.in_channels, cfg.v_hidden, kernel_size=(cfg.temporal, cfg.patch, cfg.patch),
                              stride=(cfg.temporal, cfg.patch, cfg.patch), bias=cfg.patch_bias)

    def forward(self, x):
        w = self.proj.weight
        return F.linear(x.to(w.dtype), w.reshape(w.shape[0], -1), self.proj.bias)


class VisionAttention(nn.Module):
    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.heads = cfg.v_heads
        self.qkv = nn.Linear(cfg.v_hidden, 3 * cfg.v_hidden, bias=True)
        self.proj = nn.Linear(cfg.v_hidden, cfg.v_hidden, bias=True)

    def forward(self, x, cos, sin, lengths=None, allowed=None):
        """Attention within consecutive runs of `lengths` tokens (cu_seqlens), or under the
        boolean mask `allowed` [T, T]."""
        T, H = x.shape
        hd = H // self.heads
        q, k, v = self.qkv(x).view(T, 3, self.heads, hd).unbind(1)  # [T, heads, hd]
        q = apply_rope(q, cos[:, None, :], sin[:, None, :])
        k = apply_rope(k, cos[:, None, :], sin[:, None, :])
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # [heads, T, hd]
        if allowed is not None:
            o = softmax_attention(q, k, v, allowed)
        else:
            outs = []
            a = 0
            for n in lengths:
                outs.append(softmax_attention(q[:, a : a + n], k[:, a : a + n], v[:, a : a + n]))
                a += n
            assert a == T
            o = torch.cat(outs, dim=1)
        return self.proj(o.transpose(0, 1).reshape(T, H))


class VisionSwiGLU(nn.Module):
    """Qwen2.5-VL's vision MLP: down(silu(gate(x)) · up(x)), all with biases."""

    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.v_hidden, cfg.v_ffn, bias=True)
        self.up_proj = nn.Linear(cfg.v_hidden, cfg.v_ffn, bias=True)
        self.down_proj = nn.Linear(cfg.v_ffn, cfg.v_hidden, bias=True)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class VisionGeluMLP(nn.Module):
    """Qwen3-VL's vision MLP: linear_fc2(gelu(linear_fc1(x))), GELU tanh (gelu_pytorch_tanh)."""

    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.v_hidden, cfg.v_ffn, bias=True)
        self.linear_fc2 = nn.Linear(cfg.v_ffn, cfg.v_hidden, bias=True)
        self.approximate = 'tanh' if cfg.v_mlp == 'gelu_tanh' else 'none'

    def forward(self, x):
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


def make_norm(kind: str, dim: int, eps: float) -> nn.Module:
    return tv.RMSNorm(dim, eps) if kind == 'rmsnorm' else nn.LayerNorm(dim, eps=eps)


class VisionBlock(nn.Module):
    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.norm1 = make_norm(cfg.v_norm, cfg.v_hidden, cfg.eps)
        self.norm2 = make_norm(cfg.v_norm, cfg.v_hidden, cfg.eps)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionSwiGLU(cfg) if cfg.v_mlp == 'swiglu' else VisionGeluMLP(cfg)

    def forward(self, x, cos, sin, lengths=None, allowed=None):
        x = x + self.attn(self.norm1(x), cos, sin, lengths, allowed)
        return x + self.mlp(self.norm2(x))


class MergerRMS(nn.Module):
    """Qwen2.5-VL's merger: ln_q (RMSNorm) per patch, join each merge block (4·Hv), mlp.0,
    exact GELU, mlp.2."""

    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.unit = cfg.merge * cfg.merge * cfg.v_hidden
        self.ln_q = tv.RMSNorm(cfg.v_hidden, cfg.eps)
        self.mlp = nn.Sequential(nn.Linear(self.unit, self.unit), nn.GELU(), nn.Linear(self.unit, cfg.hidden))

    def forward(self, x):
        return self.mlp(self.ln_q(x).reshape(-1, self.unit))


class MergerLN(nn.Module):
    """Qwen3-VL's merger: LayerNorm `norm` per patch (or, for the deepstack mergers,
    postshuffle: over the joined 4·Hv), linear_fc1, exact GELU, linear_fc2."""

    def __init__(self, cfg: QwenConfig, postshuffle: bool):
        super().__init__()
        self.unit = cfg.merge * cfg.merge * cfg.v_hidden
        self.postshuffle = postshuffle
        self.norm = nn.LayerNorm(self.unit if postshuffle else cfg.v_hidden, eps=cfg.eps)
        self.linear_fc1 = nn.Linear(self.unit, self.unit)
        self.linear_fc2 = nn.Linear(self.unit, cfg.hidden)

    def forward(self, x):
        if self.postshuffle:
            x = self.norm(x.reshape(-1, self.unit))
        else:
            x = self.norm(x).reshape(-1, self.unit)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionModel(nn.Module):
    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        if cfg.pos_table:
            self.pos_embed = nn.Embedding(cfg.pos_table, cfg.v_hidden)
        self.blocks = nn.ModuleList([VisionBlock(cfg) for _ in range(cfg.v_layers)])
        if cfg.family == 'qwen2_5_vl':
            self.merger = MergerRMS(cfg)
        else:
            self.merger = MergerLN(cfg, postshuffle=False)
        if cfg.deepstack:
            self.deepstack_merger_list = nn.ModuleList([MergerLN(cfg, postshuffle=True) for _ in cfg.deepstack])

    def forward(self, pixel_values, grid_thw, mode: str = 'reorder'):
        """pixel_values [N, C·T·P·P], grid_thw [n, 3] -> (merged tokens [N/4, Hd] in image order,
        deepstack outputs [N/4, Hd] each).

        mode 'reorder' (the default): Hugging Face's way. With window attention the merged
        tokens are put in window order (get_window_index), window blocks attend within
        cu_window_seqlens runs and full blocks within each image, and the merger's output is put
        back with argsort(window_index). mode 'mask': merge-block order throughout, attention
        under a mask of equal window ids (window blocks) or equal image ids (full blocks)."""
        cfg = self.cfg
        x = self.patch_embed(pixel_values)
        rows, cols = patch_rows_cols(grid_thw, cfg.merge)
        if cfg.pos_table:
            idx, wts = pos_interp_indices(grid_thw, int(round(math.sqrt(cfg.pos_table))), cfg.merge)
            table = self.pos_embed.weight
            wts = wts.to(table.dtype)
            pe = table[idx[0]] * wts[0][:, None]
            for c in range(1, 4):
                pe = pe + table[idx[c]] * wts[c][:, None]
            x = x + pe
        cos, sin = vision_rope_cos_sin(rows, cols, cfg.v_hidden // cfg.v_heads, cfg.v_rope_theta, x.dtype)
        lengths = image_lengths(grid_thw)
        unit = cfg.merge * cfg.merge
        windowed = cfg.window_size > 0
        if mode == 'reorder':
            win_lengths = None
            if windowed:
                window_index, cu = get_window_index(grid_thw, cfg)
                cu = torch.unique_consecutive(torch.tensor(cu)).tolist()
                win_lengths = [b - a for a, b in zip(cu[:-1], cu[1:])]
                perm = (window_index[:, None] * unit + torch.arange(unit)[None, :]).reshape(-1)
                x, cos, sin = x[perm], cos[perm], sin[perm]
            deep = []
            for b, blk in enumerate(self.blocks):
                full = (not windowed) or b in cfg.fullatt_blocks
                x = blk(x, cos, sin, lengths=lengths if full else win_lengths)
                if b in cfg.deepstack:
                    deep.append(self.deepstack_merger_list[cfg.deepstack.index(b)](x))
            y = self.merger(x)
            if windowed:
                back = torch.argsort(window_index)
                y = y[back]
                deep = [d[back] for d in deep]
            return y, deep
        assert mode == 'mask'
        image_id = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])
        full_allowed = image_id[:, None] == image_id[None, :]
        win_allowed = None
        if windowed:
            wid = window_segments(grid_thw, cfg).long()
            win_allowed = wid[:, None] == wid[None, :]
        deep = []
        for b, blk in enumerate(self.blocks):
            full = (not windowed) or b in cfg.fullatt_blocks
            x = blk(x, cos, sin, allowed=full_allowed if full else win_allowed)
            if b in cfg.deepstack:
                deep.append(self.deepstack_merger_list[cfg.deepstack.index(b)](x))
        return self.merger(x), deep


# --------------------------------------------------------------------------
# Decoder
# --------------------------------------------------------------------------


class TextAttention(nn.Module):
    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.heads * d, cfg.hidden, bias=False)
        if cfg.qk_norm:
            self.q_norm = tv.RMSNorm(d, cfg.eps)
            self.k_norm = tv.RMSNorm(d, cfg.eps)

    def forward(self, x, cos, sin, allowed):
        cfg = self.cfg
        T, d = x.shape[0], cfg.head_dim
        q = self.q_proj(x).view(T, cfg.heads, d)
        k = self.k_proj(x).view(T, cfg.kv_heads, d)
        v = self.v_proj(x).view(T, cfg.kv_heads, d)
        if cfg.qk_norm:  # per head, before the rotary
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # [heads, T, d]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        g = cfg.heads // cfg.kv_heads  # KV head h serves query heads h·g … h·g+g−1
        k, v = k.repeat_interleave(g, dim=0), v.repeat_interleave(g, dim=0)
        o = tv.masked_attention(q, k, v, allowed)
        return self.o_proj(o.transpose(0, 1).reshape(T, cfg.heads * d))


class FusedExperts(nn.Module):
    """Qwen3-VL-MoE's checkpoint layout: gate_up_proj [E, H, 2F] (expert e's gate is
    [e, :, :F], its up [e, :, F:]), down_proj [E, F, H]; expert e computes
    (silu(x·G) · (x·U))·D."""

    def __init__(self, cfg: QwenConfig):
        super().__init__()
        E, H, Fe = cfg.experts, cfg.hidden, cfg.expert_ffn
        self.ffn = Fe
        self.gate_up_proj = nn.Parameter(torch.zeros(E, H, 2 * Fe))
        self.down_proj = nn.Parameter(torch.zeros(E, Fe, H))

    def expert(self, e: int, x):
        gu = x @ self.gate_up_proj[e]
        return (F.silu(gu[:, : self.ffn]) * gu[:, self.ffn :]) @ self.down_proj[e]


class SparseMoE(nn.Module):
    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(cfg.hidden, cfg.experts, bias=False)  # router
        self.experts = FusedExperts(cfg)

    def forward(self, x, nonpad):
        """Softmax over the router logits, top-k through a stable descending sort (ties to the
        lower expert index), renormalised (norm_topk_prob), weighted sum of the chosen experts.
        Returns (out, E·Σ fₑ·Pₑ over the non-padding tokens, min p_k − p_(k+1))."""
        cfg = self.cfg
        E, k = cfg.experts, cfg.top_k
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1)  # float32 (float64 in the finite-difference model)
        sorted_p, order = torch.sort(probs.detach(), dim=-1, descending=True, stable=True)
        chosen = order[:, :k]
        top = probs.gather(1, chosen)
        weights = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(E):
            tok, slot = torch.nonzero(chosen == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            out = out.index_add(0, tok, self.experts.expert(e, x[tok]) * weights[tok, slot][:, None])
        n = int(nonpad.sum())
        counts = torch.bincount(chosen[nonpad].reshape(-1), minlength=E).to(x.dtype)
        f = counts / (n * k)
        P = probs[nonpad].mean(0)
        aux = E * (f * P).sum()
        margin = (sorted_p[nonpad, k - 1] - sorted_p[nonpad, k]).min().item()
        return out, aux, margin


class DecoderLayer(nn.Module):
    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.self_attn = TextAttention(cfg)
        self.moe = cfg.experts > 0
        self.mlp = SparseMoE(cfg) if self.moe else tv.SwiGLU(cfg.hidden, cfg.ffn)
        self.input_layernorm = tv.RMSNorm(cfg.hidden, cfg.eps)
        self.post_attention_layernorm = tv.RMSNorm(cfg.hidden, cfg.eps)

    def forward(self, x, cos, sin, allowed, nonpad):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, allowed)
        h = self.post_attention_layernorm(x)
        if self.moe:
            y, aux, margin = self.mlp(h, nonpad)
        else:
            y, aux, margin = self.mlp(h), None, None
        return x + y, aux, margin


class TextModel(nn.Module):
    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.layers)])
        self.norm = tv.RMSNorm(cfg.hidden, cfg.eps)


class _Inner(nn.Module):
    """Qwen3-VL's `model`: model.visual.*, model.language_model.*."""

    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.visual = VisionModel(cfg)
        self.language_model = TextModel(cfg)


class QwenVL(nn.Module):
    """Parameter names are the Hugging Face checkpoint names of the family:
    Qwen2.5-VL `visual.*`, `model.*`; Qwen3-VL `model.visual.*`, `model.language_model.*`;
    `lm_head.weight` unless tied."""

    def __init__(self, cfg: QwenConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.family == 'qwen2_5_vl':
            self.visual = VisionModel(cfg)
            self.model = TextModel(cfg)
        else:
            self.model = _Inner(cfg)
        if not cfg.tied:
            self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    @property
    def vision(self) -> VisionModel:
        return self.visual if self.cfg.family == 'qwen2_5_vl' else self.model.visual

    @property
    def text(self) -> TextModel:
        return self.model if self.cfg.family == 'qwen2_5_vl' else self.model.language_model

    def forward(self, mb, vision_mode: str = 'reorder'):
        """One microbatch of the batch contract -> (logits [S, V], Σ_layers aux or None,
        min top-k margin or None)."""
        cfg = self.cfg
        tokens = mb['tokens'].long()
        text = self.text
        x = text.embed_tokens(tokens)
        is_img = tokens == int(mb['image_token_id'])
        idx = torch.nonzero(is_img, as_tuple=True)[0]
        deep = []
        if mb['pixel_values'].shape[0] > 0:
            vis, deep = self.vision(mb['pixel_values'], mb['image_grid_thw'].long(), vision_mode)
            assert vis.shape[0] == idx.numel(), 'placeholders != merged tokens'
            x = x.index_copy(0, idx, vis.to(x.dtype))  # replaced in order
        else:
            assert idx.numel() == 0
        cos, sin = mrope_cos_sin(mb['positions'], cfg, x.dtype)
        allowed = tv.decoder_mask(mb['segments'])
        nonpad = mb['segments'] >= 0
        aux_total, margin = None, None
        for i, layer in enumerate(text.layers):
            x, aux, m = layer(x, cos, sin, allowed, nonpad)
            if i < len(deep):  # deepstack j after decoder layer j, at the visual positions
                x = x.index_add(0, idx, deep[i].to(x.dtype))
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
                margin = m if margin is None else min(margin, m)
        h = text.norm(x)
        logits = F.linear(h, text.embed_tokens.weight) if cfg.tied else self.lm_head(h)
        return logits, aux_total, margin


def global_loss(model: QwenVL, batch: List[dict], vision_mode: str = 'reorder'):
    """tiny-vlm.md's loss: Σ CE over the masked-in positions of the global batch / their
    count + aux_coef × mean over microbatches of Σ_layers E·Σₑ fₑ·Pₑ."""
    if vision_mode == 'reorder':
        return tv.global_loss(model, batch)

    class _M:  # the same loss through the mask-by-window-id vision path
        cfg = model.cfg

        def __call__(self, mb):
            return model(mb, vision_mode)

    return tv.global_loss(_M(), batch)


# --------------------------------------------------------------------------
# Init
# --------------------------------------------------------------------------


def init_weights(model: QwenVL, seed: int) -> None:
    """tiny_vlm.py's distributions, each parameter from its own generator seeded with
    seed · 1000003 + crc32(HF name): norm weights (RMSNorm, LayerNorm, q/k norms)
    1 + N(0, 0.1); LayerNorm biases N(0, 0.02); router mlp.gate.weight N(0, 0.1); everything
    else (linear and conv weights and biases, fused experts, embeddings, the position table)
    N(0, 0.02)."""
    tv.init_weights(model, seed)


# --------------------------------------------------------------------------
# Batch
# --------------------------------------------------------------------------


def make_batch(seed: int, cfg: QwenConfig) -> List[dict]:
    """tiny_vlm.make_batch(seed)'s samples and images, in the batch contract, with two
    changes: mb0's two image samples are joined into one sample holding two images with text
    between them (caption and filler of the first), and mb1's two samples are swapped, so that
    its image sample starts after a text-only one (its ids restart at 0). mb2 (three text-only
    samples, no image) is unchanged. Labels and loss masks are tiny_vlm.pack's rules."""
    tb = tv.make_batch(seed)

    def samples(mb):
        n = int(mb['segments'].max()) + 1
        return [mb['tokens'][mb['segments'] == s].tolist() for s in range(n)]

    s0, s1, s2 = samples(tb[0]), samples(tb[1]), samples(tb[2])
    layout = [
        ([s0[0] + s0[1]], tb[0]['images']),
        ([s1[1], s1[0]], tb[1]['images']),
        (s2, tb[2]['images']),
    ]
    batch = []
    for toks, images in layout:
        mb = tv.pack(toks, cfg.seq)
        if images:
            pv = torch.cat([pixel_patches(im, cfg) for im in images])
            grid = torch.tensor([grid_of(im, cfg) for im in images], dtype=torch.int32)
        else:
            pv = torch.zeros(0, cfg.patch_dim)
            grid = torch.zeros(0, 3, dtype=torch.int32)
        mb['positions'] = mrope_positions(mb['tokens'], mb['segments'], grid, cfg.merge, cfg.image_token_id)
        mb['pixel_values'] = pv
        mb['image_grid_thw'] = grid
        if cfg.window_size:
            mb['window_segments'] = window_segments(grid, cfg)
        mb['image_token_id'] = torch.tensor(cfg.image_token_id, dtype=torch.int32)
        mb['images'] = images  # kept for the summary, not written
        batch.append(mb)
    return batch


BATCH_FIELDS = ('tokens', 'labels', 'loss_mask', 'segments', 'positions', 'pixel_values',
                'image_grid_thw', 'window_segments', 'image_token_id')


def batch_tensors(batch: List[dict]) -> Dict[str, torch.Tensor]:
    out = {}
    for j, mb in enumerate(batch):
        for key in BATCH_FIELDS:
            if key in mb:
                out[f'mb{j}.{key}'] = mb[key]
    return out


def batch_from_tensors(t: Dict[str, torch.Tensor]) -> List[dict]:
    n = 1 + max(int(k.split('.')[0][2:]) for k in t if k.startswith('mb'))
    batch = []
    for j in range(n):
        mb = {k.split('.', 1)[1]: v for k, v in t.items() if k.startswith(f'mb{j}.')}
        if 'pixel_values' not in mb:
            mb['pixel_values'] = torch.zeros(0, 1)
            mb['image_grid_thw'] = torch.zeros(0, 3, dtype=torch.int32)
        if 'image_token_id' not in mb:
            mb['image_token_id'] = torch.tensor(IMAGE_TOKEN, dtype=torch.int32)
        batch.append(mb)
    return batch


def batch_to(batch: List[dict], dtype) -> List[dict]:
    return [dict(mb, pixel_values=mb['pixel_values'].to(dtype)) for mb in batch]


# --------------------------------------------------------------------------
# Training step
# --------------------------------------------------------------------------


def build(name_or_cfg, seed: int) -> QwenVL:
    cfg = CONFIGS[name_or_cfg] if isinstance(name_or_cfg, str) else name_or_cfg
    torch.manual_seed(0)  # construction only; init_weights overwrites every parameter
    model = QwenVL(cfg)
    init_weights(model, seed)
    return model


def run_model(name: str, seed: int, batch: List[dict], watch: List[str]):
    model = build(name, seed)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = tv.make_optimizer(model)
    params = dict(model.named_parameters())
    res = {'weights': weights, 'losses': [], 'grad_norms': [], 'margins': [], 'clipped': []}
    for step in range(NUM_STEPS):
        opt.zero_grad(set_to_none=True)
        loss, ce, aux, n_tok, margin = global_loss(model, batch)
        loss.backward()
        for p in model.parameters():  # nothing is left without a gradient (see tiny_vlm.py)
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        if step == 0:
            res['grads'] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
            res['loss'], res['ce_loss'], res['aux_loss'] = float(loss), float(ce), float(aux)
            res['loss_tokens'] = n_tok
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIMIZER['clip_norm'])
        res['losses'].append(float(loss))
        res['grad_norms'].append(float(gn))
        res['margins'].append(margin)
        res['clipped'].append({n: params[n].grad.detach().clone() for n in watch if n in params})
        opt.step()
    res['params_step3'] = {n: p.detach().clone() for n, p in model.named_parameters()}
    res['grad_norm'] = res['grad_norms'][0]
    return res


# --------------------------------------------------------------------------
# Self-checks
# --------------------------------------------------------------------------

FD_PICKS = {
    'qwen2.5-vl-tiny': [
        'visual.patch_embed.proj.weight',
        'visual.blocks.0.attn.qkv.weight',  # window block, through the 2-D rotary
        'visual.blocks.0.attn.qkv.bias',
        'visual.blocks.2.attn.proj.weight',  # window block
        'visual.blocks.1.attn.qkv.weight',  # full-attention block
        'visual.blocks.3.attn.proj.bias',
        'visual.blocks.0.norm1.weight',
        'visual.blocks.2.mlp.gate_proj.weight',
        'visual.blocks.1.mlp.up_proj.bias',
        'visual.blocks.3.mlp.down_proj.bias',
        'visual.merger.ln_q.weight',
        'visual.merger.mlp.0.weight',
        'visual.merger.mlp.2.bias',
        'model.embed_tokens.weight',  # tied with the output
        'model.layers.0.self_attn.q_proj.bias',
        'model.layers.1.self_attn.k_proj.weight',
        'model.layers.2.self_attn.v_proj.bias',
        'model.layers.3.self_attn.o_proj.weight',
        'model.layers.1.mlp.down_proj.weight',
        'model.layers.0.input_layernorm.weight',
        'model.norm.weight',
    ],
    'qwen3-vl-moe-tiny': [
        'model.visual.patch_embed.proj.weight',
        'model.visual.patch_embed.proj.bias',
        'model.visual.pos_embed.weight',
        'model.visual.blocks.0.attn.qkv.weight',
        'model.visual.blocks.2.attn.qkv.bias',
        'model.visual.blocks.1.norm1.bias',
        'model.visual.blocks.2.mlp.linear_fc1.weight',
        'model.visual.merger.norm.weight',
        'model.visual.merger.linear_fc2.weight',
        'model.visual.deepstack_merger_list.0.norm.weight',
        'model.visual.deepstack_merger_list.0.linear_fc1.weight',
        'model.visual.deepstack_merger_list.1.norm.bias',
        'model.visual.deepstack_merger_list.1.linear_fc2.bias',
        'model.language_model.embed_tokens.weight',
        'model.language_model.layers.0.self_attn.q_norm.weight',
        'model.language_model.layers.1.self_attn.k_norm.weight',
        'model.language_model.layers.2.self_attn.k_proj.weight',
        'model.language_model.layers.1.mlp.gate.weight',
        'model.language_model.layers.2.mlp.experts.gate_up_proj',
        'model.language_model.layers.0.mlp.experts.down_proj',
        'model.language_model.layers.3.post_attention_layernorm.weight',
        'model.language_model.norm.weight',
        'lm_head.weight',
    ],
}


def fd_check(name: str, seed: int, batch: List[dict], n_coords: int = 3, h: float = 1e-6):
    """Central differences in float64 vs autograd on a few coordinates of each picked
    parameter (3 random ones and the one of largest gradient). Error |fd − ad| / (|ad| + 1e-4)."""
    model = build(name, seed).double()
    b64 = batch_to(batch, torch.float64)
    loss = global_loss(model, b64)[0]
    model.zero_grad()
    loss.backward()
    params = dict(model.named_parameters())
    rng = random.Random(seed + 99)
    worst, lines = 0.0, []
    for pname in FD_PICKS[name]:
        p = params[pname]
        g = p.grad.reshape(-1)
        coords = rng.sample(range(p.numel()), n_coords)
        top = int(g.abs().argmax())
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
            err = abs(fd - ad) / (abs(ad) + 1e-4)
            worst = max(worst, err)
            lines.append(f'    {pname}[{c}]: autograd {ad:+.9e} fd {fd:+.9e} err {err:.1e}')
    return worst, lines


def hf_style_window_index(grid_thw: torch.Tensor, cfg: QwenConfig):
    """get_window_index the way HF's code computes it (pad with −100, reshape into windows,
    drop the padding), for comparison with the loop version above."""
    s = cfg.window_size // cfg.merge // cfg.patch
    index_parts, cu, base = [], [0], 0
    for t, h, w in grid_thw.tolist():
        hm, wm = h // cfg.merge, w // cfg.merge
        ph, pw = s - hm % s, s - wm % s
        idx = torch.arange(t * hm * wm).reshape(t, hm, wm)
        padded = F.pad(idx, (0, pw, 0, ph), 'constant', -100)
        nh, nw = (hm + ph) // s, (wm + pw) // s
        win = padded.reshape(t, nh, s, nw, s).permute(0, 1, 3, 2, 4).reshape(t, nh * nw, s, s)
        counts = (win != -100).sum([2, 3]).reshape(-1)
        flat = win.reshape(-1)
        index_parts.append(flat[flat != -100] + base)
        cu += (counts.cumsum(0) * cfg.merge ** 2 + cu[-1]).tolist()
        base += t * hm * wm
    return torch.cat(index_parts), cu


def check_rope_index() -> Tuple[bool, str]:
    """A hand-worked microbatch: sample 0 = text 5 6, image A (merged 2×2), text 7 8, image B
    (merged 1×2), text 9; sample 1 = image C (merged 2×3) first, then text 11 12; 3 padding."""
    I = IMAGE_TOKEN
    s0 = [5, 6] + [I] * 4 + [7, 8] + [I] * 2 + [9]
    s1 = [I] * 6 + [11, 12]
    tokens = torch.tensor(s0 + s1 + [0] * 3, dtype=torch.int32)
    segments = torch.tensor([0] * len(s0) + [1] * len(s1) + [-1] * 3, dtype=torch.int32)
    grid = torch.tensor([[1, 4, 4], [1, 2, 4], [1, 4, 6]], dtype=torch.int32)
    got = mrope_positions(tokens, segments, grid, 2, I).tolist()
    want = [
        # 5 6  A A A A  7 8  B B  9 | C C C C C C  11 12 | pad
        [0, 1, 2, 2, 2, 2, 4, 5, 6, 6, 8, 0, 0, 0, 0, 0, 0, 3, 4, 0, 0, 0],  # t
        [0, 1, 2, 2, 3, 3, 4, 5, 6, 6, 8, 0, 0, 0, 1, 1, 1, 3, 4, 0, 0, 0],  # h
        [0, 1, 2, 3, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 0, 1, 2, 3, 4, 0, 0, 0],  # w
    ]
    return got == want, f'got {got}'


def check_windows(cfg: QwenConfig) -> Tuple[bool, List[str]]:
    lines, ok = [], True
    # merged grid 3×4 (grid h = 6, w = 8 patches): HF pads it to 4×6 merged tokens, 2×3 windows
    # of which the last column and half the second row are padding
    g1 = torch.tensor([[1, 6, 8]])
    wi, cu = get_window_index(g1, cfg)
    want_wi = [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 10, 11]
    want_cu = [0, 16, 32, 32, 40, 48, 48]
    good = wi.tolist() == want_wi and cu == want_cu
    ok &= good
    lines.append(f'  get_window_index merged 3×4 vs hand-worked arrays: {"ok" if good else "FAIL"} ({wi.tolist()}, {cu})')
    # several images of different shapes (padding in rows, columns, both, none)
    grids = [g1, torch.tensor([[1, 6, 8], [1, 2, 6], [1, 8, 4], [1, 4, 4], [1, 8, 8], [1, 2, 2]])]
    for g in grids:
        wi, cu = get_window_index(g, cfg)
        hwi, hcu = hf_style_window_index(g, cfg)
        same = torch.equal(wi, hwi) and cu == hcu
        # the window id of each merged token from the reorder must be the contract's window id
        cu_u = torch.unique_consecutive(torch.tensor(cu)).tolist()
        unit = cfg.merge ** 2
        from_reorder = torch.empty(wi.numel(), dtype=torch.long)
        for k, (a, b) in enumerate(zip(cu_u[:-1], cu_u[1:])):
            from_reorder[wi[a // unit : b // unit]] = k
        ids = window_segments(g, cfg).long().view(-1, unit)
        same_ids = bool((ids == ids[:, :1]).all()) and torch.equal(ids[:, 0], from_reorder)
        ok &= same and same_ids
        lines.append(f'  window index vs HF-style pad/reshape {g.tolist()}: {"ok" if same else "FAIL"}; '
                     f'window_segments vs reorder windows: {"ok" if same_ids else "FAIL"}')
    return ok, lines


def check_pos_interp(cfg: QwenConfig) -> Tuple[bool, str]:
    """The interpolated table equals bilinear interpolation with aligned corners (what
    linspace(0, n−1, h) means), put in merge-block order."""
    n = int(round(math.sqrt(cfg.pos_table)))
    g = torch.Generator().manual_seed(5)
    table = torch.randn(n * n, 8, generator=g, dtype=torch.float64)
    worst = 0.0
    for h, w in ((2, 2), (2, 6), (4, 8), (6, 4), (8, 8), (6, 6)):
        grid = torch.tensor([[1, h, w]])
        idx, wts = pos_interp_indices(grid, n, cfg.merge)
        mine = sum(table[idx[c]] * wts[c].double()[:, None] for c in range(4))
        img = table.t().reshape(1, 8, n, n)
        ref = F.interpolate(img, size=(h, w), mode='bilinear', align_corners=True)[0]  # [8, h, w]
        rows, cols = patch_rows_cols(grid, cfg.merge)
        ref = ref[:, rows, cols].t()
        worst = max(worst, (mine - ref).abs().max().item())
    return worst < 1e-6, f'max abs diff {worst:.1e}'


def check_patches(cfg: QwenConfig) -> Tuple[bool, str]:
    """pixel_values against a naive loop, and the linear patch embedding against Conv3d."""
    img = torch.arange(3 * 24 * 32, dtype=torch.float32).view(3, 24, 32)
    pv = pixel_patches(img, cfg)
    naive = []
    for br in range(3):
        for bc in range(4):
            for i in range(2):
                for j in range(2):
                    r, c = 2 * br + i, 2 * bc + j
                    p = img[:, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4]  # [3, 4, 4]
                    naive.append(torch.stack([p, p], dim=1).reshape(-1))  # (c, t, row, col)
    same = torch.equal(pv, torch.stack(naive))
    model = build(cfg.name, 0)
    pe = model.vision.patch_embed
    x = torch.randn(10, cfg.patch_dim, generator=torch.Generator().manual_seed(1))
    conv = pe.proj(x.view(-1, cfg.in_channels, cfg.temporal, cfg.patch, cfg.patch)).view(10, -1)
    diff = (conv - pe(x)).abs().max().item()
    return same and diff < 1e-5, f'order {"ok" if same else "FAIL"}, conv3d vs linear max abs diff {diff:.1e}'


def check_reorder_vs_mask(name: str, seed: int, batch: List[dict]) -> Tuple[bool, str]:
    """Vision outputs and the loss through HF's window reorder vs through a mask of equal
    window ids in merge-block order (float64), over every microbatch with images, plus a few
    extra image shapes."""
    model = build(name, seed).double()
    cfg = model.cfg
    worst = 0.0
    grids = [mb['image_grid_thw'] for mb in batch if mb['image_grid_thw'].shape[0]]
    grids.append(torch.tensor([[1, 6, 8], [1, 2, 6], [1, 8, 4], [1, 8, 8], [1, 2, 2]], dtype=torch.int32))
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for grid in grids:
            n = int(grid.long().prod(-1).sum())
            pv = torch.rand(n, cfg.patch_dim, generator=g, dtype=torch.float64)
            a, da = model.vision(pv, grid.long(), 'reorder')
            b, db = model.vision(pv, grid.long(), 'mask')
            worst = max(worst, (a - b).abs().max().item() / b.abs().max().item())
        b64 = batch_to(batch, torch.float64)
        la = float(global_loss(model, b64, 'reorder')[0])
        lb = float(global_loss(model, b64, 'mask')[0])
    return worst < 1e-12 and abs(la - lb) < 1e-12, f'vision max rel diff {worst:.1e}, loss diff {abs(la - lb):.1e}'


def check_mrope_axes() -> Tuple[bool, str]:
    a25 = mrope_axes(CONFIGS['qwen2.5-vl-tiny'])
    a3 = mrope_axes(CONFIGS['qwen3-vl-moe-tiny'])
    ok = a25 == [0, 0, 1, 1, 1, 2, 2, 2] and a3 == [0, 1, 2, 0, 1, 2, 0, 0]
    # Qwen3-VL at full size: [24, 20, 20] over 64 frequencies
    full = mrope_axes(replace(CONFIGS['qwen3-vl-moe-tiny'], head_dim=128, mrope_section=(24, 20, 20)))
    ok &= full[:6] == [0, 1, 2, 0, 1, 2] and full[57:] == [0, 1, 2, 0, 0, 0, 0] and full.count(1) == 20 \
        and full.count(2) == 20
    return ok, f'qwen2.5 {a25}, qwen3 {a3}'


# --------------------------------------------------------------------------
# --load-hf: a Hugging Face model directory
# --------------------------------------------------------------------------

_ST_DTYPES = {'F32': torch.float32, 'F64': torch.float64, 'F16': torch.float16, 'I32': torch.int32,
              'I64': torch.int64, 'U8': torch.uint8, 'I8': torch.int8, 'BOOL': torch.bool}


def read_safetensors_any(path: str) -> Dict[str, torch.Tensor]:
    """Like tiny_vlm.load_safetensors, also reading BF16/F16/I64 (converted to float32 for
    floating dtypes)."""
    with open(path, 'rb') as f:
        raw = f.read()
    (n,) = struct.unpack('<Q', raw[:8])
    header = json.loads(raw[8 : 8 + n].decode('utf-8'))
    body = raw[8 + n :]
    out = {}
    for name, info in header.items():
        if name == '__metadata__':
            continue
        a, b = info['data_offsets']
        buf = bytearray(body[a:b])
        shape = info['shape']
        if info['dtype'] == 'BF16':
            t = torch.frombuffer(buf, dtype=torch.int16) if buf else torch.empty(0, dtype=torch.int16)
            t = (t.to(torch.int32) << 16).view(torch.float32).reshape(shape).clone()
        else:
            dtype = _ST_DTYPES[info['dtype']]
            t = torch.frombuffer(buf, dtype=dtype).reshape(shape).clone() if buf else torch.empty(shape, dtype=dtype)
            if t.dtype == torch.float16:
                t = t.float()
        out[name] = t
    return out


# Hugging Face's defaults for keys a config.json may leave out (configuration_qwen2_5_vl.py,
# configuration_qwen3_vl_moe.py); `--load-hf` reports which ones it had to use.
HF_DEFAULTS = {
    'qwen2_5_vl': {'rms_norm_eps': 1e-5, 'rope_theta': 1e6, 'tie_word_embeddings': False,
                   'image_token_id': 151655, 'mrope_section': [16, 24, 24]},
    'qwen3_vl': {'rms_norm_eps': 1e-6, 'rope_theta': 5e5, 'tie_word_embeddings': False,
                 'image_token_id': 151655, 'mrope_section': [24, 20, 20], 'router_aux_loss_coef': 0.001},
}


def config_from_hf(conf: dict) -> Tuple[QwenConfig, List[str]]:
    """A QwenConfig from an HF config.json (Qwen2_5_VL, Qwen3_VL or Qwen3_VL_Moe; text keys at
    the top level or under text_config; rope_scaling or rope_parameters), and the keys that
    were missing and took HF's default."""
    mt = conf.get('model_type', '')
    arch = ' '.join(conf.get('architectures', []))
    if mt.startswith('qwen2_5_vl') or 'Qwen2_5_VL' in arch:
        family = 'qwen2_5_vl'
    elif mt.startswith('qwen3_vl') or 'Qwen3VL' in arch:
        family = 'qwen3_vl'
    else:
        raise ValueError(f'unsupported model_type {mt!r} / architectures {arch!r}')
    text = dict(conf)
    text.update(conf.get('text_config') or {})
    vis = conf['vision_config']
    rope = text.get('rope_scaling') or text.get('rope_parameters') or {}
    defaults_used = []

    def get(key, *where):
        for d in where:
            if key in d and d[key] is not None:
                return d[key]
        defaults_used.append(key)
        return HF_DEFAULTS[family][key]

    heads = text['num_attention_heads']
    head_dim = text.get('head_dim') or text['hidden_size'] // heads
    experts = 0
    if family == 'qwen3_vl':
        experts = int(text.get('num_experts', text.get('num_local_experts', 0)) or 0)
    if experts:
        assert text.get('decoder_sparse_step', 1) == 1 and not text.get('mlp_only_layers'), 'every layer MoE only'
    act = vis.get('hidden_act', 'silu')
    cfg = QwenConfig(
        name=conf.get('_name_or_path') or mt,
        family=family,
        in_channels=vis.get('in_channels', vis.get('in_chans', 3)),
        patch=vis['patch_size'],
        temporal=vis.get('temporal_patch_size', 2),
        merge=vis.get('spatial_merge_size', 2),
        v_hidden=vis['hidden_size'],
        v_heads=vis['num_heads'],
        v_layers=vis['depth'],
        v_ffn=vis['intermediate_size'],
        v_norm='rmsnorm' if family == 'qwen2_5_vl' else 'layernorm',
        v_mlp='swiglu' if family == 'qwen2_5_vl' else ('gelu_tanh' if 'tanh' in act else 'gelu'),
        patch_bias=family == 'qwen3_vl',
        pos_table=vis.get('num_position_embeddings', 0) if family == 'qwen3_vl' else 0,
        window_size=vis.get('window_size', 0) if family == 'qwen2_5_vl' else 0,
        fullatt_blocks=tuple(vis.get('fullatt_block_indexes', ())) if family == 'qwen2_5_vl' else (),
        deepstack=tuple(vis.get('deepstack_visual_indexes', ())) if family == 'qwen3_vl' else (),
        hidden=text['hidden_size'],
        layers=text['num_hidden_layers'],
        heads=heads,
        kv_heads=text.get('num_key_value_heads') or heads,
        head_dim=head_dim,
        ffn=text.get('intermediate_size', 0),
        experts=experts,
        top_k=text.get('num_experts_per_tok', 2),
        expert_ffn=text.get('moe_intermediate_size', 0),
        aux_coef=get('router_aux_loss_coef', text) if experts else 0.0,
        qkv_bias=True if family == 'qwen2_5_vl' else bool(text.get('attention_bias', False)),
        qk_norm=family == 'qwen3_vl',
        mrope_section=tuple(get('mrope_section', rope)),
        mrope_interleaved=bool(rope.get('mrope_interleaved', family == 'qwen3_vl')),
        rope_theta=float(get('rope_theta', rope, text)),
        vocab=text['vocab_size'],
        tied=bool(get('tie_word_embeddings', conf, conf.get('text_config') or {})),
        eps=get('rms_norm_eps', text),
        image_token_id=get('image_token_id', conf, text),
    )
    return cfg, defaults_used


def hf_config(cfg: QwenConfig) -> dict:
    """An HF config.json for a QwenConfig (transformers 4.57 layout: text keys under
    text_config, rope_scaling with mrope_section)."""
    vision = {
        'depth': cfg.v_layers, 'hidden_size': cfg.v_hidden, 'intermediate_size': cfg.v_ffn,
        'num_heads': cfg.v_heads, 'in_channels': cfg.in_channels, 'out_hidden_size': cfg.hidden,
        'patch_size': cfg.patch, 'spatial_merge_size': cfg.merge, 'temporal_patch_size': cfg.temporal,
        'initializer_range': 0.02,
    }
    text = {
        'hidden_size': cfg.hidden, 'num_hidden_layers': cfg.layers, 'num_attention_heads': cfg.heads,
        'num_key_value_heads': cfg.kv_heads, 'head_dim': cfg.head_dim, 'intermediate_size': cfg.ffn,
        'vocab_size': cfg.vocab, 'rms_norm_eps': cfg.eps, 'rope_theta': cfg.rope_theta, 'hidden_act': 'silu',
        'tie_word_embeddings': cfg.tied, 'max_position_embeddings': 4096,
        'rope_scaling': {'rope_type': 'default', 'mrope_section': list(cfg.mrope_section)},
    }
    if cfg.family == 'qwen2_5_vl':
        vision.update({'hidden_act': 'silu', 'window_size': cfg.window_size,
                       'fullatt_block_indexes': list(cfg.fullatt_blocks), 'tokens_per_second': 2})
        text.update({'model_type': 'qwen2_5_vl_text', 'rope_scaling': dict(text['rope_scaling'], type='mrope')})
        arch, mt = 'Qwen2_5_VLForConditionalGeneration', 'qwen2_5_vl'
    else:
        vision.update({'hidden_act': 'gelu_pytorch_tanh' if cfg.v_mlp == 'gelu_tanh' else 'gelu',
                       'num_position_embeddings': cfg.pos_table,
                       'deepstack_visual_indexes': list(cfg.deepstack)})
        text['rope_scaling']['mrope_interleaved'] = cfg.mrope_interleaved
        text['attention_bias'] = cfg.qkv_bias
        if cfg.experts:
            text.update({'model_type': 'qwen3_vl_moe_text', 'num_experts': cfg.experts,
                         'num_experts_per_tok': cfg.top_k, 'moe_intermediate_size': cfg.expert_ffn,
                         'norm_topk_prob': True, 'decoder_sparse_step': 1, 'mlp_only_layers': [],
                         'router_aux_loss_coef': cfg.aux_coef})
            arch, mt = 'Qwen3VLMoeForConditionalGeneration', 'qwen3_vl_moe'
        else:
            text['model_type'] = 'qwen3_vl_text'
            arch, mt = 'Qwen3VLForConditionalGeneration', 'qwen3_vl'
    return {'architectures': [arch], 'model_type': mt, 'image_token_id': cfg.image_token_id,
            'tie_word_embeddings': cfg.tied, 'torch_dtype': 'float32', 'text_config': text,
            'vision_config': vision}


def write_hf_dir(d: str, cfg: QwenConfig, weights: Dict[str, torch.Tensor], shards: int = 1) -> None:
    """config.json and model.safetensors (or `shards` files and model.safetensors.index.json)."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'config.json'), 'w') as f:
        json.dump(hf_config(cfg), f, indent=2)
        f.write('\n')
    names = sorted(weights)
    if shards == 1:
        tv.save_safetensors(os.path.join(d, 'model.safetensors'), weights)
        return
    weight_map = {}
    for i in range(shards):
        fname = f'model-{i + 1:05d}-of-{shards:05d}.safetensors'
        part = {n: weights[n] for n in names[i::shards]}
        tv.save_safetensors(os.path.join(d, fname), part)
        weight_map.update({n: fname for n in part})
    with open(os.path.join(d, 'model.safetensors.index.json'), 'w') as f:
        json.dump({'metadata': {}, 'weight_map': weight_map}, f, indent=2, sort_keys=True)
        f.write('\n')


def load_hf_weights(d: str) -> Dict[str, torch.Tensor]:
    single = os.path.join(d, 'model.safetensors')
    if os.path.exists(single):
        return read_safetensors_any(single)
    with open(os.path.join(d, 'model.safetensors.index.json')) as f:
        index = json.load(f)
    out = {}
    for shard in sorted(set(index['weight_map'].values())):
        out.update(read_safetensors_any(os.path.join(d, shard)))
    return out


def load_hf(d: str) -> Tuple[QwenVL, List[str]]:
    with open(os.path.join(d, 'config.json')) as f:
        cfg, defaults_used = config_from_hf(json.load(f))
    model = QwenVL(cfg)
    sd = load_hf_weights(d)
    # Qwen2.5-VL is also saved with the newer names model.visual.* / model.language_model.*
    if cfg.family == 'qwen2_5_vl':
        sd = {('visual.' + k[len('model.visual.'):]) if k.startswith('model.visual.') else
              ('model.' + k[len('model.language_model.'):]) if k.startswith('model.language_model.') else k: v
              for k, v in sd.items()}
    if cfg.tied:
        sd.pop('lm_head.weight', None)
    want = dict(model.named_parameters())
    for k, p in want.items():  # fused experts saved transposed (the in-memory layout of HF v5)
        if k in sd and sd[k].dim() == 3 and tuple(sd[k].shape) != tuple(p.shape) \
                and tuple(sd[k].shape) == (p.shape[0], p.shape[2], p.shape[1]):
            sd[k] = sd[k].transpose(1, 2).contiguous()
    missing = sorted(set(want) - set(sd))
    extra = sorted(set(sd) - set(want))
    if missing or extra:
        raise ValueError(f'checkpoint names differ: missing {missing[:8]}, unexpected {extra[:8]}')
    with torch.no_grad():
        for k, p in want.items():
            if tuple(sd[k].shape) != tuple(p.shape):
                raise ValueError(f'{k}: shape {list(sd[k].shape)}, want {list(p.shape)}')
            p.copy_(sd[k].to(p.dtype))
    return model, defaults_used


def hf_loss(model_dir: str, batch_path: str) -> dict:
    """lfc's loss (CE + aux as tiny-vlm.md) of an HF model directory on a batch file."""
    model, defaults_used = load_hf(model_dir)
    cfg = model.cfg
    batch = batch_from_tensors(read_safetensors_any(batch_path))
    checks = {}
    for j, mb in enumerate(batch):
        if int(mb['image_token_id']) != cfg.image_token_id:
            raise ValueError(f'mb{j}: image_token_id {int(mb["image_token_id"])}, model {cfg.image_token_id}')
        grid = mb['image_grid_thw']
        mine = mrope_positions(mb['tokens'], mb['segments'], grid, cfg.merge, cfg.image_token_id)
        pos = mb['positions']
        if pos.dim() == 1:
            pos = pos[None, :].expand(3, -1)
        checks[f'mb{j}.positions'] = bool(torch.equal(mine, pos.to(torch.int32)))
        mb['positions'] = pos
        if cfg.window_size and 'window_segments' in mb:
            checks[f'mb{j}.window_segments'] = bool(torch.equal(window_segments(grid, cfg),
                                                                mb['window_segments'].to(torch.int32)))
        mb['pixel_values'] = mb['pixel_values'].float()
        if mb['pixel_values'].shape[0] == 0:
            mb['pixel_values'] = torch.zeros(0, cfg.patch_dim)
    with torch.no_grad():
        loss, ce, aux, n_tok, margin = global_loss(model, batch)
    out = {
        'model_type': cfg.family,
        'loss': float(loss),
        'ce_loss': float(ce),
        'aux_loss': float(aux),
        'loss_tokens': n_tok,
        'num_microbatches': len(batch),
        'batch_matches_reference': checks,
        'config_defaults_used': defaults_used,
    }
    if margin is not None:
        out['min_topk_margin'] = margin
    return out


def check_hf_roundtrip(out_dir: str, results: dict, fixtures: Dict[str, str]) -> Tuple[bool, List[str]]:
    """The reference weights written as an HF directory (one file, and two shards) and read
    back with --load-hf's code give the fixture's step-1 loss exactly; BF16 reading."""
    import tempfile
    ok, lines = True, []
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        for name, res in results.items():
            for shards in (1, 2):
                d = os.path.join(tmp, f'{name}-{shards}')
                write_hf_dir(d, CONFIGS[name], res['weights'], shards)
                got = hf_loss(d, os.path.join(fixtures[name], 'batch.safetensors'))
                good = got['loss'] == res['loss'] and got['aux_loss'] == res['aux_loss'] \
                    and all(got['batch_matches_reference'].values()) and not got['config_defaults_used']
                ok &= good
                lines.append(f'  --load-hf {name} ({shards} file{"s" if shards > 1 else ""}): loss {got["loss"]!r} '
                             f'{"= fixture" if good else "FAIL " + json.dumps(got)}')
        x = torch.tensor([1.0, -2.5, 3.140625, 1e-3, 0.0], dtype=torch.float32)
        bf = (x.view(torch.int32) >> 16).to(torch.int16)
        path = os.path.join(tmp, 'bf16.safetensors')
        hdr = json.dumps({'x': {'dtype': 'BF16', 'shape': [5], 'data_offsets': [0, 10]}}).encode()
        hdr += b' ' * ((8 - len(hdr) % 8) % 8)
        with open(path, 'wb') as f:
            f.write(struct.pack('<Q', len(hdr)) + hdr + bf.numpy().tobytes())
        back = read_safetensors_any(path)['x']
        want = (bf.to(torch.int32) << 16).view(torch.float32)
        good = torch.equal(back, want) and back[:3].tolist() == [1.0, -2.5, 3.140625]
        ok &= good
        lines.append(f'  BF16 safetensors reading: {"ok" if good else "FAIL"}')
    return ok, lines


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

WATCH = {
    'qwen2.5-vl-tiny': ['model.layers.0.self_attn.q_proj.weight', 'model.layers.0.input_layernorm.weight',
                        'model.embed_tokens.weight', 'visual.blocks.0.attn.qkv.bias'],
    'qwen3-vl-moe-tiny': ['model.language_model.layers.0.self_attn.q_proj.weight',
                          'model.language_model.layers.0.input_layernorm.weight',
                          'model.language_model.layers.1.mlp.experts.gate_up_proj',
                          'model.visual.pos_embed.weight'],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument('--out', default='test/fixtures', help='output directory')
    ap.add_argument('--seed', type=int, default=0, help='first seed to try')
    ap.add_argument('--check', action='store_true', help='run the self-checks')
    ap.add_argument('--load-hf', metavar='DIR', help='HF model directory: print its loss on --batch as JSON')
    ap.add_argument('--batch', metavar='FILE', help='batch.safetensors (with --load-hf)')
    ap.add_argument('--write-hf', metavar='DIR',
                    help='also write each model\'s initial weights as an HF directory DIR/<model>/')
    args = ap.parse_args()
    torch.set_num_threads(1)  # reproducible reductions
    torch.set_default_dtype(torch.float32)
    if args.load_hf:
        if not args.batch:
            ap.error('--load-hf needs --batch')
        print(json.dumps(hf_loss(args.load_hf, args.batch), indent=2))
        return

    moe_name = 'qwen3-vl-moe-tiny'
    seed = args.seed
    while True:  # the first seed whose MoE routing keeps clear top-2 margins in all 3 steps
        batches = {name: make_batch(seed, cfg) for name, cfg in CONFIGS.items()}
        moe = run_model(moe_name, seed, batches[moe_name], WATCH[moe_name])
        if min(moe['margins']) > MARGIN_MIN:
            break
        print(f'seed {seed}: min top-k margin {min(moe["margins"]):.3e} too small, next seed')
        seed += 1
    results = {'qwen2.5-vl-tiny': run_model('qwen2.5-vl-tiny', seed, batches['qwen2.5-vl-tiny'],
                                            WATCH['qwen2.5-vl-tiny']),
               moe_name: moe}

    written = []
    for name, res in results.items():
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        files = {
            'weights.safetensors': res['weights'],
            'batch.safetensors': batch_tensors(batches[name]),
            'grads.safetensors': res['grads'],
            'params_step3.safetensors': res['params_step3'],
        }
        for fname, tensors in files.items():
            path = os.path.join(d, fname)
            tv.save_safetensors(path, tensors)
            written.append((path, tensors))
        step = {
            'model': name,
            'seed': seed,
            'num_microbatches': len(batches[name]),
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
        with open(os.path.join(d, 'step.json'), 'w') as f:
            json.dump(step, f, indent=2)
            f.write('\n')
        if args.write_hf:
            write_hf_dir(os.path.join(args.write_hf, name), CONFIGS[name], res['weights'])

    ok = True
    if args.check:
        print('== self-checks')
        for path, tensors in written:  # 1. bit-exact read-back
            back = tv.load_safetensors(path)
            same = set(back) == set(tensors) and all(
                back[n].dtype == tensors[n].dtype and back[n].shape == tensors[n].shape
                and tv._tensor_bytes(back[n]) == tv._tensor_bytes(tensors[n]) for n in tensors)
            ok &= same
            print(f'  read-back {path}: {"bit-exact" if same else "MISMATCH"}')
        for name in results:  # 2. finite differences
            worst, lines = fd_check(name, seed, batches[name])
            good = worst < 1e-5
            ok &= good
            print(f'  finite differences {name}: worst err {worst:.2e} {"ok" if good else "FAIL"}')
            for line in lines:
                print(line)
        for name, res in results.items():  # 3. AdamW by hand
            for pname in WATCH[name]:
                wd = OPTIMIZER['weight_decay'] if res['weights'][pname].dim() >= 2 else 0.0
                ref = tv.adamw_by_hand(res['weights'][pname], [c[pname] for c in res['clipped']], wd)
                err = (ref - res['params_step3'][pname].double()).abs().max().item()
                good = err < 1e-6
                ok &= good
                print(f'  AdamW by hand {name} {pname} (wd {wd}): max abs diff {err:.2e} {"ok" if good else "FAIL"}')
        good, msg = check_rope_index()  # 4. geometry
        ok &= good
        print(f'  get_rope_index vs hand-worked two-sample, three-image example: {"ok" if good else "FAIL " + msg}')
        good, msg = check_mrope_axes()
        ok &= good
        print(f'  M-RoPE axes per frequency: {"ok" if good else "FAIL"} ({msg})')
        good, lines = check_windows(CONFIGS['qwen2.5-vl-tiny'])
        ok &= good
        print('\n'.join(lines))
        good, msg = check_reorder_vs_mask('qwen2.5-vl-tiny', seed, batches['qwen2.5-vl-tiny'])
        ok &= good
        print(f'  window reorder path vs mask-by-window-id (float64): {"ok" if good else "FAIL"} ({msg})')
        good, msg = check_pos_interp(CONFIGS[moe_name])
        ok &= good
        print(f'  interpolated position table vs bilinear align_corners: {"ok" if good else "FAIL"} ({msg})')
        for name in CONFIGS:
            good, msg = check_patches(CONFIGS[name])
            ok &= good
            print(f'  pixel_values order and patch embedding {name}: {"ok" if good else "FAIL"} ({msg})')
        b = batches['qwen2.5-vl-tiny']  # 5. the batch's positions are what the model uses
        good = all(torch.equal(mb['positions'], mrope_positions(mb['tokens'], mb['segments'], mb['image_grid_thw'],
                                                                2, IMAGE_TOKEN)) for mb in b)
        good &= all(torch.equal(batches[moe_name][j]['positions'], b[j]['positions']) for j in range(len(b)))
        ok &= good
        print(f'  batch positions = get_rope_index, same in both batches: {"ok" if good else "FAIL"}')
        good, lines = check_hf_roundtrip(args.out, results, {n: os.path.join(args.out, n) for n in results})
        ok &= good
        print('\n'.join(lines))

    print('== summary (seed %d)' % seed)
    for j, mb in enumerate(batches['qwen2.5-vl-tiny']):
        shapes = [tuple(im.shape[1:]) for im in mb['images']]
        print(f'  mb{j}: samples {int(mb["segments"].max()) + 1}, images {shapes}, '
              f'patches {mb["pixel_values"].shape[0]}, real tokens {int((mb["segments"] >= 0).sum())}, '
              f'loss tokens {int(mb["loss_mask"].sum())}')
    for name, res in results.items():
        extra = f' min_topk_margin {min(res["margins"]):.6e}' if CONFIGS[name].experts else ''
        print(f'  {name}: loss {res["loss"]!r} ce {res["ce_loss"]!r} aux {res["aux_loss"]!r} '
              f'grad_norm {res["grad_norm"]!r} tokens {res["loss_tokens"]}{extra}')
        print(f'    losses {res["losses"]}  grad_norms {res["grad_norms"]}')
        if CONFIGS[name].experts:
            print(f'    margins per step {res["margins"]}')
    if not ok:
        print('SELF-CHECK FAILED')
        sys.exit(1)


if __name__ == '__main__':
    main()
