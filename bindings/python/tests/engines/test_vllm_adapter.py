"""The "deltacast" vLLM weight-transfer backend on vLLM's real Qwen2 on a CPU, tensor parallel 1
and 2 (a process per rank, gloo): vLLM's own plugin loading registers it and its factory builds
it; a seed and deltas sent by a deltacast Sender over the HF checkpoint arrive through the
engine's lifecycle calls and leave every rank bit-identical to load_weights of the full new
checkpoint; refused syncs (a corrupted frame, a replayed sync, a delta to a restarted worker, a
session that ends mid-sync) leave the weights untouched."""

from __future__ import annotations

import pytest

from engine_case import check_adapter_steps, require, run_adapter

require("vllm")


# Qwen2 in bf16 at TP 1 and 2, Qwen3-MoE in fp32 at TP 2 (its experts stacked and sliced).
CASES = [(1, "qwen2", "bfloat16"), (2, "qwen2", "bfloat16"), (2, "qwen3_moe", "float32")]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"tp{c[0]}-{c[1]}-{c[2]}")
def reports(request, tmp_path_factory):
    tp, arch, dtype = request.param
    work = tmp_path_factory.mktemp(f"vllm-adapter-tp{tp}-{arch}")
    return tp, run_adapter("vllm", tp, work, arch, dtype)


def test_plugin_loading_registers_the_backend(reports):
    _, reps = reports
    for rep in reps:
        assert not rep["registered_before_plugins"], "registered before vLLM loaded plugins"
        assert rep["registered_after_plugins"]
        assert rep["engine_class"] == "DeltacastWeightTransferEngine" and rep["is_ours"]
        # Each rank learned its own layout (a fresh cache) at init, then reused it.
        assert rep["layout_from_cache"] is False


def test_syncs_through_the_lifecycle_equal_load_weights(reports):
    tp, reps = reports
    check_adapter_steps("vllm", tp, reps)
    assert [s["step"] for s in reps[0]["steps"]] == [
        "seed", "delta1", "delta2", "delta3", "corrupted", "incomplete", "after-refusal",
        "one-rank-refuses", "after-group-refusal", "diverged-rank-refuses", "after-divergence",
        "replica-diverged-refuses", "after-replica-divergence",
        "one-rank-write-fails", "after-write-failure", "replayed", "delta-to-restarted", "reseed", "B-joins", "A-delta0", "B-delta0", "A-delta1",
        "B-delta-restarted", "B-reseed", "A-after", "B-after",
    ]


def test_a_sync_lands_at_finish_weight_update(reports):
    """Stage, then commit: update_weights verifies, finish_weight_update writes."""
    _, reps = reports
    for rep in reps:
        landed = [s for s in rep["steps"] if s["expect_error"] is None]
        assert landed and all(s["changed_before_finish"] is False for s in landed), landed
