"""Prints the NCCL of the ``nvidia-nccl-cu13`` wheel as a CMake list: its include directory and
the full path of ``libnccl.so.2``. Exits with status 1 when the wheel is not installed (the build
then looks for a system NCCL)."""

import importlib.util
import os
import sys

try:
    spec = importlib.util.find_spec("nvidia.nccl")
except ImportError:  # no "nvidia" namespace package at all
    spec = None
for root in spec.submodule_search_locations if spec else []:
    include = os.path.join(root, "include")
    library = os.path.join(root, "lib", "libnccl.so.2")
    if os.path.exists(os.path.join(include, "nccl.h")) and os.path.exists(library):
        print(f"{include};{library}")
        sys.exit(0)
sys.exit(1)
