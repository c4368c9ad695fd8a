# Two commands matter: `make demo` (main job on the built-in tiny model) and `make test`.
# Each creates .venv on first use from the pinned requirements (CPU torch 2.13.0).
PY      := .venv/bin/python
PIP     := .venv/bin/pip install -q --disable-pip-version-check --no-deps --no-compile --no-cache-dir
STAMP   := .venv/.installed
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export VLLM_ENABLE_V1_MULTIPROCESSING := 0
# matplotlib's font list is cached per user, keyed by version only: a list another install wrote (CI
# boxes carry one that lacks matplotlib's own STIX fonts) makes every log-scale tick warn "findfont"
# into the notebooks. The project keeps its own, built from this venv's matplotlib.
export MPLCONFIGDIR := $(CURDIR)/.venv/matplotlib
unexport PYTHONDONTWRITEBYTECODE

# torch 2.13.0+cpu: from a local wheel folder when pip is configured with one (find-links),
# else from PyTorch's CPU wheel index (a plain `pip install torch` would pull a CUDA build).
TORCH_INDEX := https://download.pytorch.org/whl/cpu
# vLLM's CPU build (requirements-vllm.txt) and SGLang (requirements-sglang.txt, docs/sglang.md) are
# part of the default environment on Linux x86-64.
WITH_VLLM := $(shell [ "$$(uname -s)-$$(uname -m)" = "Linux-x86_64" ] && echo 1)

# Every Python a target starts runs on tcmalloc (Debian libtcmalloc-minimal4, installed by `debs`): glibc
# page-faults each RL step's large tensors in again, 1.3x the smollm2 step (labs/allocator.py,
# docs/measurements/2026-12-03-allocator.md). Computed when the recipe runs, so after `debs` installed it.
PRELOAD = env $$($(PY) -m labs.allocator)
RUN = $(PRELOAD) $(PY)

.PHONY: venv debs demo test test-avx2 test-all lab workshop bench reproduce notebooks clean gpu-check gpu-wheels

venv: $(STAMP)

# Debian packages the tests use: bubblewrap (the tool sandbox's OS boundary, docs/sandbox.md),
# chromium + its driver (the browser test of the report) and tcmalloc (PRELOAD above). Installed
# where apt-get exists and we are root (CI, fresh boxes); elsewhere the sandbox says what is missing,
# the browser test skips and glibc's allocator stays.
DEBS := bubblewrap chromium chromium-driver libtcmalloc-minimal4
debs:
	@if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		missing=$$(for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
		if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends $$missing; fi; \
	else echo "make debs: not root or no apt-get; install $(DEBS) yourself"; fi

# requirements*.txt pin the whole closure, so pip installs them with --no-deps and without
# resolving: torch and two halves of the list go in side by side (pip itself installs one package
# at a time). No .pyc are compiled up front (that was half of the build): imports write the .pyc of
# the modules a run really uses, which is why PYTHONDONTWRITEBYTECODE is unexported at the top.
# Measured in docs/measurements/2026-11-27-make-test.md: about 3 min -> about 1 min.
# The environment is about 3.8 GB; pip's downloads pass through TMPDIR. --no-cache-dir keeps pip from
# writing a second copy of every download into ~/.cache (a CI run once died of ENOSPC doing that), and
# the check below says so up front instead of a pip traceback half-way through.
VENV_GB := 5
$(STAMP): requirements.txt requirements-vllm.txt requirements-sglang.txt pyproject.toml
	@for d in . "$${TMPDIR:-/tmp}"; do \
		free=$$(df -Pk "$$d" | awk 'NR==2 {print int($$4 / 1048576)}'); \
		if [ "$$free" -lt $(VENV_GB) ]; then \
			echo "make venv: $$free GB free on $$(df -P "$$d" | awk 'NR==2 {print $$6}') ($$d); the environment" \
				"needs about $(VENV_GB) GB. Free space (old clones, runs/, ~/.cache) or set TMPDIR, then rerun."; \
			exit 1; \
		fi; \
	done
	python3 -m venv .venv
	{ $(PIP) "torch==2.13.0+cpu" || $(PIP) --index-url $(TORCH_INDEX) "torch==2.13.0+cpu"; } & \
	grep -hv '^#' requirements.txt $(if $(WITH_VLLM),requirements-vllm.txt requirements-sglang.txt) | grep . | \
		xargs -P 2 -n 100 $(PIP); \
	rc=$$?; wait $$! && [ $$rc = 0 ]
	$(PIP) --no-build-isolation -e .
	touch $(STAMP)

demo: debs $(STAMP)
	$(RUN) -m labs.demo

# Two pytest-xdist workers: the suite runs one torch thread per process (tests/conftest.py), so a
# second worker uses the second core. tests/conftest.py's scheduler keeps a file on one worker
# (module-scoped fixtures such as the Ray cluster are built once) except the notebook runs; the
# longest start first, in collection order (no reorder by size). docs/measurements/2026-11-26-make-test.md.
XDIST := -n 2 --no-loadscope-reorder

test: debs $(STAMP)
	$(RUN) -m pytest -m "not slow" -q $(XDIST) --durations=15
	$(MAKE) --no-print-directory test-avx2

# The numerically sensitive tests again with torch, oneDNN, numba and OpenBLAS capped to AVX2
# (labs/machine.py): a change made on an AMX or AVX-512 box fails there if it would fail on an
# AVX2-only laptop. labs.machine --require avx2 first checks, from each library's own report,
# that the cap took effect. docs/machine.md.
CAP = env $$($(PY) -m labs.machine --cap-env avx2)
ISA_TESTS := tests/test_machine.py tests/aligntools/analyzer/test_compiled_metrics.py \
	tests/aligntools/analyzer/test_pinned_metrics.py tests/aligntools/analyzer/test_metrics.py \
	tests/minirl/engine/test_prepack.py tests/minirl/engine/test_bf16_emulation.py \
	tests/minirl/training/test_trainer_bf16_emulation.py tests/minirl/training/test_micro_batch.py \
	tests/minirl/algorithms/test_router_replay.py
test-avx2: $(STAMP)
	$(CAP) $(RUN) -m labs.machine --require avx2
	$(CAP) $(RUN) -m pytest -m "not slow" -q $(XDIST) $(ISA_TESTS)

test-all: $(STAMP)
	$(RUN) -m pytest -q $(XDIST)

# Ratios against baselines measured in the same run (numbers in README.md / docs/*.md).
bench: $(STAMP)
	$(RUN) -m pytest benchmarks -q --benchmark-enable
	$(RUN) benchmarks/bench_kernels.py
	$(RUN) benchmarks/bench_engine.py
	$(RUN) benchmarks/bench_prepack.py
	$(RUN) benchmarks/bench_tracker.py --hidden 1024
	$(RUN) benchmarks/bench_row_hash.py
	$(RUN) benchmarks/bench_run_log.py
	$(RUN) benchmarks/bench_compare.py
	$(RUN) benchmarks/bench_gemm_dtypes.py
	$(PIP) -c requirements.txt -r requirements-bench.txt
	$(RUN) benchmarks/bench_trl.py

# Every paper finding at full size: runs/reproduce/<name>/ + one table (paper vs ours). --small: minutes.
reproduce: $(STAMP)
	$(RUN) -m labs.reproduce

# Executed HTML copies of every notebook at the size JupyterLab runs (SMALL=1: the tests' size), per-cell timeout.
SMALL ?= 0
notebooks: $(STAMP)
	mkdir -p runs/notebooks
	MLAB_NOTEBOOK_SMALL=$(SMALL) $(PRELOAD) .venv/bin/jupyter nbconvert --to html --execute \
		--ExecutePreprocessor.timeout=600 --output-dir runs/notebooks notebooks/*.ipynb

# A host's step before `make lab`: builds every zoo checkpoint and SFT warm-up the notebooks use (labs/workshop.py),
# one bar with its time, then "The room is ready". Without it notebook 02 first trains tiny-qwen3-moe and 04 its SFT
# while the attendee waits (README's cold vs warm times).
workshop: $(STAMP)
	$(RUN) -m labs.workshop

# --allow-root: JupyterLab refuses to start as root without it (containers, CI boxes).
lab: $(STAMP)
	$(PRELOAD) .venv/bin/jupyter lab --allow-root notebooks/

clean:
	rm -rf .venv runs .zoo .pytest_cache .benchmarks

# The GPU check (docs/gpu.md): on a lent CUDA card with the card's own python3 (no .venv there);
# DRY=1 runs the same stages on CPU at tiny shapes. OUT names the report folder.
OUT ?= runs/gpu-check
GPU_WHEELS := .gpu-wheels
gpu-check: $(if $(DRY),$(STAMP))
	$(if $(DRY),$(PY) -m benchmarks.gpu_check --dry-run,python3 -m benchmarks.gpu_check --wheels $(GPU_WHEELS)) --out $(OUT)

# The few wheels the GPU check needs that a lent card lacks (it has no network), downloaded here.
gpu-wheels: $(STAMP)
	$(PY) -m benchmarks.gpu_check.wheels $(GPU_WHEELS)
