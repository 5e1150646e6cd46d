# The two Quick-start entry points (see README.md):
#   make bench   install everything, run weft-bench (six collectives, 2 local ranks) against
#                gloo and OpenMPI
#   make test    install everything (OpenMPI where it can: its tests skip without it), run
#                the style checks and the whole test suite
PYTHON ?= python3
PIP = $(PYTHON) -m pip
# torch is pinned: a looser requirement pulls the newest CUDA build from PyPI.
TORCH ?= torch==2.13.0

# The committed sweep (bench/results/ws2.*, ws4.*): run it on a quiet machine.
RESULTS = bench/results
BENCH_SWEEP = -o all -b 8 -e 64M -n 20 -w 5 --repeats 5 --vs gloo,mpi

# The algorithm sweeps (bench/results/algos_tcp_np*.*, hier_2x2_1gbit.*, hosts_8x1_1gbit.*,
# double_tree_8x1_1gbit.*: the double tree on one, two and four channels):
# the allreduce families ring, tree, rd, rhd and auto over tcp with 4 and 8 ranks against gloo
# and OpenMPI (over its shared memory, and held to tcp like weft), and across namespace "hosts"
# whose links tc limits to 1 Gbit/s (2 hosts of 2 ranks, 8 of 1; needs root).
ALGO_SWEEP = -o all_reduce --transport tcp --algo ring,tree,rd,rhd,auto -b 16 -e 256M -f 8 \
	-n 12 --iter-bytes 64M -w 3 --rounds 4 --repeats 2 --vs gloo,mpi,mpi-tcp
# The small messages, every power of two from 8 B to 4 KiB.
SMALL_SWEEP = -o all_reduce --transport tcp --algo ring,tree,rd,auto -b 8 -e 4K -f 2 -n 20 \
	--iter-bytes 64M -w 3 --rounds 4 --repeats 3 --vs mpi-tcp

.PHONY: install install-peers install-fuzz fuzz lint test test-gpu bench bench-results bench-algorithms \
	bench-gpu bench-msccl

# nvidia-nccl-cu13: NCCL for CUDA builds; nvidia-cuda-cuobjdump: tests/test_cuda_build.py checks
# the CUDA architectures built with it (the toolkit here has no cuobjdump).
install:
	$(PIP) install -q $(TORCH) numpy pytest ruff clang-format matplotlib tqdm scikit-learn \
		scikit-build-core pybind11 cmake ninja nvidia-nccl-cu13 nvidia-cuda-cuobjdump
	$(PIP) install -q --no-build-isolation --no-deps .

# OpenMPI for the side-by-side benchmark and its tests, libfabric (its headers build weft's ofi
# transport, its tcp provider tests it) and libibverbs' headers (Debian packages: root, where
# each is missing; without them their tests skip and say why).
install-peers:
	command -v mpirun >/dev/null || (apt-get update -q && apt-get install -y -q openmpi-bin libopenmpi-dev)
	(command -v fi_info >/dev/null && test -f /usr/include/rdma/fabric.h && \
		test -f /usr/include/infiniband/verbs.h) || \
		(apt-get update -q && apt-get install -y -q libfabric-dev libfabric-bin libibverbs-dev)
	$(PIP) install -q mpi4py

# The fuzzers of tests/test_fuzz.py and tests/fuzz/run.py: Debian's clang with its libFuzzer
# runtime (root, where clang++ is missing) and atheris from PyPI.
install-fuzz:
	command -v clang++ >/dev/null || command -v clang++-14 >/dev/null || \
		(apt-get update -q && apt-get install -y -q clang-14 libclang-rt-14-dev)
	$(PIP) install -q atheris

# The longer fuzz run whose result is committed (docs/security.md).
fuzz: install install-fuzz
	$(PYTHON) tests/fuzz/run.py --seconds 120 --json bench/results/fuzz/fuzz.json

lint:
	clang-format --dry-run -Werror $$(git ls-files '*.cc' '*.h' '*.cu')
	$(PYTHON) -m ruff check python tests bench tools examples
	$(PYTHON) -m ruff format --check python tests bench tools examples

# The peers first (libfabric's headers must be there when weft is built), then weft and the
# style tools, the style checks, the fuzzers.
test:
	$(MAKE) install-peers PYTHON=$(PYTHON) || echo "make test: no OpenMPI or libfabric; their tests will skip"
	$(MAKE) install PYTHON=$(PYTHON)
	$(MAKE) lint PYTHON=$(PYTHON)
	$(MAKE) install-fuzz PYTHON=$(PYTHON) || echo "make test: no fuzzers; their tests will skip"
	$(PYTHON) -m pytest -q -ra --durations=25

# On a machine with a GPU, after weft is built there (no install step: it keeps that
# machine's torch): the GPU tests (tests/test_gpu_*.py; the nccl ones with 2 to 4 ranks need
# as many GPUs), and into bench/results/ the kernel bandwidth and the allreduce over cuda_ipc
# (2 and 4 ranks on one GPU) against NCCL at world size 1 (weft's nccl transport and torch's).
test-gpu:
	$(PYTHON) -m pytest -q -ra -m gpu

bench-gpu:
	$(PYTHON) bench/gpu_reduce.py
	$(PYTHON) bench/gpu_allreduce.py

bench: install install-peers
	$(PYTHON) -m weft.bench -o all --vs gloo,mpi

bench-results: install install-peers
	for np in 2 4; do \
		$(PYTHON) -m weft.bench $(BENCH_SWEEP) --np $$np --json $(RESULTS)/ws$$np.json \
			--plot $(RESULTS)/ws$$np.png > $(RESULTS)/ws$$np.txt || exit 1; \
	done

bench-algorithms: install install-peers
	for np in 4 8; do \
		$(PYTHON) -m weft.bench $(ALGO_SWEEP) --np $$np --json $(RESULTS)/algos_tcp_np$$np.json \
			--plot $(RESULTS)/algos_tcp_np$$np.png > $(RESULTS)/algos_tcp_np$$np.txt || exit 1; \
		$(PYTHON) -m weft.bench $(SMALL_SWEEP) --np $$np \
			--json $(RESULTS)/algos_tcp_np$${np}_small.json \
			--plot $(RESULTS)/algos_tcp_np$${np}_small.png \
			> $(RESULTS)/algos_tcp_np$${np}_small.txt || exit 1; \
	done
	$(PYTHON) bench/hier_netns.py --hosts 2 --per-host 2 --rate 1000 -b 16 -e 256M \
		--algos ring,tree,rd,rhd,hier,auto -n 3 --iter-bytes 64M --rounds 3 --repeats 3 --vs gloo,mpi \
		--json $(RESULTS)/hier_2x2_1gbit.json --plot $(RESULTS)/hier_2x2_1gbit.png \
		> $(RESULTS)/hier_2x2_1gbit.md
	$(PYTHON) bench/hier_netns.py --hosts 8 --per-host 1 --rate 1000 -b 1M -e 64M \
		--algos ring,tree,rhd,auto -n 3 --rounds 3 --repeats 2 --vs gloo \
		--json $(RESULTS)/hosts_8x1_1gbit.json --plot $(RESULTS)/hosts_8x1_1gbit.png \
		> $(RESULTS)/hosts_8x1_1gbit.md
	$(PYTHON) bench/hier_netns.py --hosts 8 --per-host 1 --rate 1000 -b 1M -e 64M \
		--algos ring,tree --channels 1,2,4 -n 3 --rounds 3 --repeats 1 --vs "" \
		--json $(RESULTS)/double_tree_8x1_1gbit.json --plot $(RESULTS)/double_tree_8x1_1gbit.png \
		> $(RESULTS)/double_tree_8x1_1gbit.md

# An imported MSCCL allreduce (eight channels per rank) beside weft's ring on the same 8 local
# ranks over shared memory (needs ../shared/msccl).
bench-msccl: install install-peers
	$(PYTHON) -m weft.bench --msccl ../shared/msccl/msccl-tools_allreduce_ring_8_1_LL128.xml \
		--transport shm --algo ring -b 4K -e 64M -n 10 -w 2 --rounds 3 \
		--json $(RESULTS)/msccl_ring8_shm.json --plot $(RESULTS)/msccl_ring8_shm.png \
		> $(RESULTS)/msccl_ring8_shm.txt

# weft.topo.simulate at scale (bench/results/sim_scale.*): a 4096-rank ring allreduce and hier on
# 8192 and 65536 ranks, wall time and peak RSS, next to ASTRA-sim's figure from issue 44.
.PHONY: bench-sim
bench-sim: install
	$(PYTHON) bench/sim_scale.py

# weft.topo.simulate calibrated here against measurement (bench/results/predict_vs_measure.*):
# ring, tree and rhd allreduce at 4 ranks over tcp and on 2 namespace hosts x 2 at 1 Gbit/s
# (root), from 64 KiB up.
.PHONY: bench-predict
bench-predict: install
	$(PYTHON) bench/predict_vs_measure.py
