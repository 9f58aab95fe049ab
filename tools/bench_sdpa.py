#!/usr/bin/env python3
"""Baseline for bench/bench_attention.cu: PyTorch scaled_dot_product_attention (cuDNN backend when
available) on the same packed shapes, one causal call per sample (measured to be faster
than one call with a block-diagonal mask).

T = 8192 packed as 8 samples (the same fixed lengths as bench_attention.cu), head_dim 256, GQA heads of
Qwen3.5-2B (8 q / 2 kv) and 27B (24 q / 4 kv). K/V are expanded to the query heads before timing
(enable_gqa is not supported by every backend); the expansion is not timed. Timing: CUDA events around
all 8 per-sample calls, median of --iters runs after warm-up; fwd alone, and fwd+bwd (bwd = fwd+bwd - fwd).
FLOPs as bench_attention.cu: fwd = sum_L 2 * 2 * L^2 / 2 * D * Hq, bwd = 2.5 * fwd.

Prints one JSON object. The lead computes attn_{fwd,bwd}_speedup_vs_cudnn = sdpa ms / bench_attention ms
(2B shapes) from the two outputs of the same GPU session.

Usage: python3 tools/bench_sdpa.py [--iters 20]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

LENS = [1024, 512, 1600, 768, 1280, 256, 1152, 1600]
HEAD_DIM = 256


def sdpa_context():
    """cuDNN fused attention when this PyTorch has it, else the default dispatcher."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if hasattr(SDPBackend, "CUDNN_ATTENTION"):
            return sdpa_kernel(SDPBackend.CUDNN_ATTENTION), "cudnn"
    except ImportError:
        pass
    import contextlib

    return contextlib.nullcontext(), "default"


def median_ms(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run(hq, hkv, iters, ctx_factory):
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1234)
    samples = []
    for L in LENS:
        # [1, H, L, D] per sample; K/V expanded from Hkv to Hq heads (query head h reads kv head h // (Hq/Hkv)).
        q = torch.randn(1, hq, L, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=gen)
        k = torch.randn(1, hkv, L, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=gen)
        v = torch.randn(1, hkv, L, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=gen)
        k = k.repeat_interleave(hq // hkv, dim=1).contiguous()
        v = v.repeat_interleave(hq // hkv, dim=1).contiguous()
        do = torch.randn(1, hq, L, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=gen)
        samples.append((q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do))

    def fwd():
        with torch.no_grad():
            for q, k, v, _ in samples:
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        for q, k, v, do in samples:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(do)

    with ctx_factory():
        fwd_ms = median_ms(fwd, iters)
        fb_ms = median_ms(fwd_bwd, iters)
    flops = sum(2.0 * 2.0 * L * L / 2.0 * HEAD_DIM * hq for L in LENS)
    bwd_ms = max(fb_ms - fwd_ms, 1e-9)
    return {
        "fwd_ms": fwd_ms,
        "fwd_bwd_ms": fb_ms,
        "bwd_ms": bwd_ms,
        "fwd_tflops": flops / (fwd_ms * 1e-3) / 1e12,
        "bwd_tflops": 2.5 * flops / (bwd_ms * 1e-3) / 1e12,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    _, backend = sdpa_context()
    ctx_factory = lambda: sdpa_context()[0]  # a fresh context manager per use
    out = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "sdpa_backend": backend,
        "lens": LENS,
        "head_dim": HEAD_DIM,
    }
    for name, hq, hkv in (("2b", 8, 2), ("27b", 24, 4)):
        try:
            r = run(hq, hkv, args.iters, ctx_factory)
        except RuntimeError as e:  # e.g. cuDNN refusing a shape: fall back to the default dispatcher
            import contextlib

            out[f"sdpa_fallback_{name}"] = f"default backend ({str(e).splitlines()[0][:200]})"
            r = run(hq, hkv, args.iters, contextlib.nullcontext)
        for key, val in r.items():
            out[f"sdpa_{key}_{name}"] = round(val, 4)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
