# The two Quick-start entry points (see README.md):
#   make bench   install everything, run weft-bench (six collectives, 2 local ranks) against
#                gloo and OpenMPI
#   make test    install everything, run the style checks and the whole test suite
PYTHON ?= python3
PIP = $(PYTHON) -m pip
# torch is pinned: a looser requirement pulls the newest CUDA build from PyPI.
TORCH ?= torch==2.13.0

# The committed sweep (bench/results/ws2.*, ws4.*): run it on a quiet machine.
RESULTS = bench/results
BENCH_SWEEP = -o all -b 8 -e 64M -n 20 -w 5 --repeats 3 --vs gloo,mpi

.PHONY: install install-peers lint test bench bench-results

install:
	$(PIP) install -q $(TORCH) numpy pytest ruff clang-format matplotlib tqdm \
		scikit-build-core pybind11 cmake ninja
	$(PIP) install -q --no-build-isolation --no-deps .

# OpenMPI for the side-by-side benchmark (Debian packages, needs root).
install-peers:
	command -v mpirun >/dev/null || (apt-get update -q && apt-get install -y -q openmpi-bin libopenmpi-dev)
	$(PIP) install -q mpi4py

lint:
	clang-format --dry-run -Werror $$(git ls-files '*.cc' '*.h' '*.cu')
	$(PYTHON) -m ruff check python tests bench tools
	$(PYTHON) -m ruff format --check python tests bench tools

test: install lint
	$(PYTHON) -m pytest -q -ra

bench: install install-peers
	$(PYTHON) -m weft.bench -o all --vs gloo,mpi

bench-results: install install-peers
	for np in 2 4; do \
		$(PYTHON) -m weft.bench $(BENCH_SWEEP) --np $$np --json $(RESULTS)/ws$$np.json \
			--plot $(RESULTS)/ws$$np.png > $(RESULTS)/ws$$np.txt || exit 1; \
	done
