# Two commands matter: `make demo` (main job on the built-in tiny model) and `make test`.
# Each creates .venv on first use from the pinned requirements.txt (CPU torch 2.13.0).
PY      := .venv/bin/python
STAMP   := .venv/.installed
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: venv demo test test-all lab bench clean

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
	.venv/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m labs.demo

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q

test-all: $(STAMP)
	$(PY) -m pytest -q

# Ratios against baselines measured in the same run (numbers in README.md / docs/*.md).
bench: $(STAMP)
	$(PY) -m pytest benchmarks -q --benchmark-enable
	$(PY) benchmarks/bench_kernels.py
	$(PY) benchmarks/bench_engine.py
	$(PY) benchmarks/bench_tracker.py --hidden 1024
	$(PY) benchmarks/bench_compare.py

lab: $(STAMP)
	.venv/bin/jupyter lab notebooks/

clean:
	rm -rf .venv runs .zoo .pytest_cache .benchmarks
