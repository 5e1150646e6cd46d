"""python -m weft.topo: Algorithms from the command line.

    python -m weft.topo export allreduce ring 8 --count 1000 -o ring8.json
    python -m weft.topo check ring8.json [more.json ring.xml ...] [--slots 2 --slot-bytes 4096]
    python -m weft.topo check ring8.json --topology torus:2x4:noforward    # or --direct-only
    python -m weft.topo simulate ring8.json --topology hosts:2x4 --bytes 1M [--links 5]
    python -m weft.topo simulate ring --topology ring:4096 --bytes 1M      # a built-in family
    python -m weft.topo draw topology hosts:2x4 -o hosts.png
    python -m weft.topo draw timeline ring8.json --topology ring:8 --bytes 64K -o ring8.png
    python -m weft.topo check reduce.xml --root 3        # an MSCCL reduce's or broadcast's root

An Algorithm file is weft.topo's JSON, or MSCCL's XML by its ``.xml`` suffix. ``--root R`` gives
a broadcast's or reduce's root: an MSCCL file's, read off its program, is checked against it (an
in-place reduce that several ranks write needs it); a JSON file's likewise; a built-in family is
planned for it.
``check`` prints each file's report and exits with 1 when any file fails. A topology is a JSON
file that ``Topology.save`` wrote or a builder: ring:N, full:N, switch:N, fat_tree:N[xPER_LEAF],
torus:AxB[xC...], hosts:HOSTSxPER_HOST, rail:HOSTSxPER_HOST; either with ``:noforward`` after it
has ranks that do not forward (ranks_forward=False). Sizes take K, M and G (powers of 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from weft import topo
from weft.topo.msccl import AmbiguousRoot, load_file

ROOT_HELP = (
    "a broadcast's or reduce's root: an Algorithm file's is checked against it (an in-place "
    "MSCCL reduce that several ranks write needs it); a family is planned for it (0)"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m weft.topo", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="write a built-in family's Plans as JSON")
    export.add_argument("collective", choices=list(topo.FAMILIES))
    export.add_argument("family")
    export.add_argument("ranks", type=int)
    export.add_argument("--count", type=int, default=1024, help="elements per call (1024)")
    export.add_argument("--root", type=int, default=0)
    export.add_argument("--in-place", action="store_true")
    export.add_argument("--avg", action="store_true", help="the reduction is avg")
    export.add_argument("--hosts", type=int, help="hosts holding equal blocks of ranks")
    export.add_argument("--slot-bytes", type=int, default=256 << 10)
    export.add_argument("--slots", type=int, default=8)
    export.add_argument("-o", "--output", required=True, help="the JSON file to write")
    check = commands.add_parser("check", help="check Algorithm files (JSON, or MSCCL XML)")
    check.add_argument("files", nargs="+")
    check.add_argument(
        "--slots", type=int, help="messages in flight per connection (0: rendezvous sends)"
    )
    check.add_argument("--slot-bytes", type=int, help="the largest message")
    check.add_argument("--topology", type=topology_arg, help="also check every message's route")
    check.add_argument(
        "--direct-only",
        action="store_true",
        help="with --topology: check as if its ranks did not forward (as :noforward says), so no "
        "route may pass through another rank",
    )
    check.add_argument("--root", type=int, help=ROOT_HELP)
    sim = commands.add_parser("simulate", help="simulate an Algorithm file or built-in family")
    sim.add_argument(
        "algorithm", help="an Algorithm file (JSON, MSCCL XML) or a built-in family's name"
    )
    sim.add_argument("--topology", type=topology_arg, required=True)
    sim.add_argument("--bytes", type=size_arg, help="bytes a call passes (an Algorithm: its own)")
    sim.add_argument("--collective", default="allreduce", help="for a family (allreduce)")
    sim.add_argument("--slots", type=int, help="messages in flight per connection")
    sim.add_argument("--slice-bytes", type=size_arg, help="the largest message")
    sim.add_argument("--links", type=int, default=0, help="print the N busiest links")
    sim.add_argument(
        "--calls", type=int, default=1, help="back to back, the first half a warm-up (1)"
    )
    sim.add_argument("--root", type=int, help=ROOT_HELP)
    draw = commands.add_parser("draw", help="pictures: a topology, or a simulated timeline")
    draw.add_argument("what", choices=("topology", "timeline"))
    draw.add_argument("subject", help="topology: a topology; timeline: an Algorithm or family")
    draw.add_argument("--topology", type=topology_arg, help="timeline: the topology")
    draw.add_argument("--bytes", type=size_arg)
    draw.add_argument("--collective", default="allreduce")
    draw.add_argument("--root", type=int, help=f"timeline: {ROOT_HELP}")
    draw.add_argument("-o", "--output", required=True, help="the PNG to write")
    try:
        args = parser.parse_args(argv)
    except topo.TopologyError as e:
        parser.error(str(e))

    if args.command == "export":
        try:
            algo = topo.builtin(
                args.collective,
                args.family,
                args.ranks,
                count=args.count,
                root=args.root,
                in_place=args.in_place,
                avg=args.avg,
                hosts=args.hosts,
                slot_bytes=args.slot_bytes,
                slots=args.slots,
            )
        except (ValueError, RuntimeError) as e:  # weft.InvalidArgument is a ValueError
            parser.error(str(e))
        algo.save(args.output)
        print(f"{args.output}: {algo.name} {algo.collective} on {algo.ranks} ranks")
        return 0
    try:
        if args.command == "simulate":
            result = topo.simulate(
                algorithm_arg(args.algorithm, args.root),
                args.topology,
                args.bytes,
                collective=args.collective,
                root=args.root or 0,
                slots=args.slots,
                slice_bytes=args.slice_bytes,
                calls=args.calls,
            )
            print(f"{args.algorithm} on {args.topology.name}: {result}")
            for use in result.link_use(args.links) if args.links else []:
                print(
                    f"  {use['from']} -> {use['to']} ({use['class']}): {use['bytes']:.0f} B, "
                    f"busy {use['busy_s'] * 1e6:.2f} us ({100 * use['utilization']:.0f} %)"
                )
            return 0
        if args.command == "draw":
            if args.what == "topology":
                if args.root is not None:
                    parser.error("--root is for draw timeline")
                topo.draw_topology(topology_arg(args.subject), args.output)
            else:
                if args.topology is None:
                    parser.error("draw timeline needs --topology")
                topo.draw_timeline(
                    algorithm_arg(args.subject, args.root),
                    args.topology,
                    args.output,
                    args.bytes,
                    collective=args.collective,
                    root=args.root or 0,
                )
            print(f"wrote {args.output}")
            return 0
    except (ValueError, RuntimeError, OSError) as e:  # AlgorithmError, TopologyError, weft errors
        print(f"python -m weft.topo {args.command}: {e}", file=sys.stderr)
        return 1
    failed = False
    for path in args.files:
        try:
            report = topo.check(
                algorithm_file(path, args.root),
                slots=args.slots,
                slot_bytes=args.slot_bytes,
                topology=args.topology,
                direct_only=args.direct_only,
            )
        except (ValueError, OSError) as e:  # AlgorithmError is a ValueError
            print(e if isinstance(e, topo.AlgorithmError) else f"{path}: {e}")
            failed = True
            continue
        print(f"{path}: {report}")
        failed |= not report.ok
    return 1 if failed else 0


def size_arg(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    scale = units.get(text[-1:].upper(), 1)
    try:
        return int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4096, 64K, 1M)") from None


BUILDERS = {
    "ring": lambda d: topo.Topology.ring(*d),
    "full": lambda d: topo.Topology.fully_connected(*d),
    "switch": lambda d: topo.Topology.switch(*d),
    "fat_tree": lambda d: topo.Topology.fat_tree(*d),
    "torus": lambda d: topo.Topology.torus(tuple(d)),
    "hosts": lambda d: topo.Topology.hosts(*d),
    "rail": lambda d: topo.Topology.rail_optimized(*d),
}

NO_FORWARD = ":noforward"


def topology_arg(text: str) -> topo.Topology:
    """A Topology file, or builder:AxB; either followed by :noforward (ranks do not forward)."""
    if text.endswith(NO_FORWARD):
        return topology_arg(text.removesuffix(NO_FORWARD)).with_ranks_forward(False)
    kind, _, dims = text.partition(":")
    if kind in BUILDERS and dims:
        try:
            numbers = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            raise topo.TopologyError(
                f"{text!r}: the builder's sizes are integers, e.g. torus:4x4"
            ) from None
        return BUILDERS[kind](numbers)
    if not Path(text).exists():
        raise topo.TopologyError(
            f"{text!r} is neither a topology file nor a builder ({', '.join(BUILDERS)}:N...)"
        )
    return topo.Topology.load(text)


def algorithm_arg(text: str, root: int | None = None):
    """An Algorithm file (for ``root``, as algorithm_file takes it), or a built-in family's
    name."""
    is_file = text.endswith((".json", ".xml")) or Path(text).exists()
    return algorithm_file(text, root) if is_file else text


def algorithm_file(path: str, root: int | None) -> topo.Algorithm:
    """An Algorithm file, its root checked against --root (or, for an in-place MSCCL reduce
    that several ranks write, chosen by it)."""
    try:
        return load_file(path, root=root)
    except AmbiguousRoot as e:
        raise topo.AlgorithmError(f"{e} (--root R)") from None


if __name__ == "__main__":
    sys.exit(main())
