#!/usr/bin/env bash
# The worker benchmarks on every GPU of this host: kernel table, halving vs exhaustive, repeatability and
# dense tuning data (benchmarks/session.py says how the work is cut and why). Run from the repository root
# after `source .mlxcuda/b/setup.sh`; results go to $OUT (default benchmarks/results/new):
#   <tag>_session.txt   the combined report      <tag>_tuning.jsonl   every tuning report (compact)
# Environment: BUDGET_S (default 480) seconds for all passes; KERNELS (default: the catalog); GPUS (default:
# every GPU nvidia-smi lists); TAG (default: the card's model, e.g. h100); PASSES (default 1,2; 2 = only the
# dense tuning data); PRIMARY_ONLY=1 (only the units with a kernel's first large shape: search and repeat);
# KF_TURN_CACHE_GB (default 8: MLX buffer cache of the unit whose turn it is); JOBS=FILE (side-by-side jobs,
# e.g. from benchmarks/predict.py --jobs: only their units, pass 3; the rows land in side_by_side_<tag>.jsonl).
# nvidia-smi logs clocks, power, temperature and throttle reasons every 200 ms to $OUT/smi.csv.
# Duration: PASSES=1 over the whole catalog took 327 + 321 s on one H100 (4 ms rounds), as two runs of six
# KERNELS each; merge their unit files with `python benchmarks/session.py --merge DIR --tag TAG`.
set -u
OUT="${OUT:-benchmarks/results/new}"; mkdir -p "$OUT"; rm -rf "$OUT/turns"
TAG="${TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oi 'h[0-9]\{3\}' | tr 'A-Z' 'a-z')}"
TAG="${TAG:-gpu}"
GPUS="${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}"
GPUS="${GPUS:-1}"; [ "$GPUS" -ge 1 ] || GPUS=1
BUDGET_S="${BUDGET_S:-480}"
mkdir -p /tmp/kf/kernelfleet && cp -r kernels worker kernelfleet/__init__.py /tmp/kf/kernelfleet/
export PYTHONPATH="/tmp/kf${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MLX_ENABLE_CACHE_THRASHING_CHECK=0
deadline=$(( $(date +%s) + BUDGET_S ))
python3 benchmarks/session.py --plan "$GPUS" ${KERNELS:+--kernels "$KERNELS"} ${PRIMARY_ONLY:+--primary-only} \
  ${JOBS:+--jobs "$JOBS"} > "$OUT/plan.jsonl" || exit 1
PASSES="${PASSES:-$([ -n "${JOBS:-}" ] && echo 3 || echo 1,2)}"
smi_fields=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu
nvidia-smi --query-gpu="$smi_fields,clocks_event_reasons.active" --format=csv -lms 200 > "$OUT/smi.csv" 2>/dev/null &
smi=$!; sleep 1
if ! kill -0 "$smi" 2>/dev/null; then  # an older driver: the throttle-reasons field has its old name
  nvidia-smi --query-gpu="$smi_fields,clocks_throttle_reasons.active" --format=csv -lms 200 > "$OUT/smi.csv" &
  smi=$!
fi
pids=()
echo "$(wc -l < "$OUT/plan.jsonl") units on $GPUS GPU(s), passes end by $(date -d "@$deadline" +%T)"
while read -r unit; do
  read -r gpu id < <(python3 -c 'import json, sys; u = json.loads(sys.argv[1]); print(u["gpu"], u["id"])' "$unit")
  CUDA_VISIBLE_DEVICES="$gpu" timeout $(( BUDGET_S + 30 )) python3 benchmarks/session.py --unit "$unit" \
    --outdir "$OUT" --tag "$TAG" --deadline "$deadline" --passes "$PASSES" 2> "$OUT/log.$id" &
  pids+=($!)
done < "$OUT/plan.jsonl"
wait "${pids[@]}"
kill "$smi" 2>/dev/null
grep -h '"side_by_side"' "$OUT"/"$TAG"_*.jsonl > "$OUT/side_by_side_$TAG.jsonl" 2>/dev/null \
  || rm -f "$OUT/side_by_side_$TAG.jsonl"
cat "$OUT"/"$TAG"_tuning.*.jsonl > "$OUT/${TAG}_tuning.jsonl" 2>/dev/null && rm -f "$OUT"/"$TAG"_tuning.*.jsonl
python3 benchmarks/session.py --merge "$OUT" --tag "$TAG" > "$OUT/${TAG}_session.txt"
cat "$OUT/${TAG}_session.txt"
