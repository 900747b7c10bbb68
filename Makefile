# kimi-mlp: two commands do all set-up on a fresh machine.
#   make book   builds the book into _build/html
#   make test   runs the unit tests, the export check and nbval over every notebook
#   make test-fast  the unit tests without those marked slow (GPU compiles, notebooks, wheel
#               builds, end-to-end processes: tests/conftest.py lists them), for use while working
# Both create (or reuse) the virtual environment .venv and install requirements.txt into it.

PYTHON ?= python3
VENV   ?= .venv
# PyTorch's CPU builds. On Linux, PyPI's torch is a CUDA build of several GB; nothing here
# needs a GPU, so torch comes from this index first, where the machine can reach it.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TRITON36 := $(VENV)/triton36
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 600

.PHONY: all venv test test-fast unit nbval nbval-other-cpu book export execute bench clean

all: test

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if $(PY) -c "import socket, sys, urllib.parse as u; \
	    socket.getaddrinfo(u.urlsplit(sys.argv[1]).hostname, 443)" $(TORCH_INDEX) 2>/dev/null; \
	then $(PY) -m pip install -q --index-url $(TORCH_INDEX) $$(grep -o '^torch==[^ ]*' requirements.txt) \
	  || echo "torch from $(TORCH_INDEX) failed: it comes with requirements.txt"; \
	else echo "$(TORCH_INDEX) is out of reach: torch comes with requirements.txt"; fi
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	# triton 3.6 beside the venv's own, for appendix F's check that the Gluon kernels
	# compile the same under it (tests/test_gluon.py, in a child process of its own)
	$(PY) -m pip install -q --no-deps --upgrade --target $(TRITON36) triton==3.6.0
	touch $(STAMP)

venv: $(STAMP)

## Tests: unit tests (with the export-sync check), then every notebook through nbval.
test: unit nbval

# One worker per core (-n auto), each with one thread (OMP_NUM_THREADS=1, which the
# processes the tests start inherit), and --dist worksteal: a worker that runs out of tests
# takes half of the other's queue, so one long test late in a queue does not leave a core idle.
UNIT := OMP_NUM_THREADS=1 KIMI_TRITON36=$(TRITON36) $(PY) -m pytest -q -n auto --dist worksteal
unit: $(STAMP)
	$(UNIT) tests

## While working: the unit tests less the slow ones (`make test` still runs everything).
test-fast: $(STAMP)
	$(UNIT) -m "not slow" tests

nbval: $(STAMP)
	$(PY) -m pytest -q -n auto --dist loadscope $(NBVAL) book

## nbval once more on "another CPU": PyTorch's own kernels without AVX (its scalar paths),
## oneDNN and MKL held to SSE4, OpenBLAS's and NumPy's SIMD paths held to SSE3/x86-64-v2, one
## thread each. Stored outputs must not depend on the instruction set, the BLAS or the threads.
## Appendices D and F only compile kernels for GPUs and model their time in Python floats,
## and appendix G prints a registry of constants: nothing in them is computed by the CPU's
## arithmetic libraries, so they run once (above).
COMPILE_ONLY := book/appendix_d_codegen.ipynb book/appendix_f_gluon.ipynb book/appendix_g_gpus.ipynb
OTHER_CPU := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2 \
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Prescott \
	NPY_DISABLE_CPU_FEATURES="X86_V3 X86_V4"
nbval-other-cpu: $(STAMP)
	$(OTHER_CPU) $(PY) -m pytest -q -n auto --dist loadscope $(NBVAL) \
		$(filter-out $(COMPILE_ONLY),$(wildcard book/*.ipynb))

## The book, from the outputs stored in the notebooks; warnings are errors.
book: $(STAMP)
	$(VENV)/bin/jupyter-book build . --builder html -W -n --keep-going
	@echo "open _build/html/index.html"

## Notebooks -> kimi_mlp/*.py (nbdev's nb_export).
export: $(STAMP)
	$(PY) tools/export.py

## Re-execute every notebook in place on this machine's CPU (what CI's nbval reproduces).
execute: $(STAMP)
	$(PY) tools/execute.py $(NB)

## GPU benchmarks (chapter 11): writes book/data/bench_<gpu>_<date>.json on a CUDA machine.
bench: $(STAMP)
	$(PY) -m kimi_mlp bench

clean:
	rm -rf _build
