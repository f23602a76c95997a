#!/usr/bin/env bash
# The checks a lent GPU machine runs (one short script; see docs/benchmarks.md "GPU check"):
#   1. the `gpu` tests (bf16 hooks = loop on CUDA, the index / queries / drill-down on CUDA; the 2-GPU
#      torchrun test needs two devices and is skipped on one);
#   2. benchmarks/bench_gpu.py: hooks = loop = vmap on CUDA at SmolLM2-135M's shape, their speed,
#      `gradian train` vs `gradian index` (row, torchrun, sentence, sentence with --rows-per-forward 8)
#      throughput through the CLI;
#   3. benchmarks/bench_joint_batch.py on the adapter step 2 trained: the sentence pass one row at a time
#      against 4 and 8 rows per forward (slower on a CPU; on a GPU it decides --rows-per-forward's default).
# Usage: benchmarks/gpu_check.sh [OUT_DIR]   (OUT_DIR default /tmp/gradian-gpu-check)
# Needs CUDA, this checkout on PYTHONPATH (src/) and the packages of constraints.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-/tmp/gradian-gpu-check}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print(torch.__version__, torch.cuda.get_device_name())" || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
t0=$(date +%s)
"$py" -m pytest -m gpu -q -p no:cacheprovider -o addopts="" --continue-on-collection-errors tests 2>&1 | tee "$out/pytest-gpu.log"
tests_rc=${PIPESTATUS[0]}
echo "[gpu tests] exit $tests_rc, $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
"$py" benchmarks/bench_gpu.py --out "$out/work" 2>&1 | tee "$out/bench-gpu.log"
bench_rc=${PIPESTATUS[0]}
cp "$out/work/gpu_check.md" "$out/" 2>/dev/null || true
echo "[bench_gpu] exit $bench_rc, $(( $(date +%s) - t1 )) s"
t2=$(date +%s)
"$py" benchmarks/bench_joint_batch.py --base "$out/work/base" --adapter "$out/work/adapter" \
  --data "$out/work/sentence.jsonl" --rows 16 --batches 1,4,8 --repeats 1 --max-length 256 \
  --device cuda --dtype bfloat16 2>&1 | tee "$out/bench-joint-batch.log"
joint_rc=${PIPESTATUS[0]}
echo "[bench_joint_batch] exit $joint_rc, $(( $(date +%s) - t2 )) s"
exit $(( tests_rc || bench_rc || joint_rc ))
