"""Turns what a caller passes for a slot into a numpy array without copying it.

Called by the extension only for objects that are not numpy arrays already. A copy is never
made: for a receiver it would silently take the writes meant for the caller's tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def as_array(obj: Any) -> np.ndarray:
    """A zero-copy numpy view of ``obj`` (a CPU torch tensor), or TypeError."""
    module = type(obj).__module__ or ""
    if module.startswith("torch"):
        from .torch import to_numpy

        return to_numpy(obj)
    raise TypeError(
        f"expected a numpy array or a CPU torch tensor, got {type(obj).__module__}."
        f"{type(obj).__qualname__} (deltacast reads and writes arrays in place and never "
        "copies them; pass np.asarray(x) yourself to a sender if a copy is fine)"
    )
