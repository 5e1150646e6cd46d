# The two Quick-start entry points (see README.md):
#   make bench   install everything, run the allreduce bandwidth sweep against gloo and OpenMPI
#   make test    install everything, run the style checks and the whole test suite
PYTHON ?= python3
PIP = $(PYTHON) -m pip
# torch is pinned: a looser requirement pulls the newest CUDA build from PyPI.
TORCH ?= torch==2.13.0

.PHONY: install install-peers lint test bench

install:
	$(PIP) install -q $(TORCH) numpy pytest ruff clang-format matplotlib scikit-learn \
		scikit-build-core pybind11 cmake ninja
	$(PIP) install -q --no-build-isolation --no-deps .

# OpenMPI for the side-by-side benchmark (Debian packages, needs root).
install-peers:
	command -v mpirun >/dev/null || (apt-get update -q && apt-get install -y -q openmpi-bin libopenmpi-dev)
	$(PIP) install -q mpi4py

lint:
	clang-format --dry-run -Werror $$(git ls-files '*.cc' '*.h' '*.cu')
	$(PYTHON) -m ruff check python tests bench tools examples
	$(PYTHON) -m ruff format --check python tests bench tools examples

test: install lint
	$(PYTHON) -m pytest -q -ra

bench: install install-peers
	$(PYTHON) bench/allreduce_vs_peers.py
