"""deltacast.torch: tensors and models (plain and DTensor) as deltacast inputs. Skipped
without torch."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed")

import deltacast as dc  # noqa: E402
import deltacast.torch as dct  # noqa: E402


def bits(t):
    return dct.to_numpy(t.detach().contiguous()).view(np.uint8).copy()


def test_to_numpy_shares_memory():
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        t = torch.randn(4, 5).to(dtype)
        a = dct.to_numpy(t)
        assert a.shape == (4, 5) and a.itemsize == t.element_size()
        a.reshape(-1)[0] = 0
        assert t.reshape(-1)[0].item() == 0.0
    with pytest.raises(dc.InvalidArgumentError, match="contiguous"):
        dct.to_numpy(torch.zeros(4, 4).t())
    with pytest.raises(dc.UnsupportedDTypeError):
        dct.to_numpy(torch.zeros(2, dtype=torch.int64))
    assert dct.dtype_name(torch.bfloat16) == "bf16"


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)
    ).to(torch.bfloat16)


def test_trainer_to_receiver_model():
    trainer, served = make_model(0), make_model(1)
    sender = dc.Sender(dct.slot_table(trainer))
    receiver = dct.receiver(served)
    assert receiver.table == sender.table
    opt = torch.optim.SGD(trainer.parameters(), lr=1e-2)
    for step in range(3):
        if step:
            trainer(torch.randn(4, 32, dtype=torch.bfloat16)).float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        result = sender.sync(dct.local_arrays(trainer))
        for f in result.frames:
            outcome = receiver.receive(f)
        assert outcome.state_digest == result.state_digest
        for (n, a), (_, b) in zip(trainer.named_parameters(), served.named_parameters()):
            assert np.array_equal(bits(a), bits(b)), n


def test_fp32_master_synced_as_bf16():
    master = make_model(0).float()
    served = make_model(1)
    sender = dc.Sender(dct.slot_table(master, dtype=torch.bfloat16))
    receiver = dct.receiver(served)
    for f in sender.sync(dct.local_arrays(master, dtype=torch.bfloat16)).frames:
        receiver.receive(f)
    for (_, a), (_, b) in zip(master.named_parameters(), served.named_parameters()):
        assert torch.equal(a.to(torch.bfloat16), b)


def test_placement_spec():
    from torch.distributed.tensor import Replicate, Shard

    assert dct.placement_spec(Shard(1)) == ("S", 1)
    assert dct.placement_spec(Replicate()) == ("R",)
    try:
        from torch.distributed.tensor.placement_types import _StridedShard
    except ImportError:
        return
    strided = _StridedShard(0, split_factor=2)
    assert dct.placement_spec(strided) == ("_S", 0, 2)
    assert dc.Layout([2, 2], [0, 1], [strided, Shard(0)], [8, 4]).placements == ["_S(0, 2)", "S(0)"]
    assert dc.Layout([2], [1], [Shard(1)], [3, 4]).local_shape == [3, 2]  # str() of torch objects


def test_receiver_takes_tensors_directly():
    trainer, served = make_model(0), make_model(1)
    table = dct.slot_table(trainer)
    receiver = dc.Receiver(table, dict(served.named_parameters()))  # viewed, not copied
    for f in dc.Sender(table).sync(dict(trainer.named_parameters())).frames:
        receiver.receive(f)
    for (_, a), (_, b) in zip(trainer.named_parameters(), served.named_parameters()):
        assert torch.equal(a, b)


def _worker(rank, world, init_file, out_dir, mode):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    backend, device = ("nccl", "cuda") if mode == "nccl" else ("gloo", "cpu")
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh(device, (world,))
        torch.manual_seed(0)  # the same full tensors on every rank
        if mode == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            model = torch.nn.Sequential(torch.nn.Linear(10, 7), torch.nn.Linear(7, 3))
            fully_shard(model, mesh=mesh)
            named = dict(model.named_parameters())
        else:
            named = {
                "rows": distribute_tensor(torch.randn(9, 4, device=device), mesh, [Shard(0)]),
                "cols": distribute_tensor(torch.randn(5, 7, device=device), mesh, [Shard(1)]),
                "plain": torch.randn(3, device=device),
            }
        link = dct.TorchDistributedLink()
        sender = dct.rank_sender(named, link, dtype=torch.bfloat16, bucket_size=1024)
        for step in range(3):
            if step:
                with torch.no_grad():
                    for p in named.values():
                        local = p.to_local() if dct.is_dtensor(p) else p
                        local.add_(1e-3 * (step + rank))
            local = dct.local_arrays(named, dtype=torch.bfloat16, cpu=True)
            result = sender.sync(local)
            full = {
                n: (p.full_tensor() if dct.is_dtensor(p) else p).to("cpu", torch.bfloat16)
                for n, p in named.items()
            }
            if rank == 0:
                dc.write_sync_file(os.path.join(out_dir, f"{step}.dcast"), result.frames)
                torch.save({n: t.view(torch.int16) for n, t in full.items()}, os.path.join(out_dir, f"{step}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mode", ["dtensor", "fsdp2", "nccl"])
def test_dtensor_ranks_over_torch_distributed(tmp_path, mode):
    import torch.multiprocessing as mp

    if mode == "fsdp2":
        try:
            from torch.distributed.fsdp import fully_shard  # noqa: F401
        except ImportError:
            pytest.skip("this torch has no FSDP2 fully_shard")
    if mode == "nccl" and torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    world = 2
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), str(tmp_path), mode), nprocs=world)
    receiver = None
    for step in range(3):
        full = torch.load(tmp_path / f"{step}.pt")
        if receiver is None:
            slots = dc.SlotTable([dc.Slot(n, "bf16", tuple(t.shape)) for n, t in full.items()])
            held = {n: np.zeros(tuple(t.shape), np.uint16) for n, t in full.items()}
            receiver = dc.Receiver(slots, held)
        for f in dc.read_sync_file(tmp_path / f"{step}.dcast"):
            receiver.receive(f)
        assert receiver.version == step + 1
        for n, t in full.items():
            assert np.array_equal(held[n].view(np.int16), t.numpy()), (step, n)


def test_hf_example_runs():
    pytest.importorskip("transformers", reason="transformers not installed")
    import runpy
    import sys as _sys

    path = os.path.join(os.path.dirname(__file__), "..", "examples", "hf_sync.py")
    argv = _sys.argv
    _sys.argv = [path, "--steps", "2"]
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        _sys.argv = argv
