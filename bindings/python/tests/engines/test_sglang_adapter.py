"""The deltacast custom weight loader on SGLang's real Qwen2 on a CPU, tensor parallel 1 and 2
(a process per rank, gloo), called by SGLang's own WeightUpdater.update_weights_from_tensor: a
seed and deltas sent by a deltacast Sender over the HF checkpoint leave every rank bit-identical
to load_weights of the full new checkpoint; refused syncs (a corrupted frame, a replayed sync, a
delta to a restarted receiver) leave the weights untouched."""

from __future__ import annotations

import pytest

from engine_case import check_adapter_steps, require, run_adapter

require("sglang")


# Qwen2 in bf16 at TP 1 and 2, Qwen3-MoE in fp32 at TP 2 (its experts stacked and sliced).
CASES = [(1, "qwen2", "bfloat16"), (2, "qwen2", "bfloat16"), (2, "qwen3_moe", "float32")]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"tp{c[0]}-{c[1]}-{c[2]}")
def reports(request, tmp_path_factory):
    tp, arch, dtype = request.param
    work = tmp_path_factory.mktemp(f"sglang-adapter-tp{tp}-{arch}")
    return tp, run_adapter("sglang", tp, work, arch, dtype)


def test_syncs_through_update_weights_from_tensor_equal_load_weights(reports):
    tp, reps = reports
    check_adapter_steps("sglang", tp, reps)
    assert [s["step"] for s in reps[0]["steps"]] == [
        "seed", "delta1", "delta2", "delta3", "corrupted", "after-refusal", "one-rank-refuses",
        "after-group-refusal", "diverged-rank-refuses", "after-divergence",
        "replica-diverged-refuses", "after-replica-divergence",
        "one-rank-write-fails", "after-write-failure", "replayed", "delta-to-restarted", "reseed", "B-joins", "A-delta0", "B-delta0", "A-delta1",
        "B-delta-restarted", "B-reseed", "A-after", "B-after",
    ]
