#!/usr/bin/env bash
# The frontier benchmarks on one GPU (issue 16). Run from the repository root after
# `source .mlxcuda/b/setup.sh`; results go to $OUT (default benchmarks/results/new).
#   STEP=table KERNELS=a,b   benchmarks/kernels.py --peers over those kernels' large shapes: ours (model
#                            strategy, compile included in tune s), MLX built-in, torch eager, torch.compile
#                            -> table.txt, rows.jsonl, tuning.jsonl, log.txt
#   STEP=inductor            Inductor's generated code for the rows torch.compile won on the H200
#                            (TORCH_LOGS=output_code) -> inductor_code.txt
#   STEP=ncu PROFILE="name:shape:config ..."   Nsight Compute's speed-of-light, memory and occupancy
#                            readings of our kernel and Inductor's for each -> ncu.txt
#   STEP=catalog             tests/kernels/test_catalog.py -m cuda, 4 processes (each compiles its
#                            shapes' spaces ahead in a pool of NVRTC processes) -> catalog_cuda.txt
#   STEP=search KERNELS=...  the model strategy vs exhaustive search, candidates precompiled in parallel
#                            processes (benchmarks/multi_gpu.sh with PASSES=4 PRIMARY_ONLY=1)
#   STEP=tune [ROWS=k:s,...] tuning time per large shape, candidates compiled at first launch vs ahead
#                            (benchmarks/tune_time.py run) -> tune_time.txt, tune_time.jsonl, log.txt
# TABLE_S (default 400) bounds the table step.
set -u
OUT="${OUT:-benchmarks/results/new}"; mkdir -p "$OUT"
mkdir -p /tmp/kf/kernelfleet && cp -r kernels worker kernelfleet/__init__.py /tmp/kf/kernelfleet/
export PYTHONPATH="/tmp/kf${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MLX_ENABLE_CACHE_THRASHING_CHECK=0
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader >> "$OUT/gpu.txt"
case "${STEP:-table}" in
  inductor)
    TORCH_LOGS=output_code timeout 200 python3 benchmarks/peers.py --inductor swiglu:16384x8192 \
      layernorm:16384x8192 geglu:16384x8192 moe_combine:16384x2x4096 add_rmsnorm:16384x8192 \
      > "$OUT/inductor_code.txt" 2>&1 ;;
  table)
    TABLE_S="${TABLE_S:-400}"
    timeout "$TABLE_S" python3 benchmarks/kernels.py --peers --kinds large ${KERNELS:+--kernels "$KERNELS"} \
      --out "$OUT/table.txt" --rows-jsonl "$OUT/rows.jsonl" --jsonl "$OUT/tuning.jsonl" \
      --time-limit $(( TABLE_S - 45 )) 2>> "$OUT/log.txt"
    tail -4 "$OUT/log.txt" ;;
  ncu)
    for item in ${PROFILE:-}; do
      timeout 120 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section LaunchStats --kernel-name regex:'custom_kernel|triton' --launch-count 4 \
        python3 benchmarks/peers.py --profile "$item" >> "$OUT/ncu.txt" 2>&1
    done ;;
  tune)
    timeout "${TUNE_S:-560}" python3 -P benchmarks/tune_time.py run ${ROWS:+--rows "$ROWS"} \
      --out "$OUT/tune_time.txt" --time-limit $(( ${TUNE_S:-560} - 120 )) 2>> "$OUT/log.txt"
    cat "$OUT/tune_time.txt" ;;
  catalog)  # the CUDA catalog test: every config of every kernel's space at its test shapes
    # -P: the checkout's own kernelfleet/ (no kernels/ under it) must not shadow /tmp/kf's
    timeout "${CATALOG_S:-480}" python3 -P -m pytest --noconftest -p no:cacheprovider -q -m cuda -n 4 -rA \
      -o timeout=470 tests/kernels/test_catalog.py > "$OUT/catalog_cuda.txt" 2>&1
    tail -5 "$OUT/catalog_cuda.txt" ;;
  search)  # many files: they come back as one archive beside the merged report
    OUT=/tmp/kf_search PASSES=4 PRIMARY_ONLY=1 BUDGET_S="${BUDGET_S:-480}" bash benchmarks/multi_gpu.sh
    cp /tmp/kf_search/*_session.txt "$OUT/" 2>/dev/null
    tar -czf "$OUT/search.tgz" -C /tmp kf_search ;;
esac
