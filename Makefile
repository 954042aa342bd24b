# make demo  -- set up (first time) and run the demos on the CPU (LLVM): one layer, then training on digits
# make test  -- set up (first time) and run the whole test suite
# make bench -- compare eqgrad with NumPy, PyTorch and tinygrad (whichever are installed): core ops, a training step
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: demo test bench clean opencl

# --no-compile: pip would byte-compile every module of every dependency (torch, transformers, ray:
# tens of thousands of files) where Python compiles the ones imported when they are first imported;
# a fresh set-up took 64 s with and 38 s without on a 2-core AMD EPYC VM (pip's cache warm)
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(PY) examples/demo.py
	$(PY) examples/train_digits.py

# PoCL, a CPU OpenCL, so the op tests also run on the OPENCL device, and Graphviz for explain()'s
# SVG pictures. Installed with apt where apt exists and we are root (from the package lists already
# there; `apt-get update` first only when that fails); elsewhere (or if apt fails) the OPENCL and
# SVG tests are skipped, not failed.
OPENCL_PKGS := pocl-opencl-icd ocl-icd-libopencl1 graphviz
opencl:
	@if dpkg -s $(OPENCL_PKGS) >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(OPENCL_PKGS) >/dev/null 2>&1 \
	   || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(OPENCL_PKGS) >/dev/null)) \
	    || echo "make: could not install $(OPENCL_PKGS); the OPENCL tests will be skipped"; \
	else echo "make: no apt-get or not root: PoCL not installed; the OPENCL tests will be skipped"; fi

# The second run: the LLVM device's op, semantics and special-value tests again, compiled for
# EQGRAD_CPU=x86-64-v2 (SSE4.2, 128-bit vectors; every x86-64 CPU since 2009 executes it), so a
# vector width other than the host's is tested on any machine (docs/env.md), and float16/bfloat16
# without F16C/AVX512-BF16 (LLVM calls conversion routines there: llvm.py _libcalls). ~100 CPU-seconds.
LLVM_TESTS := tests/test_ops.py tests/test_semantics.py tests/test_devices.py tests/test_transcendental.py \
              tests/test_sum_accuracy.py tests/test_targets.py tests/test_dtypes.py tests/test_float_dtypes.py
# --dist worksteal: an idle worker takes queued tests from the other, so a long test near the end
# does not leave one core idle (6m42s -> 6m08s on the 2-core machine)
test: $(VENV)/.installed opencl
	$(PY) -m pytest -n 2 --dist worksteal -p no:cacheprovider tests
	@if [ "$$(uname -m)" = x86_64 ]; then set -x; \
	  EQGRAD_CPU=x86-64-v2 $(PY) -m pytest -n 2 --dist worksteal -p no:cacheprovider -k "LLVM or test_targets" $(LLVM_TESTS); \
	else echo "make: not an x86-64 machine: the EQGRAD_CPU=x86-64-v2 run is skipped"; fi

bench: $(VENV)/.installed
	$(PY) bench/bench_core.py
	$(PY) bench/bench_train.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
