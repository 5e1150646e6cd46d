"""A 2-D torus allreduce, written, checked and run: python examples/topo/torus2d_allreduce.py

Rank x + X*y sits at (x, y) of an X x Y torus. The allreduce reduce-scatters along every row,
then along every column, and gathers back along columns and rows: each ring uses only the
torus's own links, and the rows' rings carry X times less than one ring over all ranks would.
"""

import numpy as np
import weft.local
from weft import topo


def ring(p, members, blocks, reduce):
    """A ring over `members`; reduce-scatter: block j ends, reduced, at member j; allgather:
    block j starts at member j and reaches every member."""
    n = len(members)
    for j, rank in enumerate(members if n > 1 else []):
        prev, nxt = members[j - 1], members[(j + 1) % n]
        if reduce:
            p.send(rank, nxt, blocks[(j - 1) % n])
            for k in range(1, n - 1):
                p.recv_reduce_send(rank, prev, nxt, blocks[(j - 1 - k) % n])
            p.recv_reduce(rank, prev, blocks[j], blocks[j])
        else:
            p.send(rank, nxt, blocks[j])
            for k in range(1, n - 1):
                p.recv_copy_send(rank, prev, nxt, blocks[(j - k) % n])
            p.recv(rank, prev, blocks[(j + 1) % n])


def torus_allreduce(X: int, Y: int) -> topo.Algorithm:
    p = topo.Program("allreduce", ranks=X * Y, count=X * Y, name=f"torus{X}x{Y}")
    rows = [[x + X * y for x in range(X)] for y in range(Y)]
    columns = [[x + X * y for y in range(Y)] for x in range(X)]
    row_blocks = [p.output[x * Y : (x + 1) * Y] for x in range(X)]
    for rank in range(X * Y):
        p.copy(rank, p.input[0 : X * Y], p.output[0 : X * Y])
    for members in rows:
        ring(p, members, row_blocks, reduce=True)
    for x, members in enumerate(columns):  # column x holds row block x
        ring(p, members, [p.output[x * Y + y : x * Y + y + 1] for y in range(Y)], reduce=True)
    for x, members in enumerate(columns):
        ring(p, members, [p.output[x * Y + y : x * Y + y + 1] for y in range(Y)], reduce=False)
    for members in rows:
        ring(p, members, row_blocks, reduce=False)
    return p.algorithm()


def run_rank(rank, size, store, algo_json):
    comm = weft.Communicator(store, rank, size, name="torus", timeout=60)
    x = np.arange(size * 1000, dtype=np.float32) * (rank + 1)  # 1000 elements per chunk
    out = np.empty_like(x)
    topo.run(topo.Algorithm.from_json(algo_json), comm, x, out)
    return bool(
        np.array_equal(out, np.arange(size * 1000, dtype=np.float32) * (size * (size + 1) // 2))
    )


if __name__ == "__main__":
    algo = torus_allreduce(3, 2)
    # On a torus of 2 rows of 3 whose ranks do not forward: every message crosses one link.
    report = topo.check(algo, topology=topo.Topology.torus((2, 3), ranks_forward=False))
    print(report)
    assert report.ok
    results = weft.local.spawn(run_rank, algo.ranks, algo.to_json())
    print(f"ran on {algo.ranks} local ranks: {'right' if all(results) else 'WRONG'} everywhere")
    assert all(results)
