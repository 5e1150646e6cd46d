"""Prints the pybind11 include directory the build should use."""

import os

try:
    import torch

    path = os.path.join(os.path.dirname(torch.__file__), "include")
    if not os.path.exists(os.path.join(path, "pybind11", "pybind11.h")):
        raise ImportError
except ImportError:
    import pybind11

    path = pybind11.get_include()
print(path)
