#!/usr/bin/env python3
"""LoRA golden fixtures and checks against PEFT (definition of correct: transformers + PEFT, fp32).

make: for the tiny golden models of tools/make_fixtures.py, wraps the model with a PEFT LoraConfig,
gives every lora_A / lora_B seeded random values (B is zero at PEFT's init, which would hide A's
gradient), runs each sample ALONE in fp32 and stores the mean loss over all trained tokens, the
per-sample loss sums and every adapter gradient of the mean loss, plus the adapter as PEFT saves it:

    python3 tools/make_lora_fixtures.py make --golden tests/testdata/golden
    -> tests/testdata/golden/<lora name>/{adapter_config.json, adapter_model.safetensors,
                                          golden.json, golden.safetensors}

check: PEFT loads an adapter that qwentune wrote, and its logits equal those of transformers on
the directory `qwentune merge` made from it (and of the base when B = 0 would be trivial, so the
adapter must be a trained one):

    python3 tools/make_lora_fixtures.py check --base DIR --adapter DIR --merged DIR --ids IDS.json

Run where torch, transformers >= 5.17 and peft are installed (the GPU machine; CPU is enough).
"""
import argparse
import json
import os

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import Qwen3_5ForCausalLM

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b",
       "out_proj", "gate_proj", "up_proj", "down_proj"]
FIXTURES = [  # name, base fixture, targets, r, alpha, rslora, seed, modules_to_save
    ("lora_untied", "tiny_untied", ALL, 4, 8.0, False, 77, None),
    ("lora_tied_rslora", "tiny_tied", ["q_proj", "v_proj", "in_proj_qkv", "out_proj", "down_proj"], 8, 4.0, True, 78, None),
    ("lora_untied_modules_to_save", "tiny_untied", ["q_proj", "in_proj_qkv", "in_proj_z", "down_proj"], 4, 8.0, False, 79,
     ["norm", "lm_head"]),
]


def peft_key(param_name):
    """PEFT's saved key of a trainable parameter (the adapter name 'default' left out)."""
    return (param_name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")
            .replace(".modules_to_save.default.", "."))


def make(golden):
    for name, base, targets, r, alpha, rslora, seed, mts in FIXTURES:
        base_dir = os.path.join(golden, base)
        meta = json.load(open(os.path.join(base_dir, "golden.json")))
        model = Qwen3_5ForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
        cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, use_rslora=rslora,
                         bias="none", task_type="CAUSAL_LM", modules_to_save=mts)
        pm = get_peft_model(model, cfg)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "modules_to_save" in n:  # the trained copies start away from the base's
                    p.add_((torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.05).float())
                elif "lora_" in n:
                    p.copy_((torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3 / p.shape[-1] ** 0.5).float())
        pm.eval()
        sums, counts, tensors = [], [], {}
        for i, s in enumerate(meta["samples"]):
            ids = torch.tensor([s["input_ids"]])
            logits = pm(input_ids=ids).logits.float()[0]
            labels = torch.tensor(s["labels"][1:] + [-100])
            sums.append(torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum"))
            counts.append(int((labels != -100).sum()))
        mean = torch.stack(sums).sum() / sum(counts)
        mean.backward()
        for n, p in pm.named_parameters():
            if p.requires_grad:
                tensors["grad." + peft_key(n)] = p.grad.detach().float().contiguous()
        out = os.path.join(golden, name)
        os.makedirs(out, exist_ok=True)
        pm.save_pretrained(out, safe_serialization=True)
        save_file(tensors, os.path.join(out, "golden.safetensors"))
        json.dump({"base": base, "targets": targets, "r": r, "lora_alpha": alpha, "use_rslora": rslora,
                   "modules_to_save": mts,
                   "mean_loss": float(mean), "loss_sums": [float(x) for x in sums], "trained_counts": counts},
                  open(os.path.join(out, "golden.json"), "w"))
        print(json.dumps({"fixture": name, "mean_loss": float(mean), "grads": len(tensors),
                          "files": sorted(os.listdir(out))}))


def check(base, adapter, merged, ids_file):
    ids = torch.tensor([json.load(open(ids_file))])
    model = Qwen3_5ForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager")
    pm = PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        a = pm(input_ids=ids).logits.float()
        with pm.disable_adapter():
            b = pm(input_ids=ids).logits.float()
    m = Qwen3_5ForCausalLM.from_pretrained(merged, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        c = m(input_ids=ids).logits.float()
    rel = lambda x, y: float((x - y).abs().max() / y.abs().max())
    res = {"peft_loaded_qwentune_adapter": True,
           "max_rel_diff_peft_vs_qwentune_merged": rel(c, a),
           "max_rel_diff_peft_vs_base (must be > 0: a trained adapter)": rel(b, a)}
    print(json.dumps(res))
    assert res["max_rel_diff_peft_vs_qwentune_merged"] < 1e-4, res


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("--golden", default="tests/testdata/golden")
    ck = sub.add_parser("check")
    for k in ("--base", "--adapter", "--merged", "--ids"):
        ck.add_argument(k, required=True)
    args = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    if args.cmd == "make":
        make(args.golden)
    else:
        check(args.base, args.adapter, args.merged, args.ids)


if __name__ == "__main__":
    main()
