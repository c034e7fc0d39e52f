#!/usr/bin/env python3
"""bench/gpu_step.py: a whole training step on one GPU, measured, for lfc's simulator.

bench/gpu_probe.py checks the cost model kernel by kernel; this checks how a step composes them. It
trains Llama 3 8B's decoder, cut to a few layers (lfc's `llama3-8b-text` with
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

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 4096, 32, 8, 128, 14336, 128256


class RMSNorm(nn.Module):
    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(seq, device):
    inv = 1.0 / (500000.0 ** (torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM))
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
    return F.cross_entropy(logits.float().view(-1, VOCAB), labels.view(-1))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = RMSNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.norm2 = RMSNorm(HIDDEN)
        self.fc1 = nn.Linear(HIDDEN, 2 * FFN, bias=False)
        self.fc2 = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        qkv = self.qkv(self.norm1(x))
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        q = q.view(B, T, HEADS, HEAD_DIM).transpose(1, 2)
        k = k.view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = v.view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, HEADS * HEAD_DIM))
        return x + self.fc2(swiglu(self.fc1(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.norm = RMSNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens, labels, cos, sin):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return loss_of(self.head(self.norm(x)), labels)


def kind_of(name):
    n = name.lower()
    if any(s in n for s in ('flash', 'fmha', 'cudnn', 'attention', 'sdpa')):
        return 'attention'
    if any(s in n for s in ('gemm', 'nvjet', 'xmma', 'cutlass', 'cublas', 'sm90_')):
        return 'gemm'
    return 'other'


def compiled(_):
    """Megatron's fused kernels for RoPE, SwiGLU and the cross-entropy, as torch.compile fuses them."""
    global rotate, swiglu, loss_of
    rotate = torch.compile(rotate)
    swiglu = torch.compile(swiglu)
    loss_of = torch.compile(loss_of)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--out', required=True)
    ap.add_argument('--layers', type=int, default=4)
    ap.add_argument('--microbatches', type=int, default=4)
    ap.add_argument('--seq', type=int, default=8192)
    ap.add_argument('--steps', type=int, default=5)
    ap.add_argument('--warmup', type=int, default=2)
    ap.add_argument('--attention', choices=['cudnn', 'flash'], default='cudnn')
    ap.add_argument('--compile', action='store_true',
                    help='fuse RoPE, SwiGLU and the loss with torch.compile, as Megatron fuses them')
    a = ap.parse_args()
    if a.compile:
        compiled(None)
    dev = torch.device('cuda')
    torch.manual_seed(0)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {'cudnn': SDPBackend.CUDNN_ATTENTION, 'flash': SDPBackend.FLASH_ATTENTION}[a.attention]

    model = Decoder(a.layers).to(dev)
    master = [p.detach().clone().float() for p in model.parameters()]  # fp32 master weights
    model.to(torch.bfloat16)
    params = list(model.parameters())
    for m in master:
        m.grad = torch.zeros_like(m)
    opt = torch.optim.AdamW(master, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    cos, sin = rope_tables(a.seq, dev)
    batches = [(torch.randint(0, VOCAB, (1, a.seq), device=dev),
                torch.randint(0, VOCAB, (1, a.seq), device=dev)) for _ in range(a.microbatches)]

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
        'model': 'llama3-8b-text', 'layers': a.layers, 'seq': a.seq,
        'microbatches': a.microbatches, 'attention': a.attention, 'parameters': params_n,
        'compiled': a.compile,
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
