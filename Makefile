# KernelFleet. `make run` starts the coordinator, its dashboard and a local worker on SQLite (installing
# only what they need); `make test` runs ruff, mypy and pytest (installing the dev tools). Both build
# their own virtualenv (.venv) first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
HOST   ?= 127.0.0.1
PORT   ?= 8600
# the address other machines reach `make run` at (KERNELFLEET_PUBLIC_URL): needed with HOST=0.0.0.0
PUBLIC_URL ?=
PYTEST_ARGS ?=
# pytest processes (pytest-xdist; 0 = one process). Each test file runs whole in one of them; most tests
# wait on a coordinator subprocess, so 4 suit a 2-core host (README: Two commands).
PYTEST_WORKERS ?= 4

.DEFAULT_GOAL := help
.PHONY: help venv run demo test test-full lint typecheck pytest bench-kernels bench-search bench-gpu bench-launch-floor bench-predict bench-cross-chip bench-dashboard bench-load bench-request-cost bench-store-cost bench-detector bench-profiles bench-profile-build bench-calibration clean test-metal-model test-metal

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-18s %s\n", $$1, $$2}'

# the dev install (make venv, make test) and the run install (make run, make demo: KernelFleet and what
# it needs, without the dev toolchain); a venv that has the dev install serves both
RUN_STAMP := $(VENV)/.run-stamp
SERVICE := $(if $(wildcard $(STAMP)),$(STAMP),$(RUN_STAMP))
NEEDS_PYTHON := $(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "KernelFleet needs Python 3.11 or newer (macOS'"'"'s /usr/bin/python3 is 3.9): install one (brew install python@3.12, or python.org), then pass it: make ... PYTHON=python3.12")'
ON_PATH := kernelfleet is at $(abspath $(BIN))/kernelfleet: to type plain `kernelfleet` in another shell, run `source $(abspath $(BIN))/activate` (or export PATH="$(abspath $(BIN)):$$PATH")

$(STAMP): pyproject.toml
	$(NEEDS_PYTHON)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

$(RUN_STAMP): pyproject.toml
	$(NEEDS_PYTHON)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(RUN_STAMP)

venv: $(STAMP) ## Create .venv and install KernelFleet (editable) with its dev tools

run: $(SERVICE) ## Coordinator + dashboard + one local worker on SQLite (http://127.0.0.1:8600; on the LAN: HOST=0.0.0.0 PUBLIC_URL=http://ADDRESS:8600); installs no dev tools
	@echo '$(ON_PATH)'
	$(BIN)/kernelfleet db upgrade
	$(BIN)/kernelfleet serve --host $(HOST) --port $(PORT) $(if $(PUBLIC_URL),--public-url $(PUBLIC_URL)) --local-worker

DEMO_REPORTS ?= $(wildcard benchmarks/results/*_tuning.jsonl)
demo: $(SERVICE) ## The shipped GPU reports (H100, H200) beside this machine's CPU, on a database of its own (http://127.0.0.1:8600)
	@echo '$(ON_PATH)'
	$(BIN)/kernelfleet demo $(DEMO_REPORTS) --host $(HOST) --port $(PORT)

test: lint ## Everything CI checks: ruff, then mypy beside pytest (mypy's CPU fits in what pytest leaves idle)
	@$(MAKE) --no-print-directory -j2 -o $(STAMP) typecheck pytest

lint: $(STAMP) ## ruff
	$(BIN)/ruff check .

typecheck: $(STAMP) ## mypy over service/, worker/, kernels/, web/ and kernelfleet/
	$(BIN)/mypy service worker kernels web kernelfleet

pytest: $(STAMP) ## pytest in PYTEST_WORKERS processes (SQLite; PostgreSQL too when KERNELFLEET_TEST_POSTGRES_URL is set)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-full: ## make test with every big sweep whole (make test samples them, rotating daily: tests/sampling.py); hours
	KERNELFLEET_TEST_FULL=1 $(MAKE) test

test-metal-model: $(STAMP) ## Metal without a Mac (needs clang++): strict MSL compile model + CPU emulator of Metal
	$(BIN)/pytest -q -s tests/kernels/test_metal_render.py tests/kernels/test_msl_rules.py tests/kernels/test_metal_emu.py tests/worker/test_pipeline_limit.py
	$(BIN)/pytest -q tests/kernels/test_catalog.py -k metal-emu

METAL_BACKEND ?= metal
test-metal: $(STAMP) ## On an Apple-silicon Mac (QUICK=1: 2-min smoke; METAL_BACKEND=metal-emu: dry run on the emulator): report to paste back
	$(BIN)/python -m kernelfleet.worker.mac_report --out metal-report.md --backend $(METAL_BACKEND) $(if $(QUICK),--quick)

bench-kernels: $(STAMP) ## Kernel speed: tuned vs MLX built-in vs copy bandwidth, on this machine's GPU
	$(BIN)/python benchmarks/kernels.py

QUANT_KERNEL ?= quantized_matmul
bench-quantized: $(STAMP) ## Quantized matmul (QUANT_KERNEL=gather_quantized_matmul: MoE experts): ours vs MLX's op, dequantize+GEMM, dense GEMM, torch, copy (GPU)
	$(BIN)/python benchmarks/quantized.py --kernel $(QUANT_KERNEL)

bench-search: $(STAMP) ## Successive halving vs exhaustive search: quality and time
	$(BIN)/python benchmarks/search.py

bench-gpu: $(STAMP) ## Kernel table, search, repeatability, tuning data on every GPU of this host (CUDA)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash benchmarks/multi_gpu.sh

bench-launch-floor: $(STAMP) ## Round length and mx.compile vs per-launch medians, side by side (GPU)
	$(BIN)/python benchmarks/launch_floor.py

bench-predict: $(STAMP) ## Held-out config predictions on the committed GPU reports (+ their side-by-side runs)
	$(BIN)/python benchmarks/predict.py

CROSS_CHIP ?= h200_transfer_run
CROSS_CHIP_FILE = benchmarks/results/$(CROSS_CHIP)
CROSS_CHIP_RUNS ?= $(wildcard $(CROSS_CHIP_FILE).jsonl $(CROSS_CHIP_FILE)[0-9].jsonl $(CROSS_CHIP_FILE)_all.jsonl)
bench-cross-chip: $(STAMP) ## Cross-chip profile vs tuned on that GPU (CROSS_CHIP=h200_transfer_run: H200 from H100 reports; h100_transfer: the reverse); PLAN=1 re-plans
	$(if $(PLAN),$(BIN)/python benchmarks/cross_chip.py plan --target $(firstword $(subst _, ,$(CROSS_CHIP))) \
	  --out $(CROSS_CHIP_FILE)_jobs.jsonl)
	$(BIN)/python benchmarks/cross_chip.py score --jobs $(CROSS_CHIP_FILE)_jobs.jsonl $(CROSS_CHIP_RUNS) \
	  --out $(CROSS_CHIP_FILE).txt $(if $(wildcard $(CROSS_CHIP_FILE)_note.txt),--note "$$(cat $(CROSS_CHIP_FILE)_note.txt)")

bench-dashboard: $(STAMP) ## Dashboard page server times over 1,000,000 stored trials
	$(BIN)/python benchmarks/dashboard.py

LOAD_ARGS ?= --workers 1000 --duration 120 --think 30 60
bench-load: $(STAMP) ## Coordinator under N simulated workers (API only) + database audit; LOAD_ARGS, KERNELFLEET_TEST_POSTGRES_URL
	$(BIN)/python benchmarks/coordinator_load.py $(if $(KERNELFLEET_TEST_POSTGRES_URL),--postgres $(KERNELFLEET_TEST_POSTGRES_URL)) $(LOAD_ARGS)

bench-request-cost: $(STAMP) ## Coordinator CPU per heartbeat, idle lease poll, lease and 40 KB result (one serve process); KERNELFLEET_TEST_POSTGRES_URL
	$(BIN)/python benchmarks/request_cost.py $(if $(KERNELFLEET_TEST_POSTGRES_URL),--postgres $(KERNELFLEET_TEST_POSTGRES_URL))

bench-store-cost: $(STAMP) ## CPU of storing one 40 KB report (store_report alone, no HTTP) and its profile; KERNELFLEET_TEST_POSTGRES_URL
	$(BIN)/python benchmarks/store_report_cost.py $(if $(KERNELFLEET_TEST_POSTGRES_URL),--postgres $(KERNELFLEET_TEST_POSTGRES_URL))

bench-profiles: $(STAMP) ## Profile build and result insert at 1k, 10k, 100k stored results (PostgreSQL)
	$(BIN)/python benchmarks/profiles.py

bench-profile-build: $(STAMP) ## One profile build after one new result vs a full build, at 10^4..10^6 stats rows (SQLite + PostgreSQL); BUILD_ARGS
	$(BIN)/python benchmarks/profile_build_cost.py $(if $(KERNELFLEET_TEST_POSTGRES_URL),--postgres $(KERNELFLEET_TEST_POSTGRES_URL)) $(BUILD_ARGS)

bench-calibration: $(STAMP) ## Prediction confidence vs the observed within-5 % rate, held out, on the GPU reports
	$(BIN)/python benchmarks/calibration.py

.PHONY: bench-model
MODEL_PROFILE ?= benchmarks/results/model_profile.json
bench-model: $(STAMP) ## Llama-3-8B / Qwen3-30B-A3B shapes, bf16 + 4-bit: tokens/s stock vs kernelfleet.patch, with a stock-vs-stock control (GPU; TUNE=1 tunes MODEL_PROFILE first)
	$(if $(TUNE),$(BIN)/python benchmarks/model.py tune --out $(MODEL_PROFILE))
	$(BIN)/python benchmarks/model.py run --profile $(MODEL_PROFILE) --control

BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed-stamp: pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q -e '.[bench]'
	touch $@

bench-detector: $(BENCH_VENV)/.installed-stamp ## Regression detector vs apache-otava (own venv: otava pins numpy)
	$(BENCH_VENV)/bin/python benchmarks/detector.py

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
