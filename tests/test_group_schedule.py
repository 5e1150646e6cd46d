"""The nccl transport's Plan executor, replayed on the host: every rank's Plan rewritten into
batches of sends and receives and reduction kernels (csrc/core/exec/group_schedule.h, the
schedule the GPU runs with ncclSend/ncclRecv and weft's kernels) is run here by a model of
NCCL's semantics, with numpy for the kernels, and must end with the collective's result.

The model: a rank runs its actions in order (its stream). A reduce runs at once. A batch waits
until every one of its transfers is matched: the k-th send from a to b with the k-th receive
at b from a, both sides posted (their ranks reached the batches holding them), with equal
byte counts; matched data moves as a whole. Ranks that all wait with nothing matched are
deadlocked. Inside a batch no receive may overlap another transfer's memory. No GPU needed.
"""

from __future__ import annotations

import numpy as np
import pytest
import weft._C as C

DTYPES = {4: np.int32, 8: np.float64}


OPS = {"sum": np.add, "avg": np.add, "max": np.maximum, "prod": np.multiply}


class Rank:
    """One rank's memory (numpy byte arrays per region) and its place in its schedule."""

    def __init__(self, rank, plan, regions, dtype):
        self.rank = rank
        self.actions = plan["actions"]
        self.mem = regions
        self.dtype = dtype
        self.pc = 0

    def view(self, ref, nbytes):
        region, offset = ref
        return self.mem[region][offset : offset + nbytes]

    def where(self, ref, nbytes):
        """(buffer, begin, end) of a reference: Input aliases Output when in place."""
        view = self.view(ref, nbytes)
        base = view.base if view.base is not None else view
        start = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        return id(base), start, start + nbytes

    def reduce(self, action, size, op):
        _, dst, srcs, count, finalize = action
        nbytes = count * np.dtype(self.dtype).itemsize
        acc = self.view(srcs[0], nbytes).view(self.dtype).copy()
        for src in srcs[1:]:
            acc = OPS[op](acc, self.view(src, nbytes).view(self.dtype))
        if finalize and op == "avg":
            acc = acc / size if self.dtype == np.float64 else np.trunc(acc / size)
        self.view(dst, nbytes)[:] = acc.astype(self.dtype).view(np.uint8)


def number_transfers(ranks):
    """Each batch's transfers as (key, kind, ref, bytes): the k-th send from a to b and the k-th
    receive at b from a share the key (a, b, k)."""
    counters = {}
    numbered = []
    for r in ranks:
        mine = []
        for action in r.actions:
            keyed = []
            for kind, peer, ref, nbytes in action[1] if action[0] == "batch" else ():
                pair = (r.rank, peer, kind) if kind == "send" else (peer, r.rank, kind)
                k = counters.get(pair, 0)
                counters[pair] = k + 1
                keyed.append(((pair[0], pair[1], k), kind, ref, nbytes))
            mine.append(keyed)
        numbered.append(mine)
    for src, dst, kind in counters:
        other = (src, dst, "recv" if kind == "send" else "send")
        assert counters[(src, dst, kind)] == counters.get(other, 0), f"unmatched {src}->{dst}"
    return numbered


def check_batch(r, keyed):
    """No receive of a batch overlaps the memory of another of its transfers."""
    spans = [(kind, r.where(ref, n)) for _, kind, ref, n in keyed]
    for i, (kind, a) in enumerate(spans):
        for j, (_, b) in enumerate(spans):
            if kind == "recv" and i != j and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]:
                raise AssertionError(f"rank {r.rank}: a receive overlaps a transfer of its batch")


def replay(ranks, size, op):
    """Runs every rank's schedule to the end; fails on a deadlock or a mismatch."""
    numbered = number_transfers(ranks)
    posted = {}  # (key, kind) -> (rank, ref, bytes)
    done = set()
    while any(r.pc < len(r.actions) for r in ranks):
        progress = False
        for r in ranks:
            while r.pc < len(r.actions):
                if r.actions[r.pc][0] == "reduce":
                    r.reduce(r.actions[r.pc], size, op)
                    r.pc += 1
                    progress = True
                    continue
                keyed = numbered[r.rank][r.pc]
                check_batch(r, keyed)
                for key, kind, ref, n in keyed:
                    posted[(key, kind)] = (r, ref, n)
                for key, _, _, _ in keyed:
                    send, recv = posted.get((key, "send")), posted.get((key, "recv"))
                    if key in done or not (send and recv):
                        continue
                    assert send[2] == recv[2], f"{key}: {send[2]} bytes sent, {recv[2]} awaited"
                    recv[0].view(recv[1], recv[2])[:] = send[0].view(send[1], send[2])
                    done.add(key)
                    progress = True
                if not all(key in done for key, *_ in keyed):
                    break
                r.pc += 1
                progress = True
        assert progress, "deadlock: " + ", ".join(f"rank {r.rank} at {r.pc}" for r in ranks)


def run(
    collective,
    algorithm,
    size,
    count,
    elem,
    op,
    in_place,
    root=0,
    hosts=(),
    step=256,
    shared_cpu=(),
):
    dtype = DTYPES[elem]
    rng = np.random.default_rng(size * 1000 + count)
    width = size if collective == "reduce_scatter" else 1
    inputs = [rng.integers(-20, 20, count * width).astype(dtype) for _ in range(size)]
    if op == "prod":
        inputs = [rng.integers(-2, 3, count * width).astype(dtype) for _ in range(size)]
    out_count = count * size if collective == "allgather" else count
    ranks = []
    for r in range(size):
        out = np.zeros(out_count * elem, np.uint8)
        if collective == "broadcast":
            out[:] = inputs[r].view(np.uint8)
            alias = 0
            inp = out
        elif in_place:
            alias = r * count * elem if collective == "allgather" else 0
            out[alias : alias + count * elem] = inputs[r].view(np.uint8)
            inp = out[alias : alias + count * elem]
        else:
            alias = None
            inp = inputs[r].view(np.uint8).copy()
        plan = C.group_schedule(
            collective,
            algorithm,
            r,
            size,
            count,
            elem,
            root=root,
            in_place=in_place or collective == "broadcast",
            finalize=op == "avg",
            input_in_output=alias,
            max_step_bytes=step,
            hosts=list(hosts) or [0] * size,
            max_inputs=3,
            shared_cpu=list(shared_cpu),
        )
        regions = {
            "input": inp,
            "output": out,
            "scratch": np.zeros(plan["scratch_bytes"], np.uint8),
            "temp0": np.zeros(plan["temp_bytes"], np.uint8),
            "temp1": np.zeros(plan["temp_bytes"], np.uint8),
        }
        ranks.append(Rank(r, plan, regions, dtype))
    replay(ranks, size, op)
    stacked = np.stack(inputs).astype(np.float64)
    fold = {"sum": np.sum, "avg": np.sum, "max": np.max, "prod": np.prod}[op](stacked, axis=0)
    if op == "avg":
        fold = fold / size if dtype == np.float64 else np.trunc(fold / size)
    got = [r.mem["output"].view(dtype) for r in ranks]
    for r in range(size):
        if collective == "allreduce":
            want = fold
        elif collective == "reduce_scatter":
            want = fold[r * count : (r + 1) * count]
        elif collective == "allgather":
            want = np.concatenate(inputs)
        elif collective == "broadcast":
            want = inputs[root]
        else:  # reduce
            if r != root:
                continue
            want = fold
        np.testing.assert_allclose(got[r], want, err_msg=f"rank {r} of {size}")


ALLREDUCE = ["ring", "tree", "rd", "rhd", "oneshot"]


@pytest.mark.parametrize("algorithm", ALLREDUCE)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("step", [64, 1 << 20], ids=["rounds", "one-round"])
def test_allreduce(algorithm, size, in_place, step):
    for count, elem, op in [(0, 4, "sum"), (1, 8, "max"), (37, 4, "sum"), (301, 8, "avg")]:
        run("allreduce", algorithm, size, count, elem, op, in_place, step=step)
    run("allreduce", algorithm, size, 29, 4, "avg", in_place, step=step)
    run("allreduce", algorithm, size, 23, 8, "prod", in_place, step=step)


def peers(algorithm, rank, size, count, elem, step, hosts=None, shared_cpu=(), kind="send"):
    """The ranks `rank` sends to (or receives from) in an allreduce Plan, in order."""
    plan = C.group_schedule(
        "allreduce",
        algorithm,
        rank,
        size,
        count,
        elem,
        max_step_bytes=step,
        hosts=hosts or [0] * size,
        shared_cpu=list(shared_cpu),
    )
    return [t[1] for a in plan["actions"] if a[0] == "batch" for t in a[1] if t[0] == kind]


def sends(algorithm, rank, size, count, elem, step):
    """How many messages `rank` sends in an allreduce Plan."""
    return len(peers(algorithm, rank, size, count, elem, step))


@pytest.mark.parametrize("size", [3, 8])
def test_tree_allreduce_splits_from_16_kib(size):
    """Below 16 KiB one tree carries the buffer (each rank but the root sends once up, each rank
    but the leaves once per child down: 2 (size - 1) messages); from there each half has its
    own tree, twice the messages. Both must come out right."""
    below, at = 16384 // 8 - 1, 16384 // 8
    assert sum(sends("tree", r, size, below, 8, 1 << 20) for r in range(size)) == 2 * (size - 1)
    # The one tree is wide: rank 0 is the root of up to 4 children, rank p the parent of ranks
    # 4p + 1 ... 4p + 4 (two levels for 8 ranks).
    for r in range(size):
        parent = [] if r == 0 else [(r - 1) // 4]
        children = [c for c in range(4 * r + 1, 4 * r + 5) if c < size]
        assert peers("tree", r, size, below, 8, 1 << 20) == parent + children
    # Across hosts it is the in-order binary tree, which crosses between two blocks of ranks
    # once: with 2 hosts of 2 ranks, rank 2 is the root and sends to its children 1 and 3.
    assert peers("tree", 2, 4, below, 8, 1 << 20, hosts=[0, 0, 1, 1]) == [1, 3]
    assert sum(sends("tree", r, size, at, 8, 1 << 20) for r in range(size)) == 4 * (size - 1)
    for count in (below, at):
        run("allreduce", "tree", size, count, 8, "sum", False, step=1 << 20)


@pytest.mark.parametrize(
    "shared_cpu",
    [[0, 0, 0], [0, 1] * 3, [0, 1] * 4, [0, 1, 2] * 3, [0, 1, 2, 0, 1, 2, 0], [-1, -1, 0, 0, 0]],
    ids=["1cpu", "2cpus-ws6", "2cpus-ws8", "3cpus-ws9", "3cpus-ws7", "2free-1cpu"],
)
def test_rd_allreduce_folds_the_ranks_of_a_cpu(shared_cpu):
    """Ranks that take turns on one CPU hand their input to the first of them and get the
    result from it; only those first ranks (and ranks with a CPU each) run the rounds, folded
    to a power of two as any world is (3 CPUs: the first CPU's first rank under the second's)."""
    size = len(shared_cpu)
    firsts = {}
    for r, cpu in enumerate(shared_cpu):
        firsts.setdefault(cpu, r)
    for r, cpu in enumerate(shared_cpu):
        if cpu >= 0 and firsts[cpu] != r:
            for kind in ("send", "recv"):
                got = peers("rd", r, size, 5, 4, 1 << 20, shared_cpu=shared_cpu, kind=kind)
                assert got == [firsts[cpu]], f"rank {r} {kind}s {got}"
    rounds = {r for r in range(size) if shared_cpu[r] < 0 or firsts[shared_cpu[r]] == r}
    if len(rounds) == 3:  # the first of the three sits out under the second
        first, second, _ = sorted(rounds)
        got = peers("rd", first, size, 5, 4, 1 << 20, shared_cpu=shared_cpu)
        assert got[0] == second, f"rank {first} sends {got}"
    for count, elem, op in [(0, 4, "sum"), (1, 8, "max"), (37, 4, "sum"), (301, 8, "avg")]:
        for in_place in (False, True):
            run("allreduce", "rd", size, count, elem, op, in_place, shared_cpu=shared_cpu)


def test_one_host_and_cpu_entry_per_rank():
    for hosts, shared_cpu in (([0, 0], []), ([0] * 4, [0, 1])):
        with pytest.raises(ValueError, match="one entry per rank of 4"):
            C.group_schedule("allreduce", "rd", 0, 4, 5, 4, hosts=hosts, shared_cpu=shared_cpu)


def test_rhd_allreduce_goes_in_rounds_of_the_ring():
    """Rounds of (elements per step) x (group size), each a whole halving and doubling: 2 log2(p)
    exchanges per round."""
    step, size = 256, 8
    round_elems = step // 4 * size
    for rounds in (1, 3):
        count = rounds * round_elems - 5
        assert sends("rhd", 0, size, count, 4, step) == rounds * 2 * 3
        run("allreduce", "rhd", size, count, 4, "sum", True, step=step)


def test_hierarchical_allreduce():
    for per_host in (2, 3):
        hosts = [r // per_host for r in range(2 * per_host)]
        run("allreduce", "hier", 2 * per_host, 211, 4, "sum", False, hosts=hosts)
        run("allreduce", "hier", 2 * per_host, 97, 8, "avg", True, hosts=hosts)


@pytest.mark.parametrize("hosts", [2, 3])
def test_hierarchical_allreduce_in_pieces(hosts):
    """Counts the CPU executor's hier plans cut into pieces (64 elements per 256-byte step),
    interleaving the host phases of neighbouring pieces with the link phase of the current one.
    Sends that wait for their receives would deadlock on that (this replay found it with three
    hosts), so plans for them keep hier in one piece; they must still come out right."""
    for per_host in (2, 3):
        layout = [r // per_host for r in range(hosts * per_host)]
        size = len(layout)
        run("allreduce", "hier", size, 2053, 4, "sum", False, hosts=layout)
        run("allreduce", "hier", size, 1031, 8, "avg", True, hosts=layout)


@pytest.mark.parametrize("algorithm", ["ring", "rhd"])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_reduce_scatter(algorithm, size):
    if algorithm == "rhd" and size & (size - 1):
        pytest.skip("recursive halving needs a power-of-two world")
    for count, elem, op in [(1, 4, "sum"), (53, 8, "max"), (64, 4, "avg")]:
        run("reduce_scatter", algorithm, size, count, elem, op, False)


@pytest.mark.parametrize("algorithm", ["ring", "rhd"])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("in_place", [False, True])
def test_allgather(algorithm, size, in_place):
    if algorithm == "rhd" and size & (size - 1):
        pytest.skip("recursive doubling needs a power-of-two world")
    for count in (1, 40, 333):
        run("allgather", algorithm, size, count, 4, "sum", in_place)


@pytest.mark.parametrize("algorithm", ["chain", "tree"])
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_broadcast_and_reduce(algorithm, size):
    for root in {0, size - 1}:
        run("broadcast", algorithm, size, 257, 4, "sum", True, root=root)
        run("reduce", algorithm, size, 257, 8, "sum", False, root=root)
        run("reduce", algorithm, size, 100, 4, "avg", True, root=root)
        run("reduce", algorithm, size, 31, 8, "max", False, root=root)
