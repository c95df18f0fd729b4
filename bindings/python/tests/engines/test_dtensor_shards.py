"""``deltacast.cuda.dtensor_shards`` on 2-D meshes (issue 26): four gloo processes on the CPU
build real DTensors with torch's ``distribute_tensor`` and hand them to ``dtensor_shards``. The
oracle is the full tensor each rank started from: the runs the ranks report, taken in rank
order, must tile its flattened elements exactly (replicas sending nothing), and a block that is
not one run must be refused on every rank with its name.

Runs in the vLLM venv (torch from PyPI), on the CPU."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

WORLD = 4
# name -> (global shape, placements on the 2x2 mesh; None: a plain tensor)
CASES = {
    "hsdp": ((10, 6), ("R", "S0")),
    "hsdp_fewer_rows": ((1, 5), ("R", "S0")),
    "shard_shard": ((9, 4), ("S0", "S0")),
    "vector": ((7,), ("S0", "R")),
    "plain": ((3, 3), None),
    "row_then_column": ((4, 6), ("S0", "S1")),
    "columns": ((4, 6), ("R", "S1")),
}
REFUSED = {"row_then_column", "columns"}


def _placement(code):
    from torch.distributed.tensor import Replicate, Shard

    return Replicate() if code == "R" else Shard(int(code[1:]))


def _rank(rank, port, queue):
    try:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import distribute_tensor

        import deltacast.cuda as dcc

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
        mesh = init_device_mesh("cpu", (2, 2))
        out = {}
        for name, (shape, placements) in CASES.items():
            # The same random full tensor on every rank (one seed per case), with ±0, a NaN
            # payload and a subnormal among the bits.
            gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            full = torch.randn(shape, generator=gen).to(torch.bfloat16)
            bits = full.view(torch.int16).view(-1)
            bits[0] = -32768  # -0.0
            bits[-1] = 0x7FC1  # a NaN payload
            if bits.numel() > 2:
                bits[1] = 1  # a subnormal
            t = full if placements is None else distribute_tensor(full, mesh, [_placement(p) for p in placements])
            try:
                ((n, local, full_shape, first),) = dcc.dtensor_shards([(name, t)], rank=rank)
                out[name] = ("ok", first, local.view(torch.int16).numpy().copy(), list(full_shape),
                             full.view(torch.int16).reshape(-1).numpy().copy())
            except Exception as e:  # noqa: BLE001 - reported to the parent
                out[name] = ("refused", type(e).__name__, str(e))
        dist.destroy_process_group()
        queue.put((rank, out))
    except Exception:  # noqa: BLE001
        queue.put((rank, traceback.format_exc()))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dtensor_shards_tile_every_tensor_on_a_2d_mesh():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = {}
    for _ in range(WORLD):
        rank, out = queue.get(timeout=240)
        assert not isinstance(out, str), f"rank {rank}:\n{out}"
        results[rank] = out
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for name, (shape, _) in CASES.items():
        if name in REFUSED:
            for r in range(WORLD):
                kind, err, msg = results[r][name]
                assert kind == "refused" and err == "InvalidArgumentError" and name in msg, (name, r, msg)
            continue
        want = results[0][name][4]
        next_index, parts = 0, []
        for r in range(WORLD):
            kind, first, local, full_shape, truth = results[r][name]
            assert kind == "ok" and full_shape == list(shape), (name, r)
            assert np.array_equal(truth, want), "every rank started from the same tensor"
            if local.size:
                assert first == next_index, (name, r, first, next_index)
                next_index += local.size
                parts.append(local)
        assert next_index == want.size, name
        assert np.array_equal(np.concatenate(parts), want), name
