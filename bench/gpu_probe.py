#!/usr/bin/env python3
"""bench/gpu_probe.py: one GPU's kernel speeds, measured, for lfc's cost model.

lfc prices a step from a hardware profile (configs/hardware/*.yaml, compiler/sim/cost.ts): GEMMs by
shape, flash attention by segment length and head dim, grouped expert GEMMs by rows per expert,
memory-bound kernels by bytes, and a launch cost. This script measures each of those families on
the GPU it runs on, with the kernels a PyTorch / Megatron user gets (cuBLAS through F.linear and
its two backward products, scaled_dot_product_attention's flash and cuDNN backends, a loop of
per-expert GEMMs and torch._grouped_mm, PyTorch's own elementwise and norm kernels), and writes
one JSON file that bench/gpu-kernels.ts compares with the cost model's prices.

The shapes are the ones lfc's layouts produce: the article's Qwen3-VL-30B-A3B at tp 4 (attention
over the whole 32k sequence, experts split 4 ways), its ViT at tp 1, Llama 3 70B at tp 8, GPT-3
175B at tp 4, plus squares and thin GEMMs. Times are medians of CUDA-event-timed batches after a
warm-up, on fresh random inputs (never zeros), rotating among input copies so a small problem
does not run from L2. Run it on the device machine with its python3 (PyTorch with CUDA):

    python3 bench/gpu_probe.py --out $OUT/probe.json

`--quick` runs a reduced set on the CPU, to check the script itself where there is no GPU.
"""

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

L2_BYTES = 60 * 2**20  # H200; rotating through 4x this keeps operands out of L2


class Timer:
    def __init__(self, device, graphs=False):
        self.device = device
        self.cuda = device.type == 'cuda'
        # time the GPU alone: n calls captured in a CUDA graph and replayed, so the host's launch
        # cost (about 10 us a kernel from Python here) stays out of a small kernel's time
        self.graphs = graphs and self.cuda

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def seconds(self, fn, reps=7, target=0.004, warmup=2):
        """Median seconds of one fn() call: batches of n calls timed with events, n chosen so a
        batch lasts about `target` seconds."""
        if self.graphs:
            return self.graph_seconds(fn, reps, target)
        for _ in range(warmup):
            fn()
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        once = max(time.perf_counter() - t0, 1e-6)
        n = max(1, min(200, int(target / once)))
        times = []
        for _ in range(reps):
            if self.cuda:
                s = torch.cuda.Event(enable_timing=True)
                e = torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(n):
                    fn()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) / 1e3 / n)
            else:
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                times.append((time.perf_counter() - t0) / n)
        return statistics.median(times), times


    def graph_seconds(self, fn, reps, target):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up outside the capture (handles, workspaces)
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        n = 1
        while True:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(n):
                    fn()
            g.replay()
            torch.cuda.synchronize()
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            once = a.elapsed_time(b) / 1e3
            if once >= target or n >= 256:
                break
            n = min(256, max(2 * n, int(n * target / max(once, 1e-7))))
            del g
        times = []
        for _ in range(reps):
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3 / n)
        return statistics.median(times), times


def rnd(shape, device, dtype, requires_grad=False):
    x = torch.randn(*shape, device=device, dtype=torch.float32).to(dtype)
    if requires_grad:
        x.requires_grad_(True)
    return x


def copies_for(nbytes):
    return max(1, min(8, math.ceil(4 * L2_BYTES / max(nbytes, 1))))


def probe_ceilings(t, dev, dt, quick):
    n = (2**20 if quick else 2**30) // 2  # bf16 elements of a 1 GiB buffer
    x = rnd((n,), dev, dt)
    y = torch.empty_like(x)
    s, _ = t.seconds(lambda: y.copy_(x), reps=9)
    copy_gbps = 2 * x.numel() * x.element_size() / s / 1e9
    m = 512 if quick else 8192
    a, b = rnd((m, m), dev, dt), rnd((m, m), dev, dt)
    s, _ = t.seconds(lambda: a @ b, reps=9)
    return {'copy_gbps': copy_gbps, 'gemm_square': m, 'gemm_tflops': 2 * m**3 / s / 1e12}


def gemm_shapes(quick):
    """(name, tokens m, out features n, in features k) of a linear layer y = x W^T."""
    if quick:
        return [('square-256', 256, 256, 256), ('thin', 64, 512, 256)]
    out = [(f'square-{s}', s, s, s) for s in (512, 1024, 2048, 4096, 8192, 16384)]
    out += [(f'thin-m{m}', m, 2048, 2048) for m in (64, 128, 256, 512, 1024)]
    # Qwen3-VL-30B-A3B decoder at tp 4 (sequence 32768: the column-parallel layers see the whole
    # sequence, the row-parallel ones too before their reduce-scatter); hidden 2048, 32 heads x
    # 128, 4 KV heads, vocabulary 151936
    out += [
        ('30b-qkv-tp4', 32768, (4096 + 2 * 512) // 4, 2048),
        ('30b-proj-tp4', 32768, 2048, 4096 // 4),
        ('30b-router', 8192, 128, 2048),
        ('30b-lmhead-tp4', 32768, 151936 // 4, 2048),
    ]
    # its ViT at tp 1: hidden 1152, FFN 4304, 16 heads x 72; 16576 patches (4144 visual tokens)
    out += [
        ('vit-qkv', 16576, 3 * 1152, 1152),
        ('vit-proj', 16576, 1152, 1152),
        ('vit-fc1', 16576, 4304, 1152),
        ('vit-fc2', 16576, 1152, 4304),
    ]
    # Llama 3 70B at tp 8, sequence 8192: hidden 8192, FFN 28672, 8 KV heads x 128
    out += [
        ('70b-qkv-tp8', 8192, (8192 + 2 * 1024) // 8, 8192),
        ('70b-proj-tp8', 8192, 8192, 1024),
        ('70b-fc1-tp8', 8192, 2 * 28672 // 8, 8192),
        ('70b-fc2-tp8', 8192, 8192, 28672 // 8),
    ]
    # Llama 3 8B at tp 1, sequence 8192 (bench/gpu_step.py's step): hidden 4096, FFN 14336, 8 KV
    # heads x 128, vocabulary 128256
    out += [
        ('8b-qkv', 8192, 4096 + 2 * 1024, 4096),
        ('8b-proj', 8192, 4096, 4096),
        ('8b-fc1', 8192, 2 * 14336, 4096),
        ('8b-fc2', 8192, 4096, 14336),
        ('8b-head', 8192, 128256, 4096),
    ]
    # GPT-3 175B at tp 4, sequence 2048: hidden 12288
    out += [
        ('175b-qkv-tp4', 2048, 3 * 12288 // 4, 12288),
        ('175b-fc1-tp4', 2048, 4 * 12288 // 4, 12288),
        ('175b-fc2-tp4', 2048, 12288, 4 * 12288 // 4),
    ]
    return out


def probe_gemms(t, dev, dt, quick):
    rows = []
    for name, m, n, k in gemm_shapes(quick):
        c = copies_for(2 * (m * k + n * k + m * n))
        xs = [rnd((m, k), dev, dt) for _ in range(c)]
        ws = [rnd((n, k), dev, dt) for _ in range(c)]
        dys = [rnd((m, n), dev, dt) for _ in range(c)]
        i = [0]

        def nxt():
            i[0] = (i[0] + 1) % c
            return i[0]

        cases = {
            # forward y = x W^T; input gradient dx = dy W; weight gradient dW = dy^T x
            'forward': (lambda: F.linear(xs[nxt()], ws[i[0]]), (m, n, k)),
            'dgrad': (lambda: dys[nxt()] @ ws[i[0]], (m, k, n)),
            'wgrad': (lambda: dys[nxt()].t() @ xs[i[0]], (n, k, m)),
        }
        for kind, (fn, (mm, nn, kk)) in cases.items():
            s, _ = t.seconds(fn)
            rows.append({'name': name, 'pass': kind, 'm': mm, 'n': nn, 'k': kk, 'seconds': s,
                         'tflops': 2 * mm * nn * kk / s / 1e12})
        del xs, ws, dys
    return rows


def probe_grouped(t, dev, dt, quick):
    """Expert GEMMs: E experts of `rows` tokens each, as a loop of GEMMs and as one grouped GEMM."""
    rows_out = []
    grouped = getattr(torch, '_grouped_mm', None)
    experts = 4 if quick else 32
    per = (64, 256) if quick else (32, 128, 512, 2048, 8192)
    # (name, n, k): the 30B's experts (FFN 768, gated) split 4 ways (etp 4) and whole (etp 1)
    shapes = [('fc1-etp4', 2 * 768 // 4, 2048), ('fc2-etp4', 2048, 768 // 4),
              ('fc1-etp1', 2 * 768, 2048), ('fc2-etp1', 2048, 768)]
    if quick:
        shapes = [('fc1', 64, 128)]
    for name, n, k in shapes:
        for r in per:
            total = experts * r
            x = rnd((total, k), dev, dt)
            w = rnd((experts, n, k), dev, dt)  # per expert W [n, k]
            chunks = list(x.split(r))

            def loop():
                return [F.linear(chunks[e], w[e]) for e in range(experts)]

            s, _ = t.seconds(loop)
            flops = 2 * total * n * k
            rec = {'name': name, 'experts': experts, 'rows': r, 'n': n, 'k': k,
                   'loop_seconds': s, 'loop_tflops': flops / s / 1e12}
            if dev.type == 'cuda':
                # Transformer Engine's GroupedLinear: one cuBLAS GEMM per expert, spread over 4
                # streams (transformer_engine/common/util/multi_stream.cpp)
                streams = [torch.cuda.Stream() for _ in range(4)]

                def loop4():
                    cur = torch.cuda.current_stream()
                    for st in streams:
                        st.wait_stream(cur)
                    outs = []
                    for e in range(experts):
                        with torch.cuda.stream(streams[e % 4]):
                            outs.append(F.linear(chunks[e], w[e]))
                    for st in streams:
                        cur.wait_stream(st)
                    return outs

                s4, _ = t.seconds(loop4)
                rec['streams4_seconds'] = s4
                rec['streams4_tflops'] = flops / s4 / 1e12
            if grouped is not None and dev.type == 'cuda':
                offs = torch.arange(r, total + 1, r, device=dev, dtype=torch.int32)
                wt = w.transpose(1, 2)  # [E, k, n], column-major view as the kernel wants
                try:
                    grouped(x, wt, offs=offs)
                    s2, _ = t.seconds(lambda: grouped(x, wt, offs=offs))
                    rec['grouped_seconds'] = s2
                    rec['grouped_tflops'] = flops / s2 / 1e12
                except Exception as err:  # noqa: BLE001 (recorded, not fatal)
                    rec['grouped_error'] = str(err).splitlines()[0][:200]
            rows_out.append(rec)
            del x, w, chunks
    return rows_out


def sdpa_backends():
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return {}
    return {'flash': (sdpa_kernel, SDPBackend.FLASH_ATTENTION),
            'cudnn': (sdpa_kernel, SDPBackend.CUDNN_ATTENTION)}


def probe_attention(t, dev, dt, quick):
    """Causal / full attention over 16k tokens a batch (the FlashAttention papers' setting):
    batch 16384 / L of L-token sequences. Backward is timed as forward+backward minus forward."""
    rows = []
    total = 2048 if quick else 16384
    lengths = (512, 1024) if quick else (512, 1024, 2048, 4096, 8192, 16384, 32768)
    # (name, query heads, kv heads, head dim, causal)
    confs = [('llm-d128', 16, 16, 128, True), ('llm-d64', 32, 32, 64, True),
             ('gqa-d128', 32, 4, 128, True), ('vit-d72', 16, 16, 72, False),
             ('vit-d80', 16, 16, 80, False)]
    if quick:
        confs = confs[:1]
    backends = sdpa_backends() if dev.type == 'cuda' else {}
    if not backends:
        backends = {'math': (None, None)}
    for bname, (ctx, which) in backends.items():
        for cname, hq, hkv, d, causal in confs:
            for L in lengths:
                if cname.startswith('vit') and L > 16384:
                    continue
                B = max(1, total // L)
                q = rnd((B, hq, L, d), dev, dt, True)
                k = rnd((B, hkv, L, d), dev, dt, True)
                v = rnd((B, hkv, L, d), dev, dt, True)
                g = rnd((B, hq, L, d), dev, dt)
                kw = {'is_causal': causal}
                if hkv != hq:
                    kw['enable_gqa'] = True

                def fwd():
                    return F.scaled_dot_product_attention(q, k, v, **kw)

                def fwd_bwd():
                    out = fwd()
                    out.backward(g)
                    q.grad = k.grad = v.grad = None

                rec = {'backend': bname, 'name': cname, 'seq': L, 'batch': B, 'heads': hq,
                       'kv_heads': hkv, 'head_dim': d, 'causal': causal}
                try:
                    if ctx is not None:
                        with ctx(which):
                            sf, _ = t.seconds(fwd)
                            sfb, _ = t.seconds(fwd_bwd)
                    else:
                        sf, _ = t.seconds(fwd)
                        sfb, _ = t.seconds(fwd_bwd)
                except Exception as err:  # noqa: BLE001 (a backend without this shape)
                    rec['error'] = str(err).splitlines()[0][:200]
                    rows.append(rec)
                    continue
                # FLOPs as lfc counts them (ir/ops.ts matmulFlops): 4 T L h d forward, twice
                # that backward, half of it causal
                fflops = 4 * B * L * L * hq * d / (2 if causal else 1)
                sb = max(sfb - sf, 1e-9)
                rec.update({'forward_seconds': sf, 'backward_seconds': sb,
                            'forward_tflops': fflops / sf / 1e12,
                            'backward_tflops': 2 * fflops / sb / 1e12})
                rows.append(rec)
                del q, k, v, g
    return rows


def probe_memory(t, dev, dt, quick):
    """Memory-bound kernels by bytes moved (each operand read once, each result written once)."""
    rows = []
    sizes = (2**16, 2**20) if quick else (2**16, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28)
    hidden = 2048
    for n in sizes:
        c = copies_for(3 * n * 2)
        xs = [rnd((n // hidden, hidden), dev, dt) for _ in range(c)]
        ys = [rnd((n // hidden, hidden), dev, dt) for _ in range(c)]
        w = rnd((hidden,), dev, dt)
        i = [0]

        def nxt():
            i[0] = (i[0] + 1) % c
            return i[0]

        ops = {
            'copy': (lambda: ys[nxt()].copy_(xs[i[0]]), 2),
            'add': (lambda: xs[nxt()] + ys[i[0]], 3),
            'swiglu': (lambda: F.silu(xs[nxt()]) * ys[i[0]], 3),
        }
        if hasattr(F, 'rms_norm'):
            ops['rms_norm'] = (lambda: F.rms_norm(xs[nxt()], (hidden,), w), 2)
        else:
            ops['layer_norm'] = (lambda: F.layer_norm(xs[nxt()], (hidden,), w), 2)
        for name, (fn, tensors) in ops.items():
            s, _ = t.seconds(fn)
            nbytes = tensors * n * 2
            rows.append({'op': name, 'elements': n, 'bytes': nbytes, 'seconds': s,
                         'gbps': nbytes / s / 1e9})
        del xs, ys
    return rows


def probe_launch(t, dev):
    x = torch.ones(1, device=dev)
    s, _ = t.seconds(lambda: x.add_(1), target=0.01)
    return {'tiny_kernel_us': s * 1e6}


def warm(dev, dt, seconds):
    a, b = rnd((8192, 8192), dev, dt), rnd((8192, 8192), dev, dt)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()


def environment(dev):
    env = {'python': platform.python_version(), 'torch': torch.__version__,
           'cuda': torch.version.cuda, 'device': str(dev)}
    if dev.type == 'cuda':
        p = torch.cuda.get_device_properties(dev)
        env.update({'name': p.name, 'sms': p.multi_processor_count,
                    'memory_gib': p.total_memory / 2**30,
                    'cudnn': torch.backends.cudnn.version()})
        try:
            q = subprocess.run(
                ['nvidia-smi', '--query-gpu=driver_version,clocks.sm,clocks.max.sm,clocks.mem,'
                 'power.limit', '--format=csv,noheader'], capture_output=True, text=True,
                timeout=20)
            env['nvidia_smi'] = q.stdout.strip()
        except (OSError, subprocess.SubprocessError) as err:
            env['nvidia_smi'] = f'unavailable: {err}'
    return env


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--out', required=True)
    ap.add_argument('--quick', action='store_true', help='a reduced set (runs on the CPU too)')
    ap.add_argument('--only', default='', help='comma list of families to run')
    ap.add_argument('--warm', type=float, default=0,
                    help='seconds of large GEMMs before each family, so the clocks are those of '
                         'a GPU under sustained load, as in training')
    ap.add_argument('--graphs', action='store_true',
                    help='time replays of CUDA graphs: the GPU alone, without launch costs')
    a = ap.parse_args()
    dev = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    dt = torch.bfloat16 if dev.type == 'cuda' else torch.float32
    torch.manual_seed(0)
    if dev.type == 'cuda':
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    t = Timer(dev, a.graphs)
    result = {'date': time.strftime('%Y-%m-%d'), 'environment': environment(dev),
              'dtype': str(dt).replace('torch.', ''), 'timing': 'graphs' if t.graphs else 'eager',
              'warm_seconds': a.warm}
    families = [('ceilings', lambda: probe_ceilings(t, dev, dt, a.quick)),
                ('launch', lambda: probe_launch(t, dev)),
                ('gemm', lambda: probe_gemms(t, dev, dt, a.quick)),
                ('grouped', lambda: probe_grouped(t, dev, dt, a.quick)),
                ('attention', lambda: probe_attention(t, dev, dt, a.quick)),
                ('memory', lambda: probe_memory(t, dev, dt, a.quick))]
    only = set(filter(None, a.only.split(',')))
    for name, fn in families:
        if only and name not in only:
            continue
        if a.warm > 0 and dev.type == 'cuda':
            warm(dev, dt, a.warm)
        t0 = time.perf_counter()
        result[name] = fn()
        print(f'{name}: {time.perf_counter() - t0:.1f} s', file=sys.stderr, flush=True)
        with open(a.out, 'w') as f:  # after every family: a timeout keeps what was measured
            json.dump(result, f, indent=1)
    summary(result)


def summary(r):
    print(json.dumps(r.get('environment', {})))
    if 'ceilings' in r:
        print('ceilings', json.dumps(r['ceilings']), 'launch', json.dumps(r.get('launch')))
    for g in r.get('gemm', []):
        print(f"gemm {g['name']:16} {g['pass']:7} {g['m']:6} {g['n']:6} {g['k']:6} "
              f"{g['seconds'] * 1e6:10.1f} us {g['tflops']:7.1f} TF")
    for g in r.get('grouped', []):
        print(f"grouped {g['name']:9} E{g['experts']} rows {g['rows']:5} loop "
              f"{g['loop_tflops']:6.1f} TF 4 streams {g.get('streams4_tflops', float('nan')):6.1f}"
              f" TF grouped {g.get('grouped_tflops', float('nan')):6.1f} TF"
              f" {g.get('grouped_error', '')}")
    for a in r.get('attention', []):
        if 'error' in a:
            print(f"attn {a['backend']:5} {a['name']:9} L{a['seq']:6} error {a['error']}")
        else:
            print(f"attn {a['backend']:5} {a['name']:9} L{a['seq']:6} fwd "
                  f"{a['forward_tflops']:6.1f} bwd {a['backward_tflops']:6.1f} TF")
    for m in r.get('memory', []):
        print(f"mem {m['op']:9} {m['bytes'] / 2**20:9.1f} MiB {m['gbps']:8.1f} GB/s")


if __name__ == '__main__':
    main()
