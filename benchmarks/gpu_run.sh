#!/usr/bin/env bash
# One GPU session of the worker benchmarks (run from the repository root on the GPU host, after
# `source .mlxcuda/b/setup.sh`). Results go to $OUT (default benchmarks/results/new).
# Order = priority: kernel table, search efficiency, repeatability, then profile data until time is up.
set -u
OUT="${OUT:-benchmarks/results/new}"; mkdir -p "$OUT"
# file prefix from the card actually used (h100, h200, ...): numbers are named after the machine that made them
TAG="${TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oi 'h[0-9]\{3\}' | tr 'A-Z' 'a-z')}"
TAG="${TAG:-gpu}"
mkdir -p /tmp/kf/kernelfleet && cp -r kernels worker /tmp/kf/kernelfleet/
export PYTHONPATH="/tmp/kf${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MLX_ENABLE_CACHE_THRASHING_CHECK=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | head -2
python3 -c 'import mlx.core as mx; print(mx.device_info())'
timeout "${T_KERNELS:-250}" python3 benchmarks/kernels.py --out "$OUT/${TAG}_kernels.txt" \
  --jsonl "$OUT/${TAG}_tuning.jsonl" --time-limit "${L_KERNELS:-190}" --precompile 15 2>"$OUT/kernels.log"
echo "kernels rc=$?"; tail -n 25 "$OUT/kernels.log"
timeout "${T_SEARCH:-130}" python3 benchmarks/search.py --out "$OUT/${TAG}_search.txt" \
  --time-limit "${L_SEARCH:-100}" 2>"$OUT/search.log"
echo "search rc=$?"; tail -n 5 "$OUT/search.log"
timeout "${T_REPEAT:-70}" python3 benchmarks/repeatability.py --out "$OUT/${TAG}_repeatability.txt" \
  --time-limit "${L_REPEAT:-40}" 2>"$OUT/repeat.log"
echo "repeatability rc=$?"
timeout "${T_SPREAD:-90}" python3 benchmarks/kernels.py --spread-only --jsonl "$OUT/${TAG}_tuning.jsonl" \
  --time-limit "${L_SPREAD:-55}" --precompile 15 --precompile-groups 15 2>"$OUT/spread.log"
echo "spread rc=$?"; tail -n 3 "$OUT/spread.log"; wc -l "$OUT/${TAG}_tuning.jsonl"
