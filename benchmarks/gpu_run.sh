#!/usr/bin/env bash
# The worker benchmarks on a GPU host (run from the repository root after `source .mlxcuda/b/setup.sh`).
# Results go to $OUT (default benchmarks/results/new), files named after the card actually used.
# Custom CUDA kernels compile per process (~1.5 s per candidate), so the per-kernel work -- table row, halving vs
# exhaustive, repeatability -- runs in one process per kernel set (session.py); expect 60-110 s per kernel.
# Then decode-size rows and profile data (kernels.py --spread) until the time limit.
set -u
OUT="${OUT:-benchmarks/results/new}"; mkdir -p "$OUT"
TAG="${TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oi 'h[0-9]\{3\}' | tr 'A-Z' 'a-z')}"
TAG="${TAG:-gpu}"
mkdir -p /tmp/kf/kernelfleet && cp -r kernels worker /tmp/kf/kernelfleet/
export PYTHONPATH="/tmp/kf${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MLX_ENABLE_CACHE_THRASHING_CHECK=0
KERNELS="${KERNELS:-$(python3 -c 'from kernelfleet.kernels.catalog import NAMES; print(",".join(NAMES))')}"
timeout "${T_SESSION:-1500}" python3 benchmarks/session.py --kernels "$KERNELS" --outdir "$OUT" --tag "$TAG" \
  --time-limit "${L_SESSION:-1400}" 2>"$OUT/session.log"
echo "session rc=$?"
timeout "${T_TABLE:-1500}" python3 benchmarks/kernels.py --kernels "$KERNELS" --out "$OUT/${TAG}_kernels.txt" \
  --jsonl "$OUT/${TAG}_tuning.jsonl" --spread --time-limit "${L_TABLE:-1400}" 2>"$OUT/kernels.log"
echo "kernels rc=$?"; wc -l "$OUT/${TAG}_tuning.jsonl"
