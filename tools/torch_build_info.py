"""Prints one fact the torch extension module must be built with, as a CMake list:
``include`` (header directories), ``libdir``, ``cxx11abi`` (0 or 1), ``defines`` (the pybind11
ABI macros that torch < 2.7 needs to share its pybind11 internals, as NAME="value") or
``libstdcxx`` (the shared libstdc++ torch's process loaded, empty where none is found). Exits
with status 1 when torch cannot be imported."""

import sys
import warnings

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:
    sys.exit(1)


def pybind11_abi_defines() -> list:
    """torch gives them as shell-escaped compiler flags (-DNAME=\\"value\\")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flags = getattr(cpp_extension, "_get_pybind11_abi_build_flags", list)()
    return [f.removeprefix("-D").replace('\\"', '"') for f in flags]


def loaded_libstdcxx() -> list:
    """The modules link this very file, so that they share torch's libstdc++ even where the
    compiler has only a static one (some GCC builds ship libstdc++.a alone)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libstdc++.so" in line}
    except OSError:
        return []
    return sorted(paths)[:1]


FACTS = {
    "include": lambda: cpp_extension.include_paths(),
    "libdir": lambda: cpp_extension.library_paths(),
    "cxx11abi": lambda: [str(int(torch._C._GLIBCXX_USE_CXX11_ABI))],
    "defines": pybind11_abi_defines,
    "libstdcxx": loaded_libstdcxx,
}

print(";".join(FACTS[sys.argv[1]]()))
