"""A build without libfabric's or libibverbs' headers (docs/rdma.md). CMake then leaves out every
source of that back end but its entry point (ofi_connection.cc, ibverbs_connection.cc), which is
compiled without WEFT_HAVE_LIBFABRIC / WEFT_HAVE_IBVERBS and says what to install. Only the
entry points read those definitions, so such a build differs from this tree's in those two
objects alone: rather than building everything twice, this compiles the two as that build would
(this tree's own compile commands, less the definition) and checks that nothing the core keeps
needs a symbol only the left-out sources define, i.e. that its link succeeds."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# As CMakeLists.txt has them: the definition, the back end's folder, its entry point; and what
# the entry point says without the headers.
BACK_ENDS = {
    "WEFT_HAVE_LIBFABRIC": (
        "csrc/core/transport/rdma/ofi/",
        "ofi_connection.cc",
        "WEFT_TRANSPORT=ofi, but weft was built without libfabric's headers",
    ),
    "WEFT_HAVE_IBVERBS": (
        "csrc/core/transport/rdma/ibverbs/",
        "ibverbs_connection.cc",
        "WEFT_TRANSPORT=ibverbs, but weft was built without libibverbs' headers",
    ),
}


def build_dir() -> Path:
    dirs = sorted(p.parent for p in (ROOT / "build").glob("*/build.ninja"))
    if not dirs:
        pytest.skip("weft was not built in this tree (pip install . builds in build/<wheel tag>)")
    if shutil.which("ninja") is None or shutil.which("nm") is None:
        pytest.skip("needs ninja and nm on PATH")
    return dirs[-1]


def core_commands(build: Path) -> tuple[dict[str, list[str]], list[str]]:
    """The core's compile commands by source path (relative to the tree), and its objects."""
    text = subprocess.run(
        ["ninja", "-C", str(build), "-t", "commands", "libweft_core.a"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    compiles, objects = {}, []
    for line in text.splitlines():
        archive = re.search(r"\bar qc (.*)", line)
        if archive:
            objects = [t for t in shlex.split(archive.group(1)) if t.endswith(".o")]
        elif " -c " in line:
            args = shlex.split(line)
            source = Path(args[args.index("-c") + 1]).resolve()
            if source.is_relative_to(ROOT):
                compiles[source.relative_to(ROOT).as_posix()] = args
    return compiles, objects


def without_headers(args: list[str], definition: str, out: Path) -> list[str]:
    """A compile command as a build without the back end's headers runs it: no definition, the
    object to ``out``, and no dependency file (it would replace the build's own)."""
    kept, skip = [], 0
    for a in args:
        if skip:
            skip -= 1
        elif a in ("-MT", "-MF"):
            skip = 1
        elif a == "-o":
            kept += ["-o", str(out)]
            skip = 1
        elif a not in (f"-D{definition}", "-MD"):
            kept.append(a)
    return kept


def symbols(build: Path, objects: list[str], *flags: str) -> dict[str, set[str]]:
    """Each object's global symbols as nm lists them with ``flags`` (mangled)."""
    out = subprocess.run(
        ["nm", "-A", *flags, *objects], cwd=build, check=True, capture_output=True, text=True
    ).stdout
    found: dict[str, set[str]] = {o: set() for o in objects}
    for line in out.splitlines():
        match = re.match(r"(.+?):\s*(?:[0-9a-f]+\s+)?[A-Za-z]\s+(\S+)$", line)
        if match:
            found[match.group(1)].add(match.group(2))
    return found


def unresolved(build: Path, kept: list[str], left_out: list[str]) -> dict[str, set[str]]:
    """Per kept object, the symbols it needs that only the left-out objects define."""
    defined_kept = set().union(*symbols(build, kept, "-g", "--defined-only").values())
    defined_out = set().union(*symbols(build, left_out, "-g", "--defined-only").values())
    missing = {}
    for obj, needs in symbols(build, kept, "-u").items():
        lost = (needs & defined_out) - defined_kept
        if lost:
            missing[obj] = lost
    return missing


def test_without_the_rdma_headers_the_core_still_links(tmp_path):
    build = build_dir()
    compiles, objects = core_commands(build)
    for definition, (folder, entry, says) in BACK_ENDS.items():
        source = folder + entry
        args = compiles.get(source)
        assert args is not None, f"no compile command for {source} in {build}"
        if f"-D{definition}" not in args:
            pytest.skip(f"{definition} is off in this build: it already builds without them")
        entry_obj = args[args.index("-o") + 1]
        left_out = [o for o in objects if f"/{folder}" in o and o != entry_obj]
        kept = [o for o in objects if o not in left_out and o != entry_obj]
        assert left_out, f"no object of {folder} in the core's archive"
        # As this tree's build has it, the entry point needs its back end: the check can fail.
        assert unresolved(build, kept + [entry_obj], left_out), source
        rebuilt = tmp_path / f"{entry}.o"
        compiled = subprocess.run(
            without_headers(args, definition, rebuilt), cwd=build, capture_output=True, text=True
        )
        assert compiled.returncode == 0, compiled.stderr
        assert compiled.stderr == "", compiled.stderr  # warnings stay off in that build too
        assert unresolved(build, kept + [str(rebuilt)], left_out) == {}
        assert says.encode() in rebuilt.read_bytes()
