#!/usr/bin/env python3
"""Golden fixtures for the CPU reference model (definition of correct: HF transformers, fp32).

Builds tiny Qwen3.5 text models (linear and full-attention layers mixed, Hv = 2 Hk, dk != dv,
partial RoPE; one with tied and one with untied embeddings), saves each as an HF directory, runs
transformers in fp32 with eager attention on each sample ALONE (transformers' own packed path leaks
recurrent state across samples without fla/causal-conv1d), and stores per-sample loss sums, the
mean loss over all trained tokens, the logits of every sample and every parameter gradient of the
mean loss.

Run where torch and transformers >= 5.17 are installed (the GPU machine; CPU is enough):
    python3 tools/make_fixtures.py --out tests/testdata/golden
Output per model: DIR/<name>/{config.json, model.safetensors, golden.json, golden.safetensors}.
"""
import argparse
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, Qwen3_5ForCausalLM

SAMPLE_LENGTHS = [1, 2, 3, 63, 64, 65, 130]


def make_config(tied):
    layer_types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    return AutoConfig.for_model(
        "qwen3_5_text",
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24,
        linear_conv_kernel_dim=4, layer_types=layer_types, full_attention_interval=4,
        rms_norm_eps=1e-6, max_position_embeddings=1024, tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        attn_implementation="eager", use_cache=False, dtype="float32",
    )


def randomize(model, gen):
    """Scales chosen so every path carries signal: (1+w) norms and gates are not at their init."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(torch.float32)
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=gen, dtype=torch.float64) * 7.5 + 0.5).float())
            elif name.endswith("dt_bias"):
                p.copy_(r * 0.5)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * r)
            elif "norm" in name:
                p.copy_(0.2 * r)
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(0.5 * r)
            elif "conv1d" in name:
                p.copy_(0.3 * r)
            else:
                p.copy_(r / (p.shape[-1] ** 0.5))


def make_samples(gen, vocab):
    samples = []
    for i, n in enumerate(SAMPLE_LENGTHS):
        ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
        labels = list(ids)
        # Mask a prompt prefix on some samples (chat SFT), none on others.
        prompt = [0, 0, 1, 20, 0, 30, 50][i]
        for t in range(min(prompt, n)):
            labels[t] = -100
        samples.append({"input_ids": ids, "labels": labels})
    return samples


def build(out_dir, name, tied, seed):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = make_config(tied)
    model = Qwen3_5ForCausalLM(cfg).float()
    randomize(model, gen)
    model.eval()  # no dropout; gradients still flow
    samples = make_samples(gen, cfg.vocab_size)

    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)

    model.zero_grad(set_to_none=True)
    sums, counts, tensors = [], [], {}
    losses = []
    for i, s in enumerate(samples):
        ids = torch.tensor([s["input_ids"]])
        logits = model(input_ids=ids).logits.float()[0]  # [T, V]
        tensors[f"logits.{i}"] = logits.detach().contiguous()
        # HF ForCausalLMLoss math: shift left, pad with -100, fp32, ignore -100; kept as a sum here.
        labels = torch.tensor(s["labels"][1:] + [-100])
        loss_sum = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
        sums.append(loss_sum)
        counts.append(int((labels != -100).sum()))
    total = sum(counts)
    mean = torch.stack(sums).sum() / total
    mean.backward()
    for pname, p in model.named_parameters():
        tensors[f"grad.{pname}"] = p.grad.detach().float().contiguous()
    save_file(tensors, os.path.join(d, "golden.safetensors"))
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tie_word_embeddings": tied,
        "samples": samples,
        "loss_sums": [float(x) for x in sums],
        "trained_counts": counts,
        "mean_loss": float(mean),
        "param_names": [n for n, _ in model.named_parameters()],
    }
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(meta, f)
    print(json.dumps({"fixture": name, "mean_loss": float(mean), "trained": total,
                      "files": sorted(os.listdir(d))}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/testdata/golden")
    args = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    build(args.out, "tiny_tied", True, 1234)
    build(args.out, "tiny_untied", False, 4321)


if __name__ == "__main__":
    main()
