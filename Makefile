# make demo  -- set up (first time) and run the demo on the CPU (LLVM)
# make test  -- set up (first time) and run the whole test suite
# make bench -- compare eqgrad with NumPy, PyTorch and tinygrad (whichever are installed)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(PY) examples/demo.py

test: $(VENV)/.installed
	$(PY) -m pytest -n 2 -p no:cacheprovider tests

bench: $(VENV)/.installed
	$(PY) bench/bench_core.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
