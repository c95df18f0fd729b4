"""What the GPU test files share: torch and a usable GPU, or a skip (a failure where the GPU
machine requires one: DELTACAST_REQUIRE_GPU=1, set by scripts/gpu-tests.sh)."""

from __future__ import annotations

import os

import pytest

import deltacast.cuda as dcc


def require_gpu():
    """torch, once a GPU and deltacast's GPU path are usable; else a skip saying why."""
    try:
        import torch
    except ImportError:
        if os.environ.get("DELTACAST_REQUIRE_GPU") == "1":
            pytest.fail("DELTACAST_REQUIRE_GPU=1 but torch is not installed")
        pytest.skip("torch not installed")
    ok, why = dcc.available()
    if not ok or not torch.cuda.is_available():
        if os.environ.get("DELTACAST_REQUIRE_GPU") == "1":
            pytest.fail(f"DELTACAST_REQUIRE_GPU=1 but {why}")
        pytest.skip(why)
    return torch
