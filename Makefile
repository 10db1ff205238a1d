# gpuq: one entry point for set-up, demo, tests and checks.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# A CPU build of PyTorch, pinned so no multi-GB CUDA build is pulled in.
TORCH := torch==2.13.0

.PHONY: demo test check fmt lint types imports man man-check bench clean snapshots screenshots

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,runner,integrations]" "$(TORCH)"
	touch $(STAMP)

demo: $(STAMP)  ## Run the demo: real jobs on fake GPUs (or real ones), packed and queued.
	PYTHON=$(PY) ./scripts/demo.sh

test: $(STAMP)  ## Run the whole test suite.
	$(PY) -m pytest

fmt: $(STAMP)
	$(PY) -m ruff format gpuq tests bench examples

lint: $(STAMP)
	$(PY) -m ruff format --check gpuq tests bench examples
	$(PY) -m ruff check gpuq tests bench examples

types: $(STAMP)
	$(PY) -m mypy

imports: $(STAMP)
	$(VENV)/bin/lint-imports

snapshots: $(STAMP)  ## Accept new `gpuq top` snapshots (review the failing diff first).
	$(PY) -m pytest tests/test_tui_snapshots.py --snapshot-update

screenshots: $(STAMP)  ## Redraw the `gpuq top` screenshots in docs/screenshots/.
	$(PY) scripts/screenshots.py

man: $(STAMP)  ## Regenerate man/ from the command tree.
	$(PY) -m gpuq.cli.manpages --out man

man-check: $(STAMP)
	$(PY) -m gpuq.cli.manpages --check --out man

check: lint types imports man-check test  ## Format, lint, types, import contracts, man pages, tests.

bench: $(STAMP)  ## Benchmarks (figures go to bench/RESULTS.md by hand, with the command).
	$(PY) bench/bench_policy.py
	$(PY) -m bench.bench_submit
	$(PY) -m bench.bench_daemon
	$(PY) -m bench.bench_turnover
	$(PY) -m bench.bench_remote_start  # root only (network namespaces); skips otherwise
	$(PY) -m bench.bench_migrate

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
