"""The apply through a layout (``layout_apply``) against a naive oracle: every block's elements
copied one by one from its ``sources()`` to its ``destinations()``. The layout is made by hand to
hold what engines do and what makes the plan's levels: a tied slot landing in two parameters,
two interleaved strided blocks of one slot, stacked experts, a second dtype, a slot this rank
holds none of. Random bit patterns (NaN payloads, +-0, subnormals, infinities), random and
empty position sets; on CUDA the Triton kernels and the index_copy_ way are both checked."""

from __future__ import annotations

import numpy as np
import pytest

from engine_case import require

require("torch")

import torch  # noqa: E402

from deltacast.integrations.layout import Block, EngineLayout, LayoutError, ParamLayout  # noqa: E402
from deltacast.integrations import layout_apply as A  # noqa: E402

SLOTS = {
    "embed": (5, 7),  # tied: whole into "embed" and "head"
    "wide": (6, 10),  # this rank holds columns 1..3 and 6..9 of every row
    "e0": (3, 4),  # experts stacked into "experts"
    "e1": (3, 4),
    "norm": (9,),  # float32
    "other": (4, 4),  # another rank's
}


def make_layout() -> EngineLayout:
    params = {
        "embed": ParamLayout((8, 7), [Block("embed", 0, 0, 35)], untouched=21),
        "head": ParamLayout((5, 7), [Block("embed", 0, 0, 35)]),
        "wide": ParamLayout(
            (6, 5), [Block("wide", 1, 0, 2, 6, 10, 5), Block("wide", 6, 2, 3, 6, 10, 5)]
        ),
        "experts": ParamLayout((2, 3, 4), [Block("e0", 0, 0, 12), Block("e1", 0, 12, 12)]),
        "norm": ParamLayout((9,), [Block("norm", 0, 0, 9)]),
    }
    return EngineLayout(0, 2, dict(SLOTS), params)


DTYPES = {"embed": torch.bfloat16, "wide": torch.bfloat16, "e0": torch.bfloat16,
          "e1": torch.bfloat16, "norm": torch.float32, "other": torch.bfloat16}
PDTYPES = {"embed": torch.bfloat16, "head": torch.bfloat16, "wide": torch.bfloat16,
           "experts": torch.bfloat16, "norm": torch.float32}


def ints(dtype):
    return torch.int16 if dtype == torch.bfloat16 else torch.int32


def random_bits(rng, dtype, n):
    """Random bit patterns with the edges forced in: NaNs, +-0, subnormals, infinities."""
    if dtype == torch.bfloat16:
        raw = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
        edges = [0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC1, 0xFF81]
        raw[: min(n, len(edges))] = edges[: min(n, len(edges))]
        return torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16)
    raw = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    edges = [0, 0x80000000, 1, 0x807FFFFF, 0x7F800000, 0x7FC00001, 0xFFA00000]
    raw[: min(n, len(edges))] = edges[: min(n, len(edges))]
    return torch.from_numpy(raw.view(np.int32).copy()).view(torch.float32)


def fresh_params(rng, device):
    return {
        n: random_bits(rng, PDTYPES[n], int(np.prod(p.shape))).reshape(p.shape).to(device)
        for n, p in make_layout().params.items()
    }


def raw(t):
    return t.contiguous().view(-1).view(ints(t.dtype)).cpu()


def naive_apply(layout, params, changes):
    """Element by element: for every block of the slot, every position it holds is copied."""
    for slot, pos, vals in changes:
        new = dict(zip(pos.tolist(), raw(vals).tolist()))
        for pname, b in layout.by_slot()[slot]:
            flat = params[pname].view(-1).view(ints(params[pname].dtype))
            for s, d in zip(b.sources().tolist(), b.destinations().tolist()):
                if s in new:
                    flat[d] = new[s]


def random_changes(rng, device, slots=SLOTS):
    changes = []
    for slot, shape in slots.items():
        n = int(np.prod(shape))
        k = int(rng.choice([0, 1, n // 3, n]))
        pos = torch.from_numpy(rng.choice(n, size=k, replace=False).astype(np.int64))
        changes.append((slot, pos.to(device), random_bits(rng, DTYPES[slot], k).to(device)))
    return changes


def devices():
    out = [pytest.param(("cpu", "torch"), id="cpu")]
    cuda = torch.cuda.is_available()
    why = "no CUDA device here" if not cuda else ""
    for way in ("triton", "torch"):
        out.append(
            pytest.param(("cuda", way), id=f"cuda-{way}", marks=pytest.mark.skipif(not cuda, reason=why))
        )
    return out


@pytest.fixture
def way(request, monkeypatch):
    device, kind = request.param
    if kind == "triton":
        if A._kernels() is None:
            pytest.skip("Triton is not installed here")
        monkeypatch.delenv("DELTACAST_NO_TRITON", raising=False)
    else:
        monkeypatch.setenv("DELTACAST_NO_TRITON", "1")
    return device


@pytest.mark.parametrize("way", devices(), indirect=True)
def test_apply_equals_the_naive_copy_and_read_reads_it_back(way):
    rng = np.random.default_rng(5)
    lay = make_layout()
    for trial in range(6):
        params = fresh_params(rng, way)
        oracle = {n: t.cpu().clone() for n, t in params.items()}
        changes = random_changes(rng, way)
        if trial % 2:  # positions and values from the host, as a receiver holds them
            changes = [(s, p.cpu(), v.cpu()) for s, p, v in changes]
        written = A.apply_deltas(lay, params, changes)
        naive_apply(lay, oracle, [(s, p.cpu(), v.cpu()) for s, p, v in changes])
        for n in params:
            assert torch.equal(raw(params[n]), raw(oracle[n])), (trial, n)
        expect = sum(
            len(set(p.tolist()) & set(b.sources().tolist()))
            for s, p, _ in changes
            for _, b in lay.by_slot()[s]
        )
        assert written == expect
        plan = A.plan_for(lay, params)
        for slot, shape in SLOTS.items():
            n = int(np.prod(shape))
            pos = torch.from_numpy(rng.permutation(n)[: max(1, n // 2)].astype(np.int64))
            old, held = plan.read(params, slot, pos, DTYPES[slot])
            want_old = torch.zeros(pos.numel(), dtype=ints(DTYPES[slot]))
            want_held = torch.zeros(pos.numel(), dtype=torch.bool)
            where = {p: k for k, p in enumerate(pos.tolist())}
            for pname, b in lay.by_slot()[slot]:
                flat = raw(oracle[pname])
                for s, d in zip(b.sources().tolist(), b.destinations().tolist()):
                    if s in where:
                        want_old[where[s]] = flat[d]
                        want_held[where[s]] = True
            assert torch.equal(old, want_old), slot
            assert torch.equal(held, want_held), slot


@pytest.mark.parametrize("way", devices(), indirect=True)
def test_a_bad_change_anywhere_writes_nothing(way):
    rng = np.random.default_rng(8)
    lay = make_layout()
    params = fresh_params(rng, way)
    before = {n: raw(t) for n, t in params.items()}
    good = random_changes(rng, way)
    bad = [
        (("nope", [0], torch.zeros(1, dtype=torch.bfloat16)), "unknown HF slot"),
        (("wide", [60], torch.zeros(1, dtype=torch.bfloat16)), "outside"),
        (("wide", [-1], torch.zeros(1, dtype=torch.bfloat16)), "outside"),
        (("wide", torch.tensor([60], device=way), torch.zeros(1, dtype=torch.bfloat16)), "outside"),
        (("wide", [0, 1], torch.zeros(1, dtype=torch.bfloat16)), "positions but"),
        (("norm", [0], torch.zeros(1, dtype=torch.bfloat16)), "values are"),
    ]
    for change, match in bad:
        with pytest.raises(LayoutError, match=match):
            A.apply_deltas(lay, params, good + [change])
        for n, t in params.items():
            assert torch.equal(raw(t), before[n]), (change[0], n)
    partial = {n: t for n, t in params.items() if n != "head"}
    with pytest.raises(LayoutError, match="not among the parameters"):
        A.apply_deltas(lay, partial, [("embed", [0], torch.zeros(1, dtype=torch.bfloat16))])
    # a slot this rank holds none of: checked, nothing written
    assert A.apply_deltas(lay, params, [("other", [3, 15], torch.ones(2, dtype=torch.bfloat16))]) == 0
    with pytest.raises(LayoutError, match="outside"):
        A.apply_deltas(lay, params, [("other", [16], torch.ones(1, dtype=torch.bfloat16))])


@pytest.mark.parametrize("way", devices(), indirect=True)
def test_joined_changes_land_as_the_listed_ones(way):
    rng = np.random.default_rng(12)
    lay = make_layout()
    params = fresh_params(rng, way)
    listed = {n: t.clone() for n, t in params.items()}
    changes = [c for c in random_changes(rng, way) if c[0] not in ("norm", "other")]
    slots = [s for s, _, _ in changes]
    counts = [p.numel() for _, p, _ in changes]
    pos = torch.cat([p for _, p, _ in changes])
    vals = torch.cat([v for _, _, v in changes])
    assert A.apply_joined(lay, params, slots, counts, pos, vals) == A.apply_deltas(
        lay, listed, changes
    )
    for n in params:
        assert torch.equal(raw(params[n]), raw(listed[n])), n
    before = {n: raw(t) for n, t in params.items()}
    bad_pos = pos.clone()
    if bad_pos.numel():
        bad_pos[-1] = int(np.prod(SLOTS[slots[-1]]))  # one past the last slot's end
        with pytest.raises(LayoutError, match=f"{slots[-1]}: a position outside"):
            A.apply_joined(lay, params, slots, counts, bad_pos, vals)
    with pytest.raises(LayoutError, match="counts adding up"):
        A.apply_joined(lay, params, slots, counts[:-1], pos, vals)
    with pytest.raises(LayoutError, match="one dtype"):
        A.apply_joined(lay, params, ["norm", "wide"], [0, 0], pos[:0], vals[:0])
    for n, t in params.items():
        assert torch.equal(raw(t), before[n]), n


@pytest.mark.parametrize("way", devices(), indirect=True)
def test_reallocated_parameters_get_a_new_plan(way):
    """An engine that replaces its weight tensors (new storage) is written in the new ones; the
    plan holds no reference that would keep the old ones alive."""
    import gc
    import weakref

    rng = np.random.default_rng(9)
    lay = make_layout()
    params = fresh_params(rng, way)
    A.apply_deltas(lay, params, random_changes(rng, way))
    gone = weakref.ref(params["wide"])
    params["wide"] = params["wide"].clone()
    gc.collect()
    assert gone() is None, "the plan kept the old parameter alive"
    oracle = {n: t.cpu().clone() for n, t in params.items()}
    changes = random_changes(rng, way)
    A.apply_deltas(lay, params, changes)
    naive_apply(lay, oracle, [(s, p.cpu(), v.cpu()) for s, p, v in changes])
    for n in params:
        assert torch.equal(raw(params[n]), raw(oracle[n])), n


def test_the_levels_split_overlapping_blocks_only():
    plan = A.ApplyPlan(make_layout(), fresh_params(np.random.default_rng(1), "cpu"))
    bf16 = plan.groups[(torch.bfloat16, torch.device("cpu"))]
    f32 = plan.groups[(torch.float32, torch.device("cpu"))]
    # embed twice (tied) and wide's two interleaved blocks: two levels; e0/e1 fit in the first
    assert len(bf16.levels) == 2 and len(f32.levels) == 1
    assert sum(len(s) for s, _ in bf16.levels) == 6
