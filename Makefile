# Two commands a newcomer needs:  `make demo` (the main job, CPU, no API key)  and  `make test`.
# Every target installs what it needs first; the stamps make a warm machine fast.

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.htam-installed
DEMO_TASK ?= examples/softmax/cpu_naive.py

.PHONY: demo test lint typecheck pytest editors sandbox clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned to the CPU build on disk: a bare `torch` could pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	# The distribution was named `htam` before (an unrelated PyPI package has that name):
	# a checkout installed under it would own the same packages and commands.
	$(PY) -m pip uninstall -q -y htam 2>/dev/null || true
	$(PY) -m pip install -q -e '.[dev,ray,triton]'
	touch $@

demo: $(STAMP) sandbox
	$(VENV)/bin/htam optimize $(DEMO_TASK) --provider offline --device cpu --steps 6

editors: $(STAMP)
	bash editors/vscode/scripts/setup.sh

# The evaluator's sandbox (bubblewrap), as root or with passwordless sudo; without it the
# sandbox's tests skip and say why, and candidates run unsandboxed (a verdict's `sandbox`).
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { s=$$([ "$$(id -u)" = 0 ] || echo sudo -n); \
	  $$s apt-get update -qq && $$s env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; } \
	  || echo "htam: bubblewrap could not be installed: the sandbox's tests will skip"

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP)
	$(PY) -m mypy

pytest: $(STAMP) editors sandbox
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
