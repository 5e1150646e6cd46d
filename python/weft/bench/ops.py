"""The collectives weft-bench measures, with nccl-tests' conventions.

For each op: how a requested size becomes element counts, the buffers of its out-of-place and
in-place forms (in place as NCCL lays it out: a reduce-scatter's output is the rank's block of
its input, an all-gather's input is the rank's block of its output), the bus-bandwidth factor
(DESIGN.md, "Conventions") and the result every rank must hold for the check.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# -d values: nccl-tests' names and torch's; the first name of each type is the one displayed.
DTYPES = {
    "float": torch.float32,
    "float32": torch.float32,
    "double": torch.float64,
    "float64": torch.float64,
    "half": torch.float16,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
}
DISPLAY_NAME = {dtype: name for name, dtype in reversed(DTYPES.items())}


@dataclass(frozen=True)
class Op:
    name: str  # nccl-tests' name, used by -o
    collective: str  # weft's name for it (weft.algorithms)
    input_per_rank: bool = False  # the input holds one block per rank (else one block)
    output_per_rank: bool = False
    rooted: bool = False
    in_place_form: bool = True  # whether the op has an in-place form
    out_of_place_form: bool = True
    # The form that ratios and the plot compare: one that every peer offers.
    compared_in_place: bool = True

    @property
    def reduces(self) -> bool:
        return self.name in ("all_reduce", "reduce_scatter", "reduce")

    def bus_factor(self, n: int) -> float:
        if self.name == "all_reduce":
            return 2 * (n - 1) / n
        if self.input_per_rank or self.output_per_rank:
            return (n - 1) / n
        return 1.0

    def forms(self) -> list[bool]:
        """The in_place values this op is measured with: out-of-place first."""
        return [f for f, ok in ((False, self.out_of_place_form), (True, self.in_place_form)) if ok]


OPS = {
    op.name: op
    for op in (
        Op("all_reduce", "allreduce"),
        Op("reduce_scatter", "reduce_scatter", input_per_rank=True, compared_in_place=False),
        Op("all_gather", "allgather", output_per_rank=True, compared_in_place=False),
        # In place only: no peer's API has an out-of-place broadcast.
        Op("broadcast", "broadcast", rooted=True, out_of_place_form=False),
        Op("reduce", "reduce", rooted=True),
        Op(
            "all_to_all",
            "alltoall",
            input_per_rank=True,
            output_per_rank=True,
            in_place_form=False,
            compared_in_place=False,
        ),
    )
}


@dataclass(frozen=True)
class Shape:
    block: int  # elements per rank block
    input_count: int
    output_count: int

    @property
    def count(self) -> int:
        """Elements of the size reported (nccl-tests: the larger of input and output)."""
        return max(self.input_count, self.output_count)


def shape(op: Op, nbytes: int, n: int, elem_size: int) -> Shape:
    """Element counts for a requested size; nccl-tests rounds down to whole blocks."""
    elems = nbytes // elem_size
    per_rank = op.input_per_rank or op.output_per_rank
    block = elems // n if per_rank else elems
    return Shape(
        block,
        block * (n if op.input_per_rank else 1),
        block * (n if op.output_per_rank else 1),
    )


def buffers(op: Op, in_place: bool, s: Shape, n: int, rank: int, dtype, device):
    """(input, output) tensors of the op's form; views of one buffer when in place."""
    if not in_place:
        return (
            torch.empty(s.input_count, dtype=dtype, device=device),
            torch.empty(s.output_count, dtype=dtype, device=device),
        )
    buf = torch.empty(s.count, dtype=dtype, device=device)
    mine = buf[rank * s.block : (rank + 1) * s.block]
    if op.input_per_rank and not op.output_per_rank:
        return buf, mine
    if op.output_per_rank and not op.input_per_rank:
        return mine, buf
    return buf, buf


def pattern(rank: int, start: int, count: int, device) -> torch.Tensor:
    """Rank `rank`'s input elements start..start+count: small integers, exact in every dtype
    (and their sums over up to 18 ranks fit int8). One tensor, no temporaries: at 256 MiB,
    8 ranks' checks would otherwise not fit in memory with their buffers."""
    index_type = torch.int32 if start + count + 3 * rank < 2**31 else torch.int64
    values = torch.arange(start, start + count, dtype=index_type, device=device)
    return values.add_(3 * rank).remainder_(7).add_(1)


def pattern_sum(start: int, count: int, n: int, device) -> torch.Tensor:
    """The sum of every rank's pattern() over start..start+count."""
    total = pattern(0, start, count, device)
    for p in range(1, n):
        total.add_(pattern(p, start, count, device))
    return total


def expected(op: Op, s: Shape, n: int, rank: int, root: int, device) -> torch.Tensor | None:
    """What `rank`'s output must hold after the op on pattern() inputs; None: not checked
    (the output of a reduce is defined at the root only)."""
    b = s.block
    if op.name == "reduce" and rank != root:
        return None
    if op.name == "broadcast":
        return pattern(root, 0, b, device)
    if op.name in ("all_reduce", "reduce"):
        return pattern_sum(0, b, n, device)
    if op.name == "reduce_scatter":
        return pattern_sum(rank * b, b, n, device)
    if op.name == "all_gather":
        return torch.cat([pattern(p, 0, b, device) for p in range(n)])
    if op.name == "all_to_all":
        return torch.cat([pattern(p, rank * b, b, device) for p in range(n)])
    raise ValueError(f"no reference for {op.name}")


def count_wrong(output: torch.Tensor, want: torch.Tensor | None) -> int:
    if want is None:
        return 0
    slice_len = 1 << 22  # compared a slice at a time: no full-size cast or mask
    return sum(
        int((output[i : i + slice_len] != want[i : i + slice_len].to(output.dtype)).sum())
        for i in range(0, output.numel(), slice_len)
    )
