"""The layout probe on small torch modules with hand-made loaders: what it learns equals what the
loader does (checked by loading random checkpoints, the loader being the oracle), and what it
cannot express it refuses: value transforms, elements written twice, sign or NaN changes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine_case import require

require("torch")

import torch  # noqa: E402

from deltacast.integrations import layout as L  # noqa: E402
from deltacast.integrations import layout_apply as A  # noqa: E402

H, V, VPAD = 6, 11, 16
HF = {
    "embed.weight": (V, H),
    "q.weight": (4, H),
    "k.weight": (2, H),
    "v.weight": (2, H),
    "o.weight": (H, 4),
    "norm.weight": (H,),
    "experts.0.w": (3, H),
    "experts.1.w": (3, H),
}


class Toy(torch.nn.Module):
    """A fused, sliced, stacked, padded model on rank `rank` of `world`, as engines do it."""

    def __init__(self, rank=0, world=1, transform=None, dtype=torch.float32):
        super().__init__()
        self.rank, self.world, self.transform = rank, world, transform or (lambda n, t: t)
        rows = VPAD // world
        self.embed = torch.nn.Parameter(torch.zeros(rows, H, dtype=dtype))
        self.qkv = torch.nn.Parameter(torch.zeros(8 // world, H, dtype=dtype))
        self.o = torch.nn.Parameter(torch.zeros(H, 4 // world, dtype=dtype))
        self.norm = torch.nn.Parameter(torch.zeros(H, dtype=dtype))
        self.experts = torch.nn.Parameter(torch.zeros(2, H, 3, dtype=dtype))  # transposed
        self.unused = torch.nn.Parameter(torch.zeros(5, dtype=dtype))

    def load_weights(self, named):
        r, w = self.rank, self.world
        with torch.no_grad():
            for name, t in named:
                t = self.transform(name, t)
                if name == "embed.weight":
                    rows = VPAD // w
                    part = t[r * rows : min(V, (r + 1) * rows)]
                    self.embed[: part.shape[0]].copy_(part)
                    self.embed[part.shape[0] :].fill_(0)  # padding: written, from no HF element
                elif name[0] in "qkv" and name[1] == ".":
                    off, n = {"q": (0, 4), "k": (4, 2), "v": (6, 2)}[name[0]]
                    share = n // w
                    self.qkv[off // w : off // w + share].copy_(t[r * share : (r + 1) * share])
                elif name == "o.weight":
                    c = 4 // w
                    self.o.copy_(t[:, r * c : (r + 1) * c])
                elif name == "norm.weight":
                    self.norm.copy_(t)
                elif name.startswith("experts."):
                    self.experts[int(name.split(".")[1])].copy_(t.t())


def random_checkpoint(rng, dtype):
    bits = {torch.float32: np.uint32, torch.bfloat16: np.uint16}[dtype]
    out = {}
    for n, s in HF.items():
        raw = rng.integers(0, np.iinfo(bits).max, size=int(np.prod(s)), dtype=bits, endpoint=True)
        t = torch.from_numpy(raw.view(np.int32 if bits is np.uint32 else np.int16).copy())
        out[n] = t.view(dtype).reshape(s)
    return out


def raw(t):
    return (
        t.detach().reshape(-1).view(torch.int32 if t.element_size() == 4 else torch.int16).clone()
    )


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_through_the_learned_layout_equals_the_loader(world, dtype, monkeypatch):
    monkeypatch.setattr(L, "DIGIT_BITS", 3)  # several position passes even for tiny slots
    rng = np.random.default_rng(7)
    for rank in range(world):
        lay = L.learn_layout(Toy(rank, world), HF, rank=rank, world=world)
        lay = L.EngineLayout.from_json(json.loads(json.dumps(lay.to_json())))
        js = lay.to_json()["params"]
        assert js["unused"]["untouched"] == 5 and js["unused"]["blocks"] == []
        assert js["norm"]["replicated"] and not js["qkv"]["replicated"] or world == 1
        assert js["embed"]["constant"] == ((VPAD - V) * H if rank == world - 1 else 0)
        # The column split folds into one strided block per rank.
        assert len(js["o"]["blocks"]) == 1 and js["o"]["blocks"][0]["count"] == (
            H if world > 1 else 1
        )
        for _ in range(3):
            base, new = random_checkpoint(rng, dtype), None
            new = {n: t.clone() for n, t in base.items()}
            model = Toy(rank, world, dtype=dtype)
            model.load_weights(base.items())
            start = {p: t.detach().clone() for p, t in model.named_parameters()}
            params = dict(model.named_parameters())
            for n, t in new.items():
                k = int(rng.integers(0, t.numel() + 1))
                pos = torch.from_numpy(
                    rng.choice(t.numel(), size=k, replace=False).astype(np.int64)
                )
                vals = random_checkpoint(rng, dtype)[n].reshape(-1)[:k]
                t.view(-1)[pos] = vals
                A.apply_delta(lay, params, n, pos, vals)
            got = {p: raw(t) for p, t in params.items()}
            oracle = Toy(rank, world, dtype=dtype)
            with torch.no_grad():
                for p, t in oracle.named_parameters():
                    t.copy_(start[p])
            oracle.load_weights(new.items())
            for p, t in oracle.named_parameters():
                assert torch.equal(got[p], raw(t)), (rank, p)


def test_a_scaling_loader_is_refused():
    with pytest.raises(L.LayoutError, match="encode no HF element"):
        L.learn_layout(Toy(transform=lambda n, t: t * 2 if n == "o.weight" else t), HF)


def test_a_loader_that_adds_zero_is_refused_by_the_bit_pattern_pass():
    # x + 0.0 keeps every probe code but turns -0.0 into +0.0 and quiets signalling NaNs.
    with pytest.raises(L.LayoutError, match="changes values"):
        L.learn_layout(Toy(transform=lambda n, t: t + 0.0 if n == "norm.weight" else t), HF)


def test_an_element_landing_twice_is_refused():
    class Twice(Toy):
        def load_weights(self, named):
            named = list(named)
            super().load_weights(named)
            with torch.no_grad():
                self.unused.copy_(dict(named)["norm.weight"][:5])

    with pytest.raises(L.LayoutError, match="lands 2 times"):
        L.learn_layout(Twice(), HF)


def test_a_non_float32_probe_model_is_refused():
    with pytest.raises(L.LayoutError, match="float32"):
        L.learn_layout(Toy(dtype=torch.bfloat16), HF)


def test_apply_refuses_what_it_cannot_place():
    model = Toy()
    lay = L.learn_layout(model, HF)
    params = dict(model.named_parameters())
    with pytest.raises(L.LayoutError, match="unknown HF slot"):
        A.apply_delta(lay, params, "nope", [0], torch.zeros(1))
    with pytest.raises(L.LayoutError, match="outside"):
        A.apply_delta(lay, params, "norm.weight", [H], torch.zeros(1))
    with pytest.raises(L.LayoutError, match="values are"):
        A.apply_delta(lay, params, "norm.weight", [0], torch.zeros(1, dtype=torch.float64))


def test_the_cache_returns_what_was_learned(tmp_path):
    key = {"engine": "toy", "rank": 0, "world": 1, "config": {"h": H}}
    calls = []

    def learn():
        calls.append(1)
        return L.learn_layout(Toy(), HF)

    a, hit_a = L.cached_layout(key, learn, tmp_path)
    b, hit_b = L.cached_layout(key, learn, tmp_path)
    c, hit_c = L.cached_layout(dict(key, rank=1), learn, tmp_path)
    assert (hit_a, hit_b, hit_c) == (False, True, False) and len(calls) == 2
    assert a.to_json() == b.to_json()


def test_a_layout_read_from_outside_is_checked():
    good = L.learn_layout(Toy(), HF).to_json()
    L.EngineLayout.from_json(good)
    for field, value in (("src_stride", 0), ("len", 0), ("dst", 10**6), ("src", -1)):
        bad = json.loads(json.dumps(good))
        block = bad["params"]["o"]["blocks"][0]
        block.update({"count": 2, "src_stride": 8, "dst_stride": 4, "len": 4, "src": 0, "dst": 0})
        L.EngineLayout.from_json(bad)  # two runs of o's four columns: fits
        block[field] = value
        with pytest.raises(L.LayoutError, match="does not fit"):
            L.EngineLayout.from_json(bad)
    bad = json.loads(json.dumps(good))
    bad["format"] = 99
    with pytest.raises(L.LayoutError, match="format"):
        L.EngineLayout.from_json(bad)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_slot_equals_the_loader_and_apply_delta(world, dtype):
    """A whole slot written by strided block copies lands where the loader puts it, and where
    apply_delta with every position of the slot puts it."""
    rng = np.random.default_rng(11)
    for rank in range(world):
        lay = L.learn_layout(Toy(rank, world), HF, rank=rank, world=world)
        base, new = random_checkpoint(rng, dtype), random_checkpoint(rng, dtype)
        models = [Toy(rank, world, dtype=dtype) for _ in range(3)]
        for m in models:
            m.load_weights(base.items())
        by_slot, by_pos, oracle = (dict(m.named_parameters()) for m in models)
        for n, t in new.items():
            assert A.apply_slot(lay, by_slot, n, t) == A.apply_delta(
                lay, by_pos, n, torch.arange(t.numel()), t.reshape(-1)
            )
        models[2].load_weights(new.items())
        for p in oracle:
            assert torch.equal(raw(by_slot[p]), raw(oracle[p])), (rank, p)
            assert torch.equal(raw(by_pos[p]), raw(oracle[p])), (rank, p)
    with pytest.raises(L.LayoutError, match="values for a slot"):
        A.apply_slot(lay, by_slot, "norm.weight", torch.zeros(H + 1, dtype=dtype))


def _bits(t):
    """A checkpoint tensor as the numpy bits a deltacast Sender takes (bf16 as uint16)."""
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


@pytest.mark.parametrize("world", [1])
def test_layout_receiver_lands_syncs_as_the_loader_and_refuses_all_or_nothing(world):
    """Sender -> frames -> LayoutReceiver on the toy engine, against the loader: a seed,
    deltas, then a corrupted frame and a replayed sync that change nothing. (TP 2 needs a
    process group per rank: the engine adapter tests run it over gloo, a process per rank.)"""
    import deltacast
    from deltacast.integrations.engine_receiver import LayoutReceiver

    dtype = torch.bfloat16
    rng = np.random.default_rng(13)
    table = deltacast.SlotTable([(n, "bf16", s) for n, s in HF.items()])
    sender = deltacast.Sender(table)  # one frame per sync: the engine tests do several
    ranks = []
    for rank in range(world):
        lay = L.learn_layout(Toy(rank, world), HF, rank=rank, world=world)
        model, oracle = Toy(rank, world, dtype=dtype), Toy(rank, world, dtype=dtype)
        ranks.append((model, oracle, LayoutReceiver(table, lay, dict(model.named_parameters()))))
    ckpt = random_checkpoint(rng, dtype)
    syncs = []
    for step in range(4):
        if step:
            for k, t in enumerate(ckpt.values()):
                if (k + step) % 3:
                    flat = t.view(-1)
                    pos = torch.from_numpy(rng.choice(flat.numel(), size=2, replace=False))
                    flat[pos] = random_checkpoint(rng, dtype)["norm.weight"][:2]
        result = sender.sync({n: _bits(t) for n, t in ckpt.items()})
        assert result.kind == ("seed" if step == 0 else "delta")
        syncs.append(result.frames)
        for model, oracle, rx in ranks:
            outcomes = rx.receive_all(result.frames)
            assert [o.version for o in outcomes] == [step + 1]
            oracle.load_weights(ckpt.items())
            for (p, a), b in zip(model.named_parameters(), oracle.parameters()):
                assert torch.equal(raw(a), raw(b)), (step, p)
    next_ckpt = {n: t.clone() for n, t in ckpt.items()}
    next_ckpt["norm.weight"].view(-1)[0] = 7.0
    frames = [bytes(f) for f in sender.sync({n: _bits(t) for n, t in next_ckpt.items()}).frames]
    frames[-1] = frames[-1][:-1] + bytes([frames[-1][-1] ^ 1])
    refusals = ((frames, deltacast.MalformedFrameError), (syncs[1], deltacast.VersionMismatchError))
    for bad, err in refusals:
        for model, _, rx in ranks:
            before = {p: raw(t) for p, t in model.named_parameters()}
            with pytest.raises(err):
                rx.receive_all(bad)
            assert not rx.is_staging and rx.version == 4
            assert all(torch.equal(raw(t), before[p]) for p, t in model.named_parameters())


def test_layout_receiver_refuses_a_table_the_engine_cannot_hold():
    import deltacast
    from deltacast.integrations.engine_receiver import LayoutReceiver

    lay = L.learn_layout(Toy(), HF)
    params = dict(Toy(dtype=torch.bfloat16).named_parameters())
    ok = [(n, "bf16", s) for n, s in HF.items()]
    LayoutReceiver(deltacast.SlotTable(ok), lay, params)
    for bad, match in (
        ([(n, "f32", s) for n, s in HF.items()], "send the engine's dtype"),
        (ok + [("extra.weight", "bf16", (2,))], "not in the engine's layout"),
        ([(n, "bf16", (1,) + tuple(s)) for n, s in HF.items()], "shape"),
    ):
        with pytest.raises(L.LayoutError, match=match):
            LayoutReceiver(deltacast.SlotTable(bad), lay, params)


def test_the_engine_receiver_is_the_host_one_where_the_gpu_one_cannot_serve(monkeypatch):
    """``engine_receiver`` (what the vLLM and SGLang adapters call): parameters on the CPU or a
    TP rank get ``LayoutReceiver``, and ``DELTACAST_ENGINE_RECEIVER=gpu`` refuses them with the
    reason. (The GPU choice itself is tested on the device: test_cuda_engine.py.)"""
    import deltacast
    from deltacast.integrations.engine_receiver import LayoutReceiver
    from deltacast.integrations.gpu_layout_receiver import engine_receiver

    table = deltacast.SlotTable([(n, "bf16", s) for n, s in HF.items()])
    for rank, world, why in ((0, 1, "parameters on \\['cpu'\\]"), (1, 2, "rank 1 of 2")):
        lay = L.learn_layout(Toy(rank, world), HF, rank=rank, world=world)
        params = dict(Toy(rank, world, dtype=torch.bfloat16).named_parameters())
        for want in ("auto", "host"):
            monkeypatch.setenv("DELTACAST_ENGINE_RECEIVER", want)
            if world > 1:
                # The host receiver, which asks for the TP group.
                with pytest.raises(L.LayoutError, match="needs its TP group"):
                    engine_receiver(table, lay, params)
                continue
            rx = engine_receiver(table, lay, params, commit_on_demand=True)
            assert type(rx) is LayoutReceiver and rx.commit_on_demand
        monkeypatch.setenv("DELTACAST_ENGINE_RECEIVER", "gpu")
        with pytest.raises(L.LayoutError, match=why):
            engine_receiver(table, lay, params)
    monkeypatch.setenv("DELTACAST_ENGINE_RECEIVER", "fast")
    with pytest.raises(ValueError, match="auto, host or gpu"):
        engine_receiver(table, lay, params)
