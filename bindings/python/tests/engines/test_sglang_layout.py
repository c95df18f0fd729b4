"""sglang's real Qwen2 and Qwen3-MoE models on a CPU, tensor parallel 1 and 2 (a process per rank,
gloo): the layout learned from sglang's own load_weights, and an apply through it that equals
loading the full new checkpoint, bit for bit, on every rank, bf16 and fp32; and whether the
engine's post-load step keeps the parameters the layout describes."""

from __future__ import annotations

import pytest

from engine_case import ARCHS, check_apply, check_post_load, require, run_ranks

require("sglang")


@pytest.fixture(scope="module", params=[1, 2], ids=lambda tp: f"tp{tp}")
def ranks(request, tmp_path_factory):
    tp = request.param
    workdir = tmp_path_factory.mktemp(f"sglang-tp{tp}")
    return tp, workdir, run_ranks("sglang", tp, workdir)


def test_apply_through_the_layout_equals_load_weights(ranks):
    tp, workdir, results = ranks
    check_apply("sglang", tp, workdir, results)


@pytest.mark.parametrize("arch", ARCHS)
def test_post_load_step_keeps_the_parameters(ranks, arch):
    tp, _, results = ranks
    check_post_load("sglang", tp, results, arch)
