#!/usr/bin/env bash
# ZeRO-3 checks on one GPU, printed as JSON lines (the multi-GPU runs need a machine with several):
#  1. a 0.8b-shaped model, 4 steps of 4 x 1024-token rows: ZeRO-3 at one rank through NCCL (one
#     captured graph per step) and 2 and 4 ranks sharing the GPU through MPI host staging (eager,
#     the fused AdamW over each rank's shards) against the single-rank unsharded run, loss per step;
#     ZeRO-2 at 2 ranks (host optimizer) beside them;
#  2. the cost of the sharding machinery: `bench --preset 2b --zero 3` against `--zero 0`, alternated.
#   zero3_checks.sh QWENTUNE_BIN SCRATCH_DIR [--no-bench]
set -u
qt=$1 out=$2 bench=${3:-}
rm -rf "$out" && mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/examples/demo/make_data.sh" "$out" 4 1 >/dev/null
"$qt" init-model --preset 0.8b --out "$out/m08" --dtype bf16 --seed 3 >/dev/null 2>&1
mpi=(mpirun --oversubscribe --allow-run-as-root -x LD_LIBRARY_PATH)
common=(--set model="$out/m08" --set data.path="$out/train.jsonl" --set data.cache_dir="$out/cache"
        --set data.tokens_per_batch=1024 --set train.global_batch_tokens=4096 --set train.max_steps=4
        --set train.backend=cuda --set train.log_every=0 --set train.lr=1e-4 --set train.save_every=0)
run() {  # name ranks sets...
  local name=$1 ranks=$2
  shift 2
  local launch=()
  [ "$ranks" -gt 1 ] && launch=("${mpi[@]}" -np "$ranks")
  local t0=$SECONDS
  "${launch[@]}" "$qt" train --config "$root/examples/demo/demo.yaml" "${common[@]}" --set output_dir="$out/$name" "$@" \
    >"$out/$name.log" 2>&1 || { echo "{\"run\": \"$name\", \"failed\": true}"; tail -8 "$out/$name.log"; }
  echo "{\"run\": \"$name\", \"wall_s\": $((SECONDS - t0))}"
}
run one 1 --set dist.zero=0
run z3_nccl_1 1 --set dist.zero=3 --set dist.communicator=nccl
run z3_mpi_2 2 --set dist.zero=3 --set dist.communicator=mpi
run z3_mpi_4 4 --set dist.zero=3 --set dist.communicator=mpi
run z3_keep_mpi_2 2 --set dist.zero=3 --set dist.communicator=mpi --set dist.reshard_after_forward=false
run z2_mpi_2 2 --set dist.zero=2 --set dist.communicator=mpi
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def curve(name):
    p = f"{out}/{name}/metrics.jsonl"
    if not os.path.exists(p): return {}
    return {r["step"]: (r["loss"], r.get("grad_norm")) for r in map(json.loads, open(p)) if "loss" in r}
ref = curve("one")
for name in ["z3_nccl_1", "z3_mpi_2", "z3_mpi_4", "z3_keep_mpi_2", "z2_mpi_2"]:
    c = curve(name)
    rel = [abs(c[s][0] - ref[s][0]) / ref[s][0] for s in ref if s in c]
    graph = "cuda-graph" in open(f"{out}/{name}.log").read()
    print(json.dumps({"check": f"zero3_{name}_vs_one_rank", "steps": len(rel), "loss_ref": [ref[s][0] for s in sorted(ref)],
                      "loss": [c[s][0] for s in sorted(c)], "max_rel_loss_diff": max(rel) if rel else None,
                      "graph": graph}))
PY
[ "$bench" = --no-bench ] && exit 0
for i in 1 2; do
  for z in 0 3; do
    "$qt" bench --preset 2b --steps 5 --warmup 2 --zero $z 2>/dev/null | tail -1
  done
done
