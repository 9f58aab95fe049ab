#!/usr/bin/env python3
"""Side-by-side baseline: transformers Qwen3_5ForCausalLM training steps on the same shapes and
data mix as `qwentune bench` (random init, bf16, AdamW, gradient checkpointing on as the common
recipe does), on the GPU machine.

    python3 tools/hf_baseline.py --preset 2b [--steps 4] [--tokens-per-batch 8192] [--mode packed|padded]
                                 [--peft] [--fla DIR]

--peft: LoRA through PEFT (r 16, alpha 32, every linear projection, as `qwentune bench --method lora`).
--fla DIR: flash-linear-attention's Triton kernels (a source tree on DIR, e.g. `git archive HEAD fla`)
        as the GDN layers' chunk_gated_delta_rule: the seed's best stack. Its gated backward refuses to
        run on Hopper with Triton 3.4-3.7.0 (it gave wrong gradients there); for a speed-only baseline
        the guard is to be disabled in the carried copy (bench/run_lora_gpu.sh does, and says so).

packed: one row of tokens_per_batch tokens per step, samples concatenated, per-sample position_ids
        and cu_seq_lens_q/k + max_length_q/k passed (transformers' flattening-collator path);
padded: the same samples as a rectangular batch (rows padded to the longest sample, attention mask).
Prints one JSON line: median step seconds, trained tokens/s, peak memory. Without
flash-linear-attention and causal-conv1d installed, transformers uses its torch fallbacks (slower
than the best Python stack, and its packed GDN path then leaks state across samples; it is only
timed here).
"""
import argparse
import json
import random
import statistics
import time

import torch
from transformers import AutoConfig, Qwen3_5ForCausalLM

PRESETS = {  # docs/model_spec.md section 7
    "0.8b": (1024, 24, 3584, 8, 2, 16, True),
    "2b": (2048, 24, 6144, 8, 2, 16, True),
    "4b": (2560, 32, 9216, 16, 4, 32, True),
    "9b": (4096, 32, 12288, 16, 4, 32, False),
}


def chat_like_lengths(total, rng):
    """Sample lengths like chat SFT data (log-normal around ~700 tokens), filling `total` exactly."""
    out, left = [], total
    while left > 0:
        n = int(min(max(rng.lognormvariate(6.5, 0.6), 32), 3000))
        n = min(n, left)
        out.append(n)
        left -= n
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="2b", choices=sorted(PRESETS))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tokens-per-batch", type=int, default=8192)
    ap.add_argument("--mode", default="packed", choices=["packed", "padded"])
    ap.add_argument("--no-grad-ckpt", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peft", action="store_true")
    ap.add_argument("--fla", default="")
    args = ap.parse_args()
    H, L, I, Hq, Hkv, Hv, tie = PRESETS[args.preset]
    cfg = AutoConfig.for_model(
        "qwen3_5_text", vocab_size=248320, hidden_size=H, num_hidden_layers=L, intermediate_size=I,
        num_attention_heads=Hq, num_key_value_heads=Hkv, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=Hv, linear_key_head_dim=128, linear_value_head_dim=128,
        tie_word_embeddings=tie, max_position_embeddings=262144, attn_implementation="sdpa",
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True}, use_cache=False)
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    with torch.device(dev):
        model = Qwen3_5ForCausalLM(cfg).to(torch.bfloat16)
    fla_used = ""
    if args.fla:
        # transformers picks its GDN kernels at import (module globals) or per layer (attributes),
        # depending on the version: point both at flash-linear-attention's.
        import sys
        sys.path.insert(0, args.fla)
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        import transformers.models.qwen3_5.modeling_qwen3_5 as mq
        patched = []
        for name in dir(mq):
            if "chunk_gated_delta_rule" in name:
                setattr(mq, name, chunk_gated_delta_rule)
                patched.append(name)
            elif "recurrent_gated_delta_rule" in name:
                setattr(mq, name, fused_recurrent_gated_delta_rule)
                patched.append(name)
        for m in model.modules():
            for attr in ("chunk_gated_delta_rule", "recurrent_gated_delta_rule"):
                if hasattr(m, attr):
                    setattr(m, attr, chunk_gated_delta_rule if attr.startswith("chunk") else fused_recurrent_gated_delta_rule)
                    patched.append(type(m).__name__ + "." + attr)
        assert patched, "found no GDN kernel in transformers to replace: " + ", ".join(n for n in dir(mq) if "delta" in n)
        fla_used = ",".join(sorted(set(patched)))
    model.train()
    if args.peft:
        from peft import LoraConfig, get_peft_model
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b",
                   "out_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets, lora_dropout=0.0))
        if not args.no_grad_ckpt:
            model.enable_input_require_grads()
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif not args.no_grad_ckpt:
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)
    rng = random.Random(args.seed)
    n_params = sum(p.numel() for p in model.parameters())

    def make_batch():
        lens = chat_like_lengths(args.tokens_per_batch, rng)
        ids = [torch.randint(0, 248000, (n,)) for n in lens]
        if args.mode == "packed":
            input_ids = torch.cat(ids)[None].to(dev)
            labels = input_ids.clone()
            starts = [0]
            for n in lens:
                starts.append(starts[-1] + n)
            for s in starts[:-1]:
                labels[0, s] = -100  # the flattening collator's first label of each sample
            pos = torch.cat([torch.arange(n) for n in lens])[None].to(dev)
            cu = torch.tensor(starts, dtype=torch.int32, device=dev)
            kw = dict(position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lens),
                      max_length_k=max(lens))
            return dict(input_ids=input_ids, labels=labels, **kw), sum(n - 1 for n in lens)
        longest = max(lens)
        input_ids = torch.zeros(len(lens), longest, dtype=torch.long)
        mask = torch.zeros(len(lens), longest, dtype=torch.long)
        for r, t in enumerate(ids):
            input_ids[r, :len(t)] = t
            mask[r, :len(t)] = 1
        labels = input_ids.masked_fill(mask == 0, -100)
        return dict(input_ids=input_ids.to(dev), attention_mask=mask.to(dev), labels=labels.to(dev)), \
            sum(n - 1 for n in lens)

    times, trained = [], 0
    for step in range(args.warmup + args.steps):
        batch, n_trained = make_batch()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
            trained += n_trained
    med = statistics.median(times)
    tok_s = args.tokens_per_batch / med
    print(json.dumps({"engine": "transformers" + ("+peft" if args.peft else "") + ("+fla" if args.fla else ""),
                      "fla_patched": fla_used,
                      "preset": args.preset, "mode": args.mode,
                      "grad_ckpt": not args.no_grad_ckpt, "params": n_params, "median_step_s": med,
                      "tokens_per_s": tok_s, "trained_tokens_per_s": trained / sum(times),
                      "mfu_6nd": 6 * n_params * tok_s / 790e12,
                      "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30, "loss": float(loss)}))


if __name__ == "__main__":
    main()
