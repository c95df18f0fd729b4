"""deltacast.cuda: the GPU sync from Python.

Here (no GPU): the module loads, says why it cannot run, and raises the right classes. On a
machine with two GPUs and torch: a transformers Qwen2 model trained with AdamW on cuda:0 is
synced through the Python API into a second copy on cuda:1, which must end bit-identical, with
no full-model copy made on the receiver's GPU.
"""

from __future__ import annotations

import os

import numpy as np

import pytest

import deltacast as dc
import deltacast.cuda as dcc


def test_errors_without_a_gpu_are_clear():
    ok, why = dcc.available()
    assert isinstance(ok, bool) and isinstance(why, str) and why
    if ok:
        pytest.skip("a GPU is present: the no-GPU errors cannot be observed")
    with pytest.raises(dc.DeltacastError) as e:
        dcc.NcclComm(b"\0" * 128, 2, 0, 0)
    assert isinstance(e.value, (dc.CudaError, dc.NcclError)), e.value
    with pytest.raises(dc.InvalidArgumentError, match="128"):
        dcc.NcclComm(b"\0" * 12, 2, 0, 0)


def test_error_classes_form_one_tree():
    assert issubclass(dc.NcclError, dc.CudaError)
    assert issubclass(dc.IpcLinkError, dc.CudaError)
    assert issubclass(dc.CudaError, dc.DeltacastError)
    assert issubclass(dc.SyncTimeoutError, TimeoutError)
    assert issubclass(dc.ReceiverRefusedError, dc.DeltacastError)


def test_a_frame_feed_holds_what_was_pushed_until_a_receiver_reads_it():
    feed = dcc.FrameFeed(0)
    assert feed.device == 0 and feed.pending_bytes == 0
    feed.push(b"abc")
    feed.push(np.arange(5, dtype=np.uint8))
    feed.push(b"")
    assert feed.pending_bytes == 8
    feed.push(bytearray(b"xy"))  # anything bytes() takes
    assert feed.pending_bytes == 10
    feed.clear()
    assert feed.pending_bytes == 0
    ok, _ = dcc.available()
    if not ok:
        # The receiver needs the GPU: a clear error, not a crash.
        with pytest.raises(dc.DeltacastError):
            dcc.GpuReceiver(feed, [])


def test_snapshot_place_entropy_and_stages_are_checked_before_anything_runs():
    with pytest.raises(dc.InvalidArgumentError, match="pinned"):
        dcc.GpuSender(None, [], snapshot="host")
    with pytest.raises(dc.InvalidArgumentError, match="lend no snapshots"):
        dcc.GpuSender(None, [], snapshots=[], snapshot="pinned")
    with pytest.raises(dc.InvalidArgumentError, match="auto"):
        dcc.GpuSender(None, [], entropy="sometimes")
    with pytest.raises(dc.InvalidArgumentError, match="auto"):
        dcc.GpuSender(None, [], entropy=2)
    for bad in (-1, 1.5, "2G", True, 1 << 64):
        with pytest.raises(dc.InvalidArgumentError, match="stage_bytes"):
            dcc.GpuSender(None, [], stage_bytes=bad)


def _cannot_run(why):
    """Skips the test, or fails it where a GPU is required (DELTACAST_REQUIRE_GPU=1, set by
    scripts/gpu-tests.sh on the GPU machine): there, no usable GPU, torch or transformers is a
    failure; a test that needs more GPUs than the machine has still skips, saying so."""
    if os.environ.get("DELTACAST_REQUIRE_GPU") == "1":
        pytest.fail(f"DELTACAST_REQUIRE_GPU=1 but {why}")
    pytest.skip(why)


def _one_gpu():
    for module in ("torch", "transformers"):
        try:
            __import__(module)
        except ImportError:
            _cannot_run(f"{module} not installed")
    import torch

    ok, why = dcc.available()
    if not ok:
        _cannot_run(why)
    return torch


def _two_gpus():
    torch = _one_gpu()
    if torch.cuda.device_count() < 2:
        pytest.skip("two CUDA devices needed")
    return torch


def _config():
    from transformers import Qwen2Config

    return Qwen2Config(
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )


def _comm(link, rank, device):
    """``link``: ``("nccl", unique_id)`` or ``("ipc", address, slots, slot_bytes, secret)``."""
    if link[0] == "nccl":
        return dcc.NcclComm(link[1], 2, rank, device)
    _, address, slots, slot_bytes, secret = link
    return dcc.IpcComm(address, 2, rank, device, timeout_s=120, slots=slots,
                       slot_bytes=slot_bytes, secret=secret)


def _trainer(link, queue, steps, snapshot, stage_bytes, device=0):
    import torch
    from transformers import Qwen2ForCausalLM

    torch.cuda.set_device(device)
    torch.manual_seed(0)
    dev = f"cuda:{device}"
    with torch.device(dev):
        model = Qwen2ForCausalLM(_config()).to(torch.bfloat16)
        master = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.AdamW(master, lr=1e-5)
    comm = _comm(link, 0, device)
    sender = dcc.GpuSender(
        comm, model.named_parameters(), chunk_elems=4096, capacity=0.5, snapshot=snapshot,
        stage_bytes=stage_bytes,
    )
    reports = [sender.seed()]
    gen = torch.Generator(device=dev).manual_seed(1)
    for _ in range(steps):
        tokens = torch.randint(0, 1024, (2, 32), device=dev, generator=gen)
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        for m, p in zip(master, model.parameters()):
            m.grad = p.grad.float()
            p.grad = None
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for m, p in zip(master, model.parameters()):
                p.copy_(m)
        reports.append(sender.sync())
    sender.close()
    torch.cuda.synchronize()
    # numpy arrays travel by value (torch tensors through a queue are shared by file
    # descriptor, which dies with this process).
    state = {n: p.detach().view(torch.int16).cpu().numpy() for n, p in model.named_parameters()}
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    refused = getattr(comm, "refused", [])  # the IPC link's root: strangers turned away
    queue.put(("trainer", reports, state, sender.host_bytes, model_bytes, refused))


def _receiver(link, queue, device=1):
    import torch
    from transformers import Qwen2ForCausalLM

    torch.cuda.set_device(device)
    torch.manual_seed(123)  # other weights than the trainer's: the seed must replace them
    with torch.device(f"cuda:{device}"):
        model = Qwen2ForCausalLM(_config()).to(torch.bfloat16)
    comm = _comm(link, 1, device)
    receiver = dcc.GpuReceiver(comm, model.named_parameters())
    reports = []
    while True:
        r = receiver.receive()
        if r is None:
            break
        reports.append(r)
    receiver.verify()
    peak_extra = receiver.staging_bytes
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    state = {n: p.detach().view(torch.int16).cpu().numpy() for n, p in model.named_parameters()}
    queue.put(("receiver", reports, state, peak_extra, model_bytes))


@pytest.mark.parametrize(
    "snapshot, stage_bytes",
    [("device", dcc.DEFAULT_STAGE_BYTES), ("pinned", dcc.DEFAULT_STAGE_BYTES), ("device", 1 << 16)],
)
def test_qwen2_trained_on_gpu0_synced_to_gpu1_is_bit_identical(snapshot, stage_bytes):
    torch = _two_gpus()
    import torch.multiprocessing as mp

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    ctx = mp.get_context("spawn")
    link = ("nccl", dcc.nccl_unique_id())
    _check_trained_and_synced(ctx, link, (0, 1), snapshot, stage_bytes)


def _run_all(procs, queue):
    """Starts the processes, collects what each put on ``queue`` (by its first item), and
    checks that every one exited cleanly."""
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        item = queue.get(timeout=300)
        got[item[0]] = item
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return got


def _check_trained_and_synced(ctx, link, devices, snapshot, stage_bytes, steps=4):
    """Trains on ``devices[0]``, receives on ``devices[1]`` (two processes of ``ctx``), and
    checks bit-identity, versions, stages and the receiver's memory."""
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_trainer,
                    args=(link, queue, steps, snapshot, stage_bytes, devices[0])),
        ctx.Process(target=_receiver, args=(link, queue, devices[1])),
    ]
    got = _run_all(procs, queue)
    _check_outcome(got, snapshot, stage_bytes, steps)


def _check_outcome(got, snapshot, stage_bytes, steps):
    """Bit-identity, versions, stages and the receiver's memory, from the trainer's and the
    receiver's queue items; returns the connections the trainer's link refused."""
    _, sent, truth, host_bytes, trainer_model_bytes, refused = got["trainer"]
    # The snapshot is in pinned host memory exactly when asked for.
    assert host_bytes == (trainer_model_bytes if snapshot == "pinned" else 0)
    _, received, state, peak_extra, model_bytes = got["receiver"]
    kinds = [r["kind"] for r in sent]
    assert kinds[0] == "seed" and "delta" in kinds, kinds
    assert set(kinds[1:]) <= {"delta", "dense"}, kinds
    assert [r["version"] for r in received] == list(range(1, steps + 2))
    # One stage for this small model by default; with 64 KiB stages, several (the
    # embeddings alone are 256 KiB), the same on both sides.
    stages = [r["stages"] for r in sent[1:]]
    assert stages == [r["stages"] for r in received[1:]]
    if stage_bytes == dcc.DEFAULT_STAGE_BYTES:
        assert set(stages) == {1}, stages
    else:
        assert min(stages) > 3, stages
    assert truth.keys() == state.keys()
    for name in truth:
        assert (truth[name] == state[name]).all(), name
    # The receiver's extra GPU memory follows the deltas, not the model: its receive buffers
    # (the wire bytes) and, for entropy-coded chunks, the decoded positions and values (at
    # most 8 bytes per change), with an eighth of growth headroom; no copy of the model.
    # In stages, every stage but the last also keeps the bits it overwrote (its journal: 2
    # bytes per change; a dense stage's whole bytes).
    deltas = [r for r in received if r["kind"] == "delta"]
    journal = 2 if stage_bytes != dcc.DEFAULT_STAGE_BYTES else 0
    need = max((r["payload_bytes"] + (8 + journal) * r["changed"] for r in deltas), default=0)
    assert peak_extra < 1.25 * need + (1 << 20), (peak_extra, need, model_bytes)
    return refused


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "devices, slots, slot_bytes, stage_bytes",
    [
        # Two processes on one GPU (where NCCL refuses to run), default staging.
        ((0, 0), 4, 64 << 20, dcc.DEFAULT_STAGE_BYTES),
        # Slots far smaller than the broadcasts: many pieces, every slot reused many times.
        ((0, 0), 2, 4096, 1 << 16),
        # Across two GPUs (peer access), when there are two.
        ((0, 1), 3, 1 << 20, dcc.DEFAULT_STAGE_BYTES),
    ],
)
def test_qwen2_synced_through_cuda_ipc_is_bit_identical(devices, slots, slot_bytes,
                                                        stage_bytes):
    torch = _one_gpu()
    if torch.cuda.device_count() <= max(devices):
        pytest.skip(f"{max(devices) + 1} CUDA devices needed")
    import torch.multiprocessing as mp

    link = ("ipc", f"127.0.0.1:{_free_port()}", slots, slot_bytes, dcc.IpcComm.generate_secret())
    _check_trained_and_synced(mp.get_context("spawn"), link, devices, "device", stage_bytes)


def _ipc_stranger(address, wrong_secret, queue):
    """Tries to join the link as rank 1 with the wrong secret; says what happened."""
    import torch

    torch.cuda.set_device(0)
    try:
        dcc.IpcComm(address, 2, 1, 0, timeout_s=120, slots=2, slot_bytes=4096,
                    secret=wrong_secret)
        queue.put(("stranger", "joined"))
    except dc.IpcLinkError as e:
        queue.put(("stranger", str(e)))


def test_a_stranger_with_the_wrong_secret_is_refused_and_the_ipc_sync_stays_bit_identical():
    torch = _one_gpu()
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    address = f"127.0.0.1:{_free_port()}"
    link = ("ipc", address, 2, 4096, dcc.IpcComm.generate_secret())
    queue = ctx.Queue()
    trainer = ctx.Process(target=_trainer,
                          args=(link, queue, 4, "device", dcc.DEFAULT_STAGE_BYTES, 0))
    stranger = ctx.Process(target=_ipc_stranger,
                           args=(address, dcc.IpcComm.generate_secret(), queue))
    trainer.start()
    stranger.start()
    # The trainer waits for its receiver, which starts only once the stranger is done.
    kind, said = queue.get(timeout=300)
    assert kind == "stranger", kind
    assert "authenticate" in said and "wrong shared secret" in said, said
    stranger.join(timeout=60)
    assert stranger.exitcode == 0
    receiver = ctx.Process(target=_receiver, args=(link, queue, 0))
    receiver.start()
    got = {}
    for _ in range(2):
        item = queue.get(timeout=300)
        got[item[0]] = item
    for p in (trainer, receiver):
        p.join(timeout=60)
        assert p.exitcode == 0
    refused = _check_outcome(got, "device", dcc.DEFAULT_STAGE_BYTES, 4)
    assert len(refused) == 1 and "wrong shared secret" in refused[0], refused


def _ipc_quitter(address, secret, queue):
    """Joins the link as the receiver, then is killed before the first sync."""
    import signal

    import torch

    torch.cuda.set_device(0)
    comm = dcc.IpcComm(address, 2, 1, 0, timeout_s=30, secret=secret)
    queue.put("joined")
    queue.close()
    queue.join_thread()  # the message is in the pipe before the process dies
    os.kill(os.getpid(), signal.SIGKILL)
    del comm


def test_a_receiver_that_dies_fails_the_ipc_sender_instead_of_hanging_it():
    torch = _one_gpu()
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    address = f"127.0.0.1:{_free_port()}"
    secret = dcc.IpcComm.generate_secret()
    quitter = ctx.Process(target=_ipc_quitter, args=(address, secret, queue))
    quitter.start()
    comm = dcc.IpcComm(address, 2, 0, 0, timeout_s=30, slots=2, slot_bytes=4096, secret=secret)
    assert queue.get(timeout=60) == "joined"
    quitter.join(timeout=30)
    assert quitter.exitcode == -9, quitter.exitcode
    t = torch.zeros(1 << 16, dtype=torch.bfloat16, device="cuda:0")
    sender = dcc.GpuSender(comm, [("t", t)], timeout_s=30)
    with pytest.raises((dc.IpcLinkError, dc.SyncTimeoutError)):
        sender.seed()
    # The link is aborted: the next call fails at once, with the same class.
    with pytest.raises(dc.IpcLinkError, match="aborted"):
        sender.sync()


def test_ipc_link_arguments_are_checked_before_any_gpu_work():
    with pytest.raises(dc.InvalidArgumentError, match="at least 2 ranks"):
        dcc.IpcComm("127.0.0.1:1", 1, 0, 0)
    with pytest.raises(dc.InvalidArgumentError, match="rank 3 of 2"):
        dcc.IpcComm("127.0.0.1:1", 2, 3, 0)
    with pytest.raises(dc.InvalidArgumentError, match="staging slots"):
        dcc.IpcComm("127.0.0.1:1", 2, 0, 0, slots=0)
    with pytest.raises(dc.InvalidArgumentError, match="staging slots"):
        dcc.IpcComm("127.0.0.1:1", 2, 0, 0, slots=65)
    with pytest.raises(dc.InvalidArgumentError, match="staging slots"):
        dcc.IpcComm("127.0.0.1:1", 2, 0, 0, slot_bytes=8)
    with pytest.raises(dc.InvalidArgumentError, match="timeout"):
        dcc.IpcComm("127.0.0.1:1", 2, 0, 0, timeout_s=0)


def test_ipc_link_secret_and_address_are_checked_before_any_gpu_work(monkeypatch, tmp_path):
    monkeypatch.delenv("DELTACAST_SECRET", raising=False)
    good = dcc.IpcComm.generate_secret()
    # No secret anywhere: the link has no unauthenticated mode.
    with pytest.raises(dc.InvalidArgumentError, match="needs a shared secret"):
        dcc.IpcComm("127.0.0.1:1", 2, 1, 0)
    with pytest.raises(dc.InvalidArgumentError, match="at least 16"):
        dcc.IpcComm("127.0.0.1:1", 2, 1, 0, secret="short")
    with pytest.raises(dc.InvalidArgumentError, match="at least 16"):
        dcc.IpcComm("127.0.0.1:1", 2, 1, 0, secret=b"")
    with pytest.raises(dc.InvalidArgumentError, match="str or bytes"):
        dcc.IpcComm("127.0.0.1:1", 2, 1, 0, secret=12345678901234567890)
    with pytest.raises(dc.InvalidArgumentError, match="cannot read secret file"):
        dcc.IpcComm("127.0.0.1:1", 2, 1, 0, secret_file=tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(dc.InvalidArgumentError, match="is empty"):
        dcc.IpcComm("127.0.0.1:1", 2, 1, 0, secret_file=tmp_path / "empty")
    monkeypatch.setenv("DELTACAST_SECRET", "short")
    with pytest.raises(dc.InvalidArgumentError, match="at least 16"):
        dcc.IpcComm("127.0.0.1:1", 2, 1, 0)
    # Beyond loopback: refused, with or without a secret, before connecting or listening.
    for address in ("0.0.0.0:29512", "192.0.2.1:29512", "[::]:29512"):
        for rank in (0, 1):
            with pytest.raises(dc.InvalidArgumentError, match="not loopback"):
                dcc.IpcComm(address, 2, rank, 0, secret=good)


def test_generated_ipc_secrets_are_fresh_and_long():
    a, b = dcc.IpcComm.generate_secret(), dcc.IpcComm.generate_secret()
    assert a != b
    assert len(a) == 64 and all(c in "0123456789abcdef" for c in a), a


def _rows_oracle(rows, world):
    """torch.chunk's cut of ``rows`` rows into ``world`` parts, by listing them."""
    per = -(-rows // world) if rows else 1
    items = list(range(rows))
    parts = [items[i:i + per] for i in range(0, rows, per)] if rows else []
    parts += [[]] * (world - len(parts))
    return [(p[0] if p else rows, len(p)) for p in parts]


def test_dim0_shard_cuts_rows_as_torch_chunk():
    for rows in [0, 1, 2, 3, 7, 8, 9, 100, 1023, 1024]:
        for world in [1, 2, 3, 4, 8]:
            got = [dcc.dim0_shard(rows, r, world) for r in range(world)]
            want = _rows_oracle(rows, world)
            # Empty shards past the end start at `rows`; the cut covers the rows in order.
            assert [g[1] for g in got] == [w[1] for w in want], (rows, world)
            assert [g[0] for g in got if g[1]] == [w[0] for w in want if w[1]], (rows, world)
            assert sum(g[1] for g in got) == rows
    for bad in [(5, 2, 2), (5, -1, 2), (5, 0, 0), (-1, 0, 1)]:
        with pytest.raises(dc.InvalidArgumentError):
            dcc.dim0_shard(*bad)


def test_a_layouts_runs_are_the_blocks_flat_indices():
    """The runs ``dtensor_shards`` goes by (``Layout.global_ranges``, the core's) against
    listing each rank's block's flat indices with numpy, on random meshes of ``Shard`` and
    ``Replicate`` placements: the runs are the maximal stretches of consecutive indices
    (so a block is taken exactly when there is one, from its first index)."""
    rng = np.random.default_rng(26)
    for _ in range(300):
        full = [int(d) for d in rng.integers(1, 6, rng.integers(1, 4))]
        mesh = [int(m) for m in rng.integers(1, 4, rng.integers(1, 3))]
        placements = [f"S({int(rng.integers(0, len(full)))})" if rng.random() < 0.7 else "R" for _ in mesh]
        coords = [int(rng.integers(0, m)) for m in mesh]
        layout = dc.Layout(mesh, coords, placements, full)
        index = np.arange(int(np.prod(full))).reshape(full)
        block = index[tuple(slice(o, o + n) for o, n in zip(layout.offset, layout.local_shape))].ravel()
        want = []
        for i in block.tolist():
            if want and want[-1][0] + want[-1][1] == i:
                want[-1][1] += 1
            else:
                want.append([i, 1])
        got = [list(r) for r in layout.global_ranges]
        assert got == want, (full, mesh, placements, coords)
        assert sum(n for _, n in got) == block.size


def test_sharded_sender_options_are_checked_before_anything_runs():
    with pytest.raises(dc.InvalidArgumentError, match="auto"):
        dcc.GpuShardedSender(None, None, [], entropy="sometimes")
    with pytest.raises(dc.InvalidArgumentError, match="pinned"):
        dcc.GpuShardedSender(None, None, [], snapshot="host")
    with pytest.raises(dc.InvalidArgumentError, match="stage_bytes"):
        dcc.GpuShardedSender(None, None, [], stage_bytes=-1)


def _fsdp_trainer(rank, port, trainers_uid, receivers_uid, queue, steps):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2ForCausalLM

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        device_id=torch.device(f"cuda:{rank}"),
    )
    torch.manual_seed(0)
    with torch.device(f"cuda:{rank}"):
        model = Qwen2ForCausalLM(_config()).to(torch.bfloat16)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    # BF16 parameters updated in place: a learning rate at which BF16 weights move.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainers = dcc.NcclComm(trainers_uid, 2, rank, rank)
    receivers = dcc.NcclComm(receivers_uid, 2, 0, 0) if rank == 0 else None
    shards = dcc.dtensor_shards(model.named_parameters())
    sender = dcc.GpuShardedSender(
        trainers, receivers, shards, chunk_elems=4096, capacity=0.5, stage_bytes=1 << 16,
    )
    reports = [sender.seed()]
    gen = torch.Generator(device=f"cuda:{rank}").manual_seed(1)
    for _ in range(steps):
        tokens = torch.randint(0, 1024, (2, 32), device=f"cuda:{rank}", generator=gen)
        model(tokens, labels=tokens).loss.backward()
        opt.step()
        opt.zero_grad()
        reports.append(sender.sync())
    sender.close()
    torch.cuda.synchronize()
    # The whole tensors, gathered by FSDP2 itself: the truth the receiver must hold.
    state = {
        n: p.full_tensor().detach().view(torch.int16).cpu().numpy()
        for n, p in model.named_parameters()
    }
    kept = [(n, t.numel(), first) for n, t, _, first in shards]
    queue.put((f"trainer{rank}", reports, state, kept, sender.digests))
    dist.destroy_process_group()


def _fsdp_receiver(receivers_uid, queue):
    import torch
    from transformers import Qwen2ForCausalLM

    torch.cuda.set_device(1)
    torch.manual_seed(123)
    with torch.device("cuda:1"):
        model = Qwen2ForCausalLM(_config()).to(torch.bfloat16)
    comm = dcc.NcclComm(receivers_uid, 2, 1, 1)
    receiver = dcc.GpuReceiver(comm, model.named_parameters())
    reports = []
    while True:
        r = receiver.receive()
        if r is None:
            break
        reports.append(r)
    receiver.verify()
    state = {n: p.detach().view(torch.int16).cpu().numpy() for n, p in model.named_parameters()}
    queue.put(("receiver", reports, state, None, receiver.digests))


def test_fsdp2_sharded_trainer_synced_to_a_receiver_is_bit_identical():
    """Two FSDP2 trainer ranks (cuda:0, cuda:1) train a Qwen2 model sharded on dim 0 and
    sync it through GpuShardedSender; a receiver (its own process on cuda:1) holds the whole
    model and must equal FSDP2's own ``full_tensor()`` bit for bit after the last step."""
    torch = _two_gpus()
    import socket

    import torch.multiprocessing as mp

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    trainers_uid, receivers_uid = dcc.nccl_unique_id(), dcc.nccl_unique_id()
    steps = 4
    procs = [
        ctx.Process(
            target=_fsdp_trainer, args=(r, port, trainers_uid, receivers_uid, queue, steps)
        )
        for r in range(2)
    ] + [ctx.Process(target=_fsdp_receiver, args=(receivers_uid, queue))]
    got = _run_all(procs, queue)
    _, sent0, truth, kept0, digests0 = got["trainer0"]
    _, sent1, truth1, kept1, digests1 = got["trainer1"]
    _, received, state, _, rdigests = got["receiver"]
    # Both ranks held real shards (not one rank everything) and agree on every sync.
    assert sum(n for _, n, _ in kept0) > 0 and sum(n for _, n, _ in kept1) > 0
    assert any(first > 0 for _, n, first in kept1 if n > 0)
    strip = lambda rs: [(r["kind"], r["version"], r["changed"], r["stages"]) for r in rs]
    assert strip(sent0) == strip(sent1)
    kinds = [r["kind"] for r in sent0]
    assert kinds[0] == "seed" and "delta" in kinds, kinds
    assert [r["version"] for r in received] == list(range(1, steps + 2))
    assert min(r["stages"] for r in sent0[1:]) > 3
    assert digests0 == digests1 == rdigests
    assert truth.keys() == state.keys()
    for name in truth:
        assert (truth[name] == truth1[name]).all(), name
        assert (truth[name] == state[name]).all(), name


# fp32 tensors synced as bf16 slots (GpuSender(wire_dtypes=...)): every fp32 bit pattern, in
# _PATTERN_TENSORS tensors of 2^28 elements, rounded by the sender's kernels as they read it.
_PATTERN_TENSORS = 16
_PATTERN_BITS = 28
# Per step after the seed: the stride of the elements the trainer scales by 1 + 2^-10 (a
# delta within the 1 % capacity, then a third of everything: refreshed and sent whole).
_F32_STEPS = (1009, 3)


def _f32_patterns(torch, i, device):
    """Tensor ``i`` of the patterns: fp32 whose bits are i * 2^28 .. (i + 1) * 2^28 - 1."""
    x = torch.arange(i << _PATTERN_BITS, (i + 1) << _PATTERN_BITS, dtype=torch.int64,
                     device=device)
    x = torch.where(x >= 1 << 31, x - (1 << 32), x).to(torch.int32)
    return x.view(torch.float32)


def _f32_step(t, k):
    """Step ``k``'s update of a pattern tensor, the same bits in both processes."""
    t[k::_F32_STEPS[k]] *= 1.0009765625


def _f32_trainer(link, queue, device=0):
    import torch

    torch.cuda.set_device(device)
    tensors = [(f"p{i}", _f32_patterns(torch, i, f"cuda:{device}"))
               for i in range(_PATTERN_TENSORS)]
    sender = dcc.GpuSender(_comm(link, 0, device), tensors, wire_dtypes=torch.bfloat16,
                           capacity=0.01, entropy="off")
    reports = [sender.seed()]
    for k in range(len(_F32_STEPS)):
        for _, t in tensors:
            _f32_step(t, k)
        reports.append(sender.sync())
    sender.close()
    queue.put(("trainer", [(r["kind"], r["dense_stages"]) for r in reports], sender.bf16_nan))


def _f32_receiver(link, queue, device):
    """Receives the seed and the steps into bf16 tensors; after each, compares every element
    with torch CUDA's own ``.to(torch.bfloat16)`` of the trainer's fp32 (rebuilt here): the
    non-NaN bits must be equal; the NaN bits are reported, torch's and the sync's."""
    import torch

    torch.cuda.set_device(device)
    dev = f"cuda:{device}"
    held = [(f"p{i}", torch.zeros(1 << _PATTERN_BITS, dtype=torch.bfloat16, device=dev))
            for i in range(_PATTERN_TENSORS)]
    receiver = dcc.GpuReceiver(_comm(link, 1, device), held)
    results = []
    for k in range(len(_F32_STEPS) + 1):
        r = receiver.receive()
        mismatches, first, torch_nan, sync_nan = 0, None, set(), set()
        for i, (_, h) in enumerate(held):
            src = _f32_patterns(torch, i, dev)
            for j in range(k):
                _f32_step(src, j)
            ref = src.to(torch.bfloat16).view(torch.int16)
            nan = (src.view(torch.int32) & 0x7FFFFFFF) > 0x7F800000
            got = h.view(torch.int16)
            bad = (got != ref) & ~nan
            n_bad = int(bad.sum())
            if n_bad and first is None:
                at = int(bad.nonzero()[0])
                first = (hex(int(src.view(torch.int32)[at]) & 0xFFFFFFFF),
                         hex(int(got[at]) & 0xFFFF), hex(int(ref[at]) & 0xFFFF))
            mismatches += n_bad
            torch_nan |= {v & 0xFFFF for v in torch.unique(ref[nan]).tolist()}
            sync_nan |= {v & 0xFFFF for v in torch.unique(got[nan]).tolist()}
            del src, ref, nan, bad
        results.append((r["kind"], mismatches, first, sorted(torch_nan), sorted(sync_nan)))
    assert receiver.receive() is None
    queue.put(("receiver", results))


def test_every_f32_pattern_synced_as_bf16_matches_torch_cuda():
    """A GpuSender over fp32 tensors holding all 2^32 patterns, synced as bf16 (seed, a delta,
    a step sent whole), against torch CUDA's ``.to(torch.bfloat16)``: equal bits for every
    non-NaN; every NaN arrives as the sender's ``bf16_nan``, and torch CUDA's NaN bits are
    reported (a warning) so that the rule can be chosen to match them."""
    import warnings

    torch = _one_gpu()
    import torch.multiprocessing as mp

    devices = (0, 1) if torch.cuda.device_count() > 1 else (0, 0)
    ctx = mp.get_context("spawn")
    link = ("ipc", f"127.0.0.1:{_free_port()}", 4, 64 << 20, dcc.IpcComm.generate_secret())
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_f32_trainer, args=(link, queue, devices[0])),
        ctx.Process(target=_f32_receiver, args=(link, queue, devices[1])),
    ]
    got = _run_all(procs, queue)
    _, kinds, nan_rule = got["trainer"]
    results = got["receiver"][1]
    assert [k for k, _ in kinds] == ["seed", "delta", "dense"], kinds
    for k, (kind, mismatches, first, torch_nan, sync_nan) in enumerate(results):
        assert kind == kinds[k][0], (k, kind, kinds)
        assert mismatches == 0, f"step {k}: {mismatches} non-NaN differ; first {first}"
        assert sync_nan == [nan_rule], f"step {k}: NaNs arrived as {sync_nan}"
        warnings.warn(f"step {k}: torch CUDA turns fp32 NaN into bf16 "
                      f"{[hex(v) for v in torch_nan]}; the sync's rule gives {hex(nan_rule)}")


def test_wire_dtypes_and_bf16_nan_are_checked_before_anything_runs():
    with pytest.raises(dc.InvalidArgumentError, match="bf16_nan"):
        dcc.GpuSender(None, [], bf16_nan=1 << 16)
    with pytest.raises(dc.InvalidArgumentError, match="bf16_nan"):
        dcc.GpuSender(None, [], bf16_nan=True)
    assert dcc._wire_dtype(None, "w", "F32") == "F32"
    assert dcc._wire_dtype("BF16", "w", "F32") == "BF16"
    assert dcc._wire_dtype("BF16", "w", "F16") == "F16", "only float32 tensors convert"
    assert dcc._wire_dtype({"w": "BF16"}, "w", "F32") == "BF16"
    assert dcc._wire_dtype({"w": "BF16"}, "v", "F32") == "F32"
