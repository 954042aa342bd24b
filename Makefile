# make demo  -- set up (first time) and run the demos on the CPU (LLVM): one layer, then training on digits
# make test  -- set up (first time) and run the whole test suite
# make bench -- compare eqgrad with NumPy, PyTorch and tinygrad (whichever are installed): core ops, a training step
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: demo test bench clean opencl pyc

# --no-compile: pip would byte-compile every module of every dependency (torch, transformers, ray:
# tens of thousands of files); a fresh set-up took 64 s with and 38 s without on a 2-core AMD EPYC
# VM (pip's cache warm). The packages the suite imports are compiled by `pyc` below instead.
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
# Byte-code for eqgrad and the packages every test process imports, written once per change: where
# PYTHONDONTWRITEBYTECODE is set (as on these machines) Python writes no .pyc of what it compiles,
# so each process of the suite (2 workers, their saturation and compile workers, the tests' own
# subprocesses) compiled every module it imported again: `import eqgrad` 0.82-1.01 s against 0.26,
# with torch 3.5-3.8 s against 1.6. compileall writes them whatever that says (8 s for all of these
# on a fresh set-up, ~1 s when they are current; torch's Python-3.12-only test helpers are left out);
# the suite's main run 517 -> 467 s (one clean-clone run each, 2-vCPU AMD EPYC).
PYC_PKGS := numpy scipy torch llvmlite egglog pyopencl hypothesis _pytest pytest xdist pluggy execnet safetensors
pyc: $(VENV)/.installed
	@$(PY) -m compileall -q -j 0 -x 'py31[2-9]_' eqgrad bench examples $$($(PY) -c "import os, sysconfig; p = sysconfig.get_paths()['purelib']; \
	  print(' '.join(os.path.join(p, n) for n in '$(PYC_PKGS)'.split() if os.path.isdir(os.path.join(p, n))))") >/dev/null || \
	  echo "make: byte-compiling some modules failed; the suite runs, compiling them in each process"

test: $(VENV)/.installed opencl pyc
	$(PY) -m pytest -n 2 --dist worksteal -p no:cacheprovider tests
	@if [ "$$(uname -m)" = x86_64 ]; then set -x; \
	  EQGRAD_CPU=x86-64-v2 $(PY) -m pytest -n 2 --dist worksteal -p no:cacheprovider -k "LLVM or test_targets" $(LLVM_TESTS); \
	else echo "make: not an x86-64 machine: the EQGRAD_CPU=x86-64-v2 run is skipped"; fi

bench: $(VENV)/.installed
	$(PY) bench/bench_core.py
	$(PY) bench/bench_train.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
