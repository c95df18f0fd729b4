"""Sharded trainer ranks (threads) over a Python link: FSDP Shard(0), TP Shard(1), 2-D meshes,
replicas, converters. The leader's frames must rebuild the full model on a receiver."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import deltacast as dc
from deltacast.links import thread_links
from conftest import deliver, perturb, random_array, same_bits

PARAMS = [
    # name, dtype, full shape, converter
    ("embed", "bf16", (50, 16), None),
    ("qkv", "bf16", (24, 16), dc.Converter.fused_qkv("q", "k", "v", [16, 4, 4])),
    ("mlp.up", "f32", (16, 36), None),
    ("norm", "f16", (16,), None),
    ("experts", "bf16", (4, 12, 8), dc.Converter.fused_experts("experts.{e}.gate", "experts.{e}.up")),
    ("tiny", "f8_e4m3", (2, 3), None),  # fewer rows than ranks: empty shards
]


def full_model(rng):
    return {name: random_array(rng, d, shape) for name, d, shape, _ in PARAMS}


def expected_slots(full):
    """What the receiver must hold: the converters applied to the full tensors."""
    out = {}
    for name, _, _, conv in PARAMS:
        a = full[name]
        if name == "qkv":
            out["q"], out["k"], out["v"] = a[:16], a[16:20], a[20:]
        elif name == "experts":
            for e in range(a.shape[0]):
                out[f"experts.{e}.gate"], out[f"experts.{e}.up"] = a[e, :6], a[e, 6:]
        else:
            out[name] = a
    return out


def chunk(n, k, c):
    """torch's Shard arithmetic: ceil(n/k) per piece, trailing pieces short or empty."""
    size = -(-n // k)
    start = min(size * c, n)
    return start, max(0, min(n, start + size) - start)


def local_piece(full, layout):
    if layout is None:
        return np.ascontiguousarray(full)
    index = tuple(slice(o, o + s) for o, s in zip(layout.offset, layout.local_shape))
    return np.ascontiguousarray(full[index])


def run_world(links, fn):
    """Runs fn(rank) on one thread per rank; a failing rank breaks the others' collectives
    so they raise instead of waiting."""

    def guarded(rank):
        try:
            return fn(rank)
        except BaseException:
            links[rank].abort()
            raise

    with ThreadPoolExecutor(len(links)) as ex:
        futures = [ex.submit(guarded, r) for r in range(len(links))]
        return [f.result() for f in futures]


def params():
    return [dc.Param(n, d, s, c) for n, d, s, c in PARAMS]


def fsdp_layouts(world, rank):
    """FSDP: Shard(0) on a 1-D mesh; the norm is replicated (every rank holds it whole)."""
    return {
        name: None if name == "norm" else dc.Layout([world], [rank], ["S(0)"], list(shape))
        for name, _, shape, _ in PARAMS
    }


def tp_layouts(world, rank):
    """TP: rows or columns split; experts split by expert (EP)."""
    spec = {"embed": "Shard(dim=0)", "qkv": "S(0)", "mlp.up": "S(1)", "experts": ("S", 0), "tiny": "S(1)"}
    return {
        name: dc.Layout([world], [rank], [spec[name]], list(shape)) if name in spec else None
        for name, _, shape, _ in PARAMS
    }


def mesh2d_layouts(world, rank):
    """A (2, 2) mesh: HSDP (replicate × shard), FSDP × TP, and FSDP2 over TP (_StridedShard)."""
    assert world == 4
    coords = [rank // 2, rank % 2]
    spec = {
        "embed": ["R", "S(0)"],
        "qkv": ["_S(0, 2)", "S(0)"],
        "mlp.up": ["S(0)", "S(1)"],
        "norm": ["R", "R"],
        "experts": ["S(0)", "S(1)"],
        "tiny": ["S(1)", "S(0)"],
    }
    return {
        name: dc.Layout([2, 2], coords, spec[name], list(shape)) for name, _, shape, _ in PARAMS
    }


@pytest.mark.parametrize(
    "world,layouts",
    [(2, fsdp_layouts), (4, fsdp_layouts), (2, tp_layouts), (3, tp_layouts), (4, mesh2d_layouts)],
    ids=["fsdp2", "fsdp4", "tp2", "tp3", "mesh2x2"],
)
def test_sharded_ranks_rebuild_the_model(rng, world, layouts):
    full = full_model(rng)
    links = thread_links(world, timeout=30)
    per_rank = [layouts(world, r) for r in range(world)]
    senders = [
        dc.RankSender(params(), per_rank[r], links[r], bucket_size=4096, chunk_elems=64,
                      round_bytes=2048)
        for r in range(world)
    ]
    table = senders[0].table
    assert all(s.table == table for s in senders)
    assert table == dc.SlotTable.from_params(params())
    assert "experts.3.up" in table and "q" in table and "qkv" not in table

    # The Python oracle agrees with the layouts on plain Shard placements.
    for r in range(world):
        for name, layout in per_rank[r].items():
            if layout is not None and len(layout.mesh_shape) == 1:
                dim = int(layout.placements[0][2])
                start, size = chunk(layout.global_shape[dim], world, r)
                assert layout.local_shape[dim] == size
                assert size == 0 or layout.offset[dim] == start
        assert senders[r].local_shapes == {
            n: (list(per_rank[r][n].local_shape) if per_rank[r].get(n) else list(s))
            for n, _, s, _ in PARAMS
        }

    dst = table.zeros()
    receiver = dc.Receiver(table, dst)
    for step in range(4):
        if step:
            for a in full.values():
                perturb(rng, a, 0.05)

        def sync(rank):
            local = {name: local_piece(full[name], per_rank[rank][name]) for name in full}
            return senders[rank].sync(local)

        results = run_world(links, sync)
        lead = results[0]
        assert lead.is_leader and lead.frames and lead.flushes == len(lead.frames)
        assert all(not r.is_leader and r.frames == [] for r in results[1:])
        assert {r.kind for r in results} == {"seed" if step == 0 else "delta"}
        assert {r.version for r in results} == {step + 1}
        assert {r.changed for r in results} == {lead.changed}
        assert sum(r.local_changed for r in results) == lead.changed
        if step == 0:
            assert lead.changed == table.total_elements
        outcome = deliver(receiver, lead.frames)
        assert outcome.state_digest == lead.state_digest
        for name, want in expected_slots(full).items():
            assert same_bits(dst[name], want), (step, name)


def test_world_of_one_with_converters(rng):
    full = full_model(rng)
    sender = dc.RankSender(params())  # no link: a world of one
    assert (sender.rank, sender.world) == (0, 1)
    receiver = dc.Receiver(sender.table, sender.table.zeros())
    for step in range(3):
        if step:
            perturb(rng, full["qkv"], 0.1)
        result = sender.sync([full[n] for n, *_ in PARAMS])
        deliver(receiver, result.frames)
    for name, want in expected_slots(full).items():
        assert same_bits(receiver.arrays[name], want)
    # The state every sender shares: the receiver's digests, version, request_seed.
    assert sender.version == receiver.version == 3
    assert sender.digests == receiver.digests
    assert sender.state_digest == receiver.state_digest
    sender.request_seed()
    assert sender.sync([full[n] for n, *_ in PARAMS]).kind == "seed"
    numpy_frames = dc.RankSender(params(), frame_type="numpy").sync(full)
    assert all(isinstance(f, np.ndarray) for f in numpy_frames.frames)
    deltacast_seed = dc.Receiver(sender.table, sender.table.zeros())
    deliver(deltacast_seed, numpy_frames.frames)


class FlakyLink:
    """Wraps a link; once armed, rank 1's second all_gather raises (mid-sync)."""

    def __init__(self, inner):
        self.inner, self.armed, self.calls = inner, False, 0
        self.rank, self.world = inner.rank, inner.world

    def all_gather(self, data):
        if self.armed and self.rank == 1:
            self.calls += 1
            if self.calls == 2:
                self.armed = False
                raise ConnectionError("rank 1 lost its network")
        return self.inner.all_gather(data)

    def send_to_leader(self, data):
        return self.inner.send_to_leader(data)

    def recv_from(self, rank, nbytes):
        return self.inner.recv_from(rank, nbytes)

    def abort(self):
        self.inner.abort()


def test_link_failure_surfaces_and_next_sync_is_a_seed(rng):
    world = 2
    full = full_model(rng)
    raw = thread_links(world, timeout=30)
    links = [FlakyLink(l) for l in raw]
    per_rank = [fsdp_layouts(world, r) for r in range(world)]
    senders = [dc.RankSender(params(), per_rank[r], links[r], bucket_size=4096, round_bytes=1024)
               for r in range(world)]

    def sync(rank):
        local = {name: local_piece(full[name], per_rank[rank][name]) for name in full}
        return senders[rank].sync(local)

    receiver = dc.Receiver(senders[0].table, senders[0].table.zeros())
    deliver(receiver, run_world(links, sync)[0].frames)
    perturb(rng, full["embed"], 0.1)
    links[1].armed = True
    errors = []

    def failing(rank):
        try:
            return sync(rank)
        except Exception as e:  # each rank's own exception
            errors.append((rank, e))
            links[rank].abort()
            return None

    run_world(links, failing)
    by_rank = dict(errors)
    assert isinstance(by_rank[1], ConnectionError)  # the link's own exception, as raised
    assert isinstance(by_rank[0], (TimeoutError, dc.DeltacastError))
    raw[0].reset()
    results = run_world(links, sync)
    assert {r.kind for r in results} == {"seed"}
    deliver(receiver, results[0].frames)
    for name, want in expected_slots(full).items():
        assert same_bits(receiver.arrays[name], want)


def test_layout_parsing_and_errors():
    lay = dc.Layout([2, 2], [1, 0], ["_StridedShard(dim=0, sf=2)", "Shard(dim=0)"], [8, 4])
    assert lay.placements == ["_S(0, 2)", "S(0)"]
    assert dc.Layout([2], [1], ["Replicate()"], [3]).is_replica
    assert not dc.Layout([2], [0], ["R"], [3]).is_replica
    assert dc.Layout([4], [3], ["S(0)"], [2, 5]).local_shape == [0, 5]
    with pytest.raises(dc.InvalidArgumentError):
        dc.Layout([2], [0], ["P(sum)"], [4])  # a pending reduction is not a weight
    with pytest.raises(dc.InvalidArgumentError):
        dc.Layout([2], None, ["S(0)"], [4])
    with pytest.raises(dc.InvalidArgumentError):
        dc.Layout([2], [0], ["X(0)"], [4])
    with pytest.raises(dc.InvalidArgumentError):
        dc.Layout([2], [0], ["S(2)"], [4])
    with pytest.raises(dc.InvalidArgumentError):
        dc.Param("w", "bf16", (5, 4), dc.Converter.fused_qkv("q", "k", "v", [2, 2, 2]))
    with pytest.raises(dc.InvalidArgumentError, match="unknown parameter"):
        dc.RankSender(params(), {"nope": None})
    sender = dc.RankSender(params())
    with pytest.raises(dc.SlotMismatchError):
        sender.sync({n: np.zeros(1, np.uint16) for n, *_ in PARAMS})
