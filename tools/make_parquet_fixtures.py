#!/usr/bin/env python3
"""Writes tests/testdata/parquet/: small parquet files written by pyarrow with the ultrachat_200k
schema (prompt, prompt_id, messages: list<struct<content, role>>) in several writer variants, plus
the same rows as JSONL. tests/test_parquet.cpp reads every variant listed in manifest.json and
compares each row with its JSONL twin.

Run where pyarrow is installed (the GPU machine), from the repository root:
    python3 tools/make_parquet_fixtures.py            # writes tests/testdata/parquet/
    python3 tools/make_parquet_fixtures.py --out DIR
The output is deterministic for a given pyarrow version; commit the whole directory.
"""
import argparse
import json
import os
import random
import shutil

import pyarrow as pa
import pyarrow.parquet as pq

MESSAGE = pa.struct([("content", pa.string()), ("role", pa.string())])
ULTRACHAT = pa.schema([("prompt", pa.string()), ("prompt_id", pa.string()), ("messages", pa.list_(MESSAGE))])

TOPICS = [
    "the history of tea", "Rust lifetimes", "quantum tunnelling", "Grüße aus Köln — ünïcödé",
    "日本語のテキスト処理", "emoji 🚀🔥 and flags 🇫🇷", "", "tabs\tand\nnewlines \"quoted\" \\ backslash",
    "עברית מימין לשמאל", "combining e\u0301 and nul\u0000inside", "Ελληνικά", "  leading and trailing spaces  ",
]


def ultrachat_rows(n=40):
    rng = random.Random(20240611)
    rows = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        prompt = f"Tell me about {topic} (#{i})" if i % 11 != 5 else ""
        msgs = []
        if i % 6 == 0:
            msgs.append({"content": "You are a helpful assistant.", "role": "system"})
        for t in range(1 + (i * 7) % 5):
            user = prompt if t == 0 else f"follow-up {t}: what about {TOPICS[(i + t) % len(TOPICS)]}?"
            reply = f"Answer {i}.{t}: " + " ".join(rng.choice(["alpha", "β", "γάμμα", "delta", "🙂", "x"]) for _ in range(rng.randint(0, 40)))
            if i == 13 and t == 0:
                reply = ("A long answer. " + "Lorem ipsum dolor sit amet, ünïcödé ✓ " * 800).strip()
            if i % 9 == 4 and t == 1:
                reply = ""
            msgs.append({"content": user, "role": "user"})
            msgs.append({"content": reply, "role": "assistant"})
        rows.append({"prompt": prompt, "prompt_id": "%016x" % rng.getrandbits(64), "messages": msgs})
    return rows


def null_rows(rows):
    out = json.loads(json.dumps(rows))
    for i, r in enumerate(out):
        if i % 4 == 1:
            r["prompt"] = None
        if i % 13 == 2:
            r["prompt_id"] = None
    out[3]["messages"] = None                    # null list
    out[7]["messages"] = []                      # empty list
    out[8]["messages"][0]["role"] = None         # null field inside the struct
    out[9]["messages"].insert(1, None)           # null list element
    out[10]["messages"][-1]["content"] = None
    return out


TYPES = pa.schema([
    ("b", pa.bool_()), ("i32", pa.int32()), ("i64", pa.int64()), ("f", pa.float32()), ("d", pa.float64()),
    ("s", pa.string()), ("tags", pa.list_(pa.string())), ("nums", pa.list_(pa.int64())),
    ("st", pa.struct([("a", pa.int32()), ("s", pa.string())])), ("m", pa.map_(pa.string(), pa.int32())),
])


def types_rows(n=30):
    rows = []
    for i in range(n):
        rows.append({
            "b": None if i % 4 == 3 else i % 3 == 0,
            "i32": None if i % 5 == 2 else i * 1000 - 7000,
            "i64": None if i % 7 == 6 else (1 << (i % 62)) * (-1 if i % 2 else 1),
            "f": None if i % 7 == 1 else i * 0.25 - 2.5,       # exactly representable in float32
            "d": None if i % 6 == 5 else i * 1.125 - 1e10,
            "s": None if i % 8 == 7 else "s%d" % (i % 5),
            "tags": None if i % 9 == 3 else ["t%d" % k for k in range(i % 4)],
            "nums": [None if k == 1 else i * 10 + k for k in range(i % 5)],
            "st": None if i % 5 == 4 else {"a": None if i % 3 == 0 else i, "s": "zz" if i % 2 else None},
            "m": None if i % 6 == 2 else {"k%d" % k: (None if k == 1 else k + i) for k in range(i % 3)},
        })
    return rows


def to_table(rows, schema):
    if "m" in schema.names:  # pyarrow wants map values as lists of (key, value) pairs
        rows = [dict(r, m=None if r["m"] is None else list(r["m"].items())) for r in rows]
    return pa.Table.from_pylist(rows, schema=schema)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "testdata", "parquet"))
    out = os.path.abspath(ap.parse_args().out)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)

    rows = ultrachat_rows()
    nrows = null_rows(rows)
    trows = types_rows()
    write_jsonl(os.path.join(out, "ultrachat.jsonl"), rows)
    write_jsonl(os.path.join(out, "nulls.jsonl"), nrows)
    write_jsonl(os.path.join(out, "types.jsonl"), trows)
    table, ntable, ttable = to_table(rows, ULTRACHAT), to_table(nrows, ULTRACHAT), to_table(trows, TYPES)

    variants = []

    def write(name, tbl, jsonl, **kw):
        path = os.path.join(out, name)
        pq.write_table(tbl, path, **kw)
        md = pq.ParquetFile(path).metadata
        variants.append({"parquet": name, "jsonl": jsonl, "row_groups": md.num_row_groups, "writer_options": {k: str(v) for k, v in kw.items()}})

    write("snappy_dict.parquet", table, "ultrachat.jsonl", compression="snappy", use_dictionary=True)
    # Several row groups, data page v2, small pages and a small dictionary limit (so some columns
    # fall back from dictionary to PLAIN pages within a chunk).
    write("zstd_v2_rg7.parquet", table, "ultrachat.jsonl", compression="zstd", row_group_size=7,
          data_page_version="2.0", use_dictionary=True, data_page_size=512, write_batch_size=4,
          dictionary_pagesize_limit=256)
    write("gzip_plain.parquet", table, "ultrachat.jsonl", compression="gzip", use_dictionary=False)
    write("uncompressed.parquet", table, "ultrachat.jsonl", compression="none", use_dictionary=False)
    write("nulls.parquet", ntable, "nulls.jsonl", compression="snappy", use_dictionary=True, data_page_version="2.0",
          row_group_size=16)
    write("nulls_v1_zstd.parquet", ntable, "nulls.jsonl", compression="zstd", use_dictionary=False, data_page_size=1024,
          write_batch_size=3)
    write("types.parquet", ttable, "types.jsonl", compression="zstd", data_page_version="2.0", use_dictionary=True)
    write("types_v1_plain.parquet", ttable, "types.jsonl", compression="snappy", use_dictionary=False)

    # A directory of shards in the Hugging Face naming scheme.
    shard_dir = os.path.join(out, "shards")
    os.makedirs(shard_dir)
    for k, (a, b) in enumerate([(0, 14), (14, 27), (27, 40)]):
        pq.write_table(table.slice(a, b - a), os.path.join(shard_dir, "train-%05d-of-00003.parquet" % k), compression="snappy")
    variants.append({"parquet": "shards", "jsonl": "ultrachat.jsonl"})

    # Files the reader must reject with a clear error naming the feature.
    unsupported = []
    for codec, expect in [("lz4", "LZ4"), ("brotli", "BROTLI")]:
        if pa.Codec.is_available(codec):
            name = "unsupported_%s.parquet" % codec
            pq.write_table(table.slice(0, 5), os.path.join(out, name), compression=codec)
            unsupported.append({"parquet": name, "error": expect})
    try:
        name = "unsupported_delta.parquet"
        pq.write_table(table.slice(0, 5), os.path.join(out, name), compression="none", use_dictionary=False,
                       column_encoding={"prompt_id": "DELTA_BYTE_ARRAY"})
        unsupported.append({"parquet": name, "error": "DELTA_BYTE_ARRAY"})
    except Exception as e:  # older pyarrow without column_encoding
        print("skipping unsupported_delta.parquet:", e)

    manifest = {"generator": "tools/make_parquet_fixtures.py", "pyarrow": pa.__version__,
                "variants": variants, "unsupported": unsupported}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(out) for fn in fns)
    print("wrote %s (%d bytes, pyarrow %s)" % (out, total, pa.__version__))


if __name__ == "__main__":
    main()
