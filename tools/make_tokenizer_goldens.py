#!/usr/bin/env python3
"""HF `tokenizers` goldens and speed for the qwentune tokenizer tests and benchmark.

Needs `pip install tokenizers` (any recent version) and the Qwen3 fixture (scripts/fetch_test_data.sh).
From the repository root:

    scripts/fetch_test_data.sh
    python3 tools/make_tokenizer_goldens.py            # goldens + timing
    python3 tools/make_tokenizer_goldens.py --no-bench # goldens only

Writes, for every line of tests/testdata/tokenizer/corpus.jsonl (encode, add_special_tokens=False):
  tests/testdata/tokenizer/qwen3_golden_ids.jsonl       with the Qwen3 tokenizer.json as is
  tests/testdata/tokenizer/qwen35regex_golden_ids.jsonl with its Split regex replaced by Qwen3.5's
                                                        (variant file: .cache/testdata/qwen3/tokenizer_qwen35regex.json)
Then times HF on the corpus repeated to ~20 MB: one thread (encode loop, TOKENIZERS_PARALLELISM=false)
and all threads (encode_batch), each in a fresh subprocess, and prints one JSON object with tokens/s.
Compare with: build/src/bench_tokenizer --tokenizer .cache/testdata/qwen3/tokenizer.json \
                  --corpus tests/testdata/tokenizer/corpus.jsonl --repeat-mb 20 --seconds 10
"""
import argparse
import json
import os
import subprocess
import sys
import time

# docs/model_spec.md section 8 (transformers' tokenization_qwen3_5.py): marks count as letters.
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def read_corpus(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def write_ids(tok, texts, out):
    with open(out, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(tok.encode(t, add_special_tokens=False).ids, separators=(",", ":")) + "\n")
    print(f"wrote {len(texts)} lines to {out}", file=sys.stderr)


def make_variant(src, dst):
    with open(src, encoding="utf-8") as f:
        j = json.load(f)
    pre = j["pre_tokenizer"]
    steps = pre["pretokenizers"] if pre["type"] == "Sequence" else [pre]
    splits = [s for s in steps if s["type"] == "Split"]
    assert len(splits) == 1 and "Regex" in splits[0]["pattern"], "expected one Split with a Regex"
    splits[0]["pattern"]["Regex"] = QWEN35_REGEX
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)


def bench_child(mode, tokenizer, corpus, repeat_mb):
    # Runs in a subprocess so TOKENIZERS_PARALLELISM is read fresh.
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer)
    base = read_corpus(corpus)
    docs, size = [], 0
    while size < repeat_mb * 1e6:
        for t in base:
            docs.append(t)
            size += len(t.encode("utf-8"))
    tok.encode_batch(docs[:1000], add_special_tokens=False)  # warm-up
    t0 = time.perf_counter()
    if mode == "single":
        n = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in docs)
    else:
        n = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
    dt = time.perf_counter() - t0
    print(json.dumps({"mode": mode, "docs": len(docs), "corpus_mb": size / 1e6, "seconds": dt, "tokens": n,
                      "tokens_per_s": n / dt, "mb_per_s": size / 1e6 / dt}))


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=os.path.join(root, ".cache/testdata/qwen3/tokenizer.json"))
    ap.add_argument("--corpus", default=os.path.join(root, "tests/testdata/tokenizer/corpus.jsonl"))
    ap.add_argument("--out-dir", default=os.path.join(root, "tests/testdata/tokenizer"))
    ap.add_argument("--repeat-mb", type=float, default=20)
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench-child", choices=["single", "batch"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.bench_child:
        bench_child(a.bench_child, a.tokenizer, a.corpus, a.repeat_mb)
        return

    import tokenizers
    from tokenizers import Tokenizer
    texts = read_corpus(a.corpus)
    write_ids(Tokenizer.from_file(a.tokenizer), texts, os.path.join(a.out_dir, "qwen3_golden_ids.jsonl"))
    variant = os.path.join(os.path.dirname(a.tokenizer), "tokenizer_qwen35regex.json")
    make_variant(a.tokenizer, variant)
    write_ids(Tokenizer.from_file(variant), texts, os.path.join(a.out_dir, "qwen35regex_golden_ids.jsonl"))
    if a.no_bench:
        return

    result = {"engine": "hf-tokenizers", "version": tokenizers.__version__, "cpus": os.cpu_count()}
    for mode, parallel in (("single", "false"), ("batch", "true")):
        env = dict(os.environ, TOKENIZERS_PARALLELISM=parallel)
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--bench-child", mode, "--tokenizer",
                              a.tokenizer, "--corpus", a.corpus, "--repeat-mb", str(a.repeat_mb)],
                             env=env, check=True, capture_output=True, text=True).stdout
        result["single_thread" if mode == "single" else "multi_thread"] = json.loads(out)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
