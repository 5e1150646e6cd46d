"""Prints one fact the torch extension module must be built with, as a CMake list:
``include`` (header directories), ``libdir``, ``cxx11abi`` (0 or 1) or ``flags`` (pybind11 ABI
defines that torch < 2.7 needs to share its pybind11 internals). Exits with status 1 when torch
cannot be imported."""

import sys
import warnings

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:
    sys.exit(1)


def pybind11_abi_flags() -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(cpp_extension, "_get_pybind11_abi_build_flags", list)()


FACTS = {
    "include": lambda: cpp_extension.include_paths(),
    "libdir": lambda: cpp_extension.library_paths(),
    "cxx11abi": lambda: [str(int(torch._C._GLIBCXX_USE_CXX11_ABI))],
    "flags": pybind11_abi_flags,
}

print(";".join(FACTS[sys.argv[1]]()))
