#!/usr/bin/env python3
"""bench/gpu_step.py: a whole training step on one GPU, measured, for lfc's simulator.

bench/gpu_probe.py checks the cost model kernel by kernel; this checks how a step composes them. It
trains Llama 3 8B's decoder (--model llama3-8b) or Qwen3-30B-A3B's, 128 experts top 8 (--model
qwen3-30b-a3b), cut to a few layers (lfc's `llama3-8b-text` or `qwen3-vl-30b-a3b` with
model.text_decoder.num_layers=N), on one GPU the way Megatron-Core does in bf16: bf16 weights and
activations, fp32 master weights and AdamW state, gradients accumulated over the microbatches and
reduced to fp32 once a step. bench/gpu-step.ts compiles the same step with lfc, simulates it on the
GPU's profile, and compares the step time and its split into GEMMs, attention and other kernels.

The model (configs/models/text_decoder/llama3_8b.yaml): hidden 4096, 32 query heads and 8 KV
heads of 128, FFN 14336 (SwiGLU), vocabulary 128256, untied embeddings, RMSNorm, rotary
positions; every projection an nn.Linear without bias, attention through
scaled_dot_product_attention (causal, GQA; cuDNN's backend unless --attention flash), the loss a
cross-entropy in fp32 over the whole vocabulary. One step: --microbatches forward + backward
passes of one 8192-token sequence each, then the fp32 AdamW update. Times: the median of
--steps steps after --warmup, host clock around a synchronized step; then one profiled step
(torch.profiler) whose GPU kernels are summed by kind.

    python3 bench/gpu_step.py --out $OUT/step.json [--layers 4] [--microbatches 4]
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = {
    # configs/models/text_decoder/llama3_8b.yaml: lfc's llama3-8b-text
    'llama3-8b': dict(lfc='llama3-8b-text', hidden=4096, heads=32, kv_heads=8, head_dim=128,
                      ffn=14336, vocab=128256, rope=500000.0, eps=1e-5, qk_norm=False, experts=0),
    # configs/models/text_decoder/qwen3_30b_a3b.yaml: the decoder of lfc's qwen3-vl-30b-a3b
    'qwen3-30b-a3b': dict(lfc='qwen3-vl-30b-a3b', hidden=2048, heads=32, kv_heads=4, head_dim=128,
                          ffn=0, vocab=151936, rope=5000000.0, eps=1e-6, qk_norm=True,
                          experts=128, topk=8, moe_ffn=768, aux=1e-3),
}


class C:  # the model being run (main sets it from --model)
    pass


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(seq, device):
    d = C.head_dim
    inv = 1.0 / (C.rope ** (torch.arange(0, d, 2, device=device).float() / d))
    freqs = torch.outer(torch.arange(seq, device=device).float(), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


def rotate(x, cos, sin):  # x [B, H, T, D]
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


def swiglu(h):
    g, u = h.chunk(2, dim=-1)
    return F.silu(g) * u


def loss_of(logits, labels):
    return F.cross_entropy(logits.float().view(-1, C.vocab), labels.view(-1))


def grouped_mm(x, w, offs):
    """x [rows, k] sorted by expert, w [E, n, k], offs: each expert's end row -> [rows, n]: one
    CUTLASS grouped GEMM (PyTorch's _grouped_mm), as Megatron's GroupedMLP runs its experts"""
    return torch._grouped_mm(x, w.transpose(1, 2), offs=offs)


def grouped_loop(x, w, offs):
    """the same as one GEMM per expert (where _grouped_mm has no backward)"""
    outs, start = [], 0
    for e, end in enumerate(offs.tolist()):
        outs.append(F.linear(x[start:end], w[e]))
        start = end
    return torch.cat(outs)


def pick_grouped(dev):
    global grouped_mm
    try:
        x = torch.randn(64, 32, device=dev, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(4, 16, 32, device=dev, dtype=torch.bfloat16, requires_grad=True)
        offs = torch.tensor([16, 32, 48, 64], device=dev, dtype=torch.int32)
        out = grouped_mm(x, w, offs)
        out.backward(torch.randn_like(out))  # a dense gradient, as a model's
        return '_grouped_mm'
    except Exception as err:  # noqa: BLE001 (recorded)
        print(f'_grouped_mm unusable ({str(err).splitlines()[0][:120]}): one GEMM per expert',
              file=sys.stderr)
        grouped_mm = grouped_loop
        return 'loop'


class MoE(nn.Module):
    """Megatron's dropless MoE layer: an fp32 router, top-k of a softmax (renormalised), the
    tokens sorted by expert, the experts as grouped GEMMs, and the weighted sum back."""

    def __init__(self):
        super().__init__()
        E, H, F_ = C.experts, C.hidden, C.moe_ffn
        self.router = nn.Parameter(torch.randn(E, H) * 0.02)
        self.w1 = nn.Parameter(torch.randn(E, 2 * F_, H) * H ** -0.5)
        self.w2 = nn.Parameter(torch.randn(E, H, F_) * F_ ** -0.5)

    def forward(self, x):  # x [T, H]
        T = x.shape[0]
        probs = F.linear(x.float(), self.router.float()).softmax(-1)
        w, idx = probs.topk(C.topk, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        flat = idx.view(-1)
        order = flat.argsort(stable=True)
        token = order // C.topk
        counts = torch.bincount(flat, minlength=C.experts)
        offs = counts.cumsum(0).to(torch.int32)
        h = grouped_mm(x[token], self.w1, offs)
        y = grouped_mm(swiglu(h), self.w2, offs)
        y = y * w.view(-1)[order].unsqueeze(-1).to(y.dtype)
        out = torch.zeros_like(x).index_add_(0, token, y)
        share = counts.float() / (T * C.topk)  # the switch load-balancing loss
        return out, C.aux * C.experts * (share * probs.mean(0)).sum()


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        H, d = C.hidden, C.head_dim
        self.norm1 = RMSNorm(H, C.eps)
        self.qkv = nn.Linear(H, (C.heads + 2 * C.kv_heads) * d, bias=False)
        self.q_norm = RMSNorm(d, C.eps) if C.qk_norm else None
        self.k_norm = RMSNorm(d, C.eps) if C.qk_norm else None
        self.proj = nn.Linear(C.heads * d, H, bias=False)
        self.norm2 = RMSNorm(H, C.eps)
        if C.experts:
            self.moe = MoE()
        else:
            self.fc1 = nn.Linear(H, 2 * C.ffn, bias=False)
            self.fc2 = nn.Linear(C.ffn, H, bias=False)

    def forward(self, x, cos, sin):
        B, T, H = x.shape
        d = C.head_dim
        qkv = self.qkv(self.norm1(x))
        q, k, v = qkv.split([C.heads * d, C.kv_heads * d, C.kv_heads * d], dim=-1)
        q = q.view(B, T, C.heads, d)
        k = k.view(B, T, C.kv_heads, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(B, T, C.kv_heads, d).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, C.heads * d))
        if C.experts:
            y, aux = self.moe(self.norm2(x).view(B * T, H))
            return x + y.view(B, T, H), aux
        return x + self.fc2(swiglu(self.fc1(self.norm2(x)))), 0.0


class Decoder(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.embed = nn.Embedding(C.vocab, C.hidden)
        self.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.norm = RMSNorm(C.hidden, C.eps)
        self.head = nn.Linear(C.hidden, C.vocab, bias=False)

    def forward(self, tokens, labels, cos, sin):
        x = self.embed(tokens)
        aux = 0.0
        for layer in self.layers:
            x, a = layer(x, cos, sin)
            aux = aux + a
        return loss_of(self.head(self.norm(x)), labels) + aux


def kind_of(name):
    n = name.lower()
    if any(s in n for s in ('flash', 'fmha', 'cudnn', 'attention', 'sdpa')):
        return 'attention'
    if any(s in n for s in ('gemm', 'nvjet', 'xmma', 'cutlass', 'cublas', 'sm90_')):
        return 'gemm'
    return 'other'


def compiled():
    """Megatron's fused kernels for RoPE, SwiGLU and the cross-entropy, as torch.compile fuses them."""
    global rotate, swiglu, loss_of
    rotate = torch.compile(rotate)
    swiglu = torch.compile(swiglu)
    loss_of = torch.compile(loss_of)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--out', required=True)
    ap.add_argument('--model', choices=sorted(MODELS), default='llama3-8b')
    ap.add_argument('--layers', type=int, default=4)
    ap.add_argument('--microbatches', type=int, default=4)
    ap.add_argument('--seq', type=int, default=8192)
    ap.add_argument('--steps', type=int, default=5)
    ap.add_argument('--warmup', type=int, default=2)
    ap.add_argument('--attention', choices=['cudnn', 'flash'], default='cudnn')
    ap.add_argument('--compile', action='store_true',
                    help='fuse RoPE, SwiGLU and the loss with torch.compile, as Megatron fuses them')
    a = ap.parse_args()
    for k, v in MODELS[a.model].items():
        setattr(C, k, v)
    if a.compile:
        compiled()
    dev = torch.device('cuda')
    torch.manual_seed(0)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {'cudnn': SDPBackend.CUDNN_ATTENTION, 'flash': SDPBackend.FLASH_ATTENTION}[a.attention]

    experts_kernel = pick_grouped(dev) if C.experts else None
    model = Decoder(a.layers).to(dev)
    master = [p.detach().clone().float() for p in model.parameters()]  # fp32 master weights
    model.to(torch.bfloat16)
    params = list(model.parameters())
    for m in master:
        m.grad = torch.zeros_like(m)
    opt = torch.optim.AdamW(master, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    cos, sin = rope_tables(a.seq, dev)
    batches = [(torch.randint(0, C.vocab, (1, a.seq), device=dev),
                torch.randint(0, C.vocab, (1, a.seq), device=dev)) for _ in range(a.microbatches)]

    def step():
        with sdpa_kernel(backend):
            for tokens, labels in batches:
                loss = model(tokens, labels, cos, sin) / a.microbatches
                loss.backward()
        # Megatron's fp32 main gradients, then the fp32 AdamW update and the copy back to bf16
        with torch.no_grad():
            for m, p in zip(master, params):
                m.grad.copy_(p.grad)
            opt.step()
            for m, p in zip(master, params):
                p.copy_(m)
                p.grad = None
        return loss

    times, losses = [], []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()) * a.microbatches)
    print(f'steps: {[round(t, 4) for t in times]} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}',
          file=sys.stderr)

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    by_kind = {'gemm': 0.0, 'attention': 0.0, 'other': 0.0}
    top = {}
    for e in prof.events():
        if e.device_type.name != 'CUDA':
            continue
        us = e.device_time if hasattr(e, 'device_time') else e.cuda_time
        by_kind[kind_of(e.name)] += us * 1e-6
        top[e.name] = top.get(e.name, 0.0) + us * 1e-6
    kernels = sorted(top.items(), key=lambda kv: -kv[1])[:25]
    params_n = sum(p.numel() for p in params)
    result = {
        'date': time.strftime('%Y-%m-%d'),
        'environment': {'torch': torch.__version__, 'cuda': torch.version.cuda,
                        'name': torch.cuda.get_device_name(dev),
                        'cudnn': torch.backends.cudnn.version()},
        'model': C.lfc, 'layers': a.layers, 'seq': a.seq,
        'microbatches': a.microbatches, 'attention': a.attention, 'parameters': params_n,
        'compiled': a.compile, 'experts_kernel': experts_kernel,
        'step_seconds': times, 'median_seconds': statistics.median(times),
        'kernel_seconds': by_kind, 'top_kernels': kernels, 'losses': losses,
        'peak_memory_gib': torch.cuda.max_memory_allocated(dev) / 2**30,
    }
    with open(a.out, 'w') as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ('layers', 'microbatches', 'attention', 'parameters',
                                             'median_seconds', 'kernel_seconds',
                                             'peak_memory_gib')}))
    for name, s in kernels[:12]:
        print(f'{s * 1e3:9.2f} ms  {kind_of(name):9}  {name[:110]}')


if __name__ == '__main__':
    main()
