"""sglang's real Qwen2 and Qwen3-MoE models on a CPU, tensor parallel 1 and 2 (a process per rank,
gloo): the layout learned from sglang's own load_weights, and an apply through it that equals
loading the full new checkpoint, bit for bit, on every rank, bf16 and fp32."""

from __future__ import annotations

import pytest

from engine_case import check, require

require("sglang")


@pytest.mark.parametrize("tp", [1, 2])
def test_layout_apply_equals_load_weights(tp, tmp_path):
    check("sglang", tp, tmp_path)
