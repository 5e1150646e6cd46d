"""python -m weft.topo: Algorithms from the command line.

    python -m weft.topo export allreduce ring 8 --count 1000 -o ring8.json
    python -m weft.topo check ring8.json [more.json ...] [--slots 2 --slot-bytes 4096]

``check`` prints each file's report and exits with 1 when any file fails.
"""

from __future__ import annotations

import argparse
import sys

from weft import topo


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
    check = commands.add_parser("check", help="check Algorithm files (JSON)")
    check.add_argument("files", nargs="+")
    check.add_argument("--slots", type=int, help="messages in flight per connection")
    check.add_argument("--slot-bytes", type=int, help="the largest message")
    args = parser.parse_args(argv)

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
    failed = False
    for path in args.files:
        try:
            report = topo.check(topo.load(path), slots=args.slots, slot_bytes=args.slot_bytes)
        except (ValueError, OSError) as e:  # AlgorithmError is a ValueError
            print(e if isinstance(e, topo.AlgorithmError) else f"{path}: {e}")
            failed = True
            continue
        print(f"{path}: {report}")
        failed |= not report.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
