"""Whether weft's build has NCCL, as weft.cuda.nccl_version() says: without a GPU. A CUDA build
made with the nvidia-nccl-cu13 wheel installed links the wheel's libnccl, and the version
weft reports is the wheel's (unless torch with CUDA loaded its own NCCL first, which weft then
shares). Without CUDA there is no NCCL. The errors of a build or world that cannot use NCCL
need CUDA tensors, hence a GPU: tests/test_gpu_nccl.py checks them."""

from __future__ import annotations

import importlib.metadata
import re

import pytest
import torch
import weft.cuda


def wheel_version() -> str | None:
    try:
        return importlib.metadata.version("nvidia-nccl-cu13")
    except importlib.metadata.PackageNotFoundError:
        return None


def test_no_nccl_without_cuda():
    if weft.cuda.is_built():
        pytest.skip("weft was built with CUDA")
    assert weft.cuda.nccl_version() is None


def test_cuda_build_links_the_wheels_nccl():
    if not weft.cuda.is_built():
        pytest.skip("weft was built without CUDA")
    wheel = wheel_version()
    if wheel is None:
        pytest.skip("no nvidia-nccl-cu13 wheel: the build looked for a system NCCL")
    version = weft.cuda.nccl_version()
    assert version is not None, "a CUDA build with the NCCL wheel installed has no NCCL"
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    if torch.version.cuda is None:  # no other NCCL in this process
        assert version == ".".join(wheel.split(".")[:3])
