"""deltacast.cuda: the GPU sync from Python.

Here (no GPU): the module loads, says why it cannot run, and raises the right classes. On a
machine with two GPUs and torch: a transformers Qwen2 model trained with AdamW on cuda:0 is
synced through the Python API into a second copy on cuda:1, which must end bit-identical, with
no full-model copy made on the receiver's GPU.
"""

from __future__ import annotations

import os

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
    assert issubclass(dc.CudaError, dc.DeltacastError)
    assert issubclass(dc.SyncTimeoutError, TimeoutError)
    assert issubclass(dc.ReceiverRefusedError, dc.DeltacastError)


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


def _two_gpus():
    torch = pytest.importorskip("torch", reason="torch not installed")
    pytest.importorskip("transformers", reason="transformers not installed")
    ok, why = dcc.available()
    if not ok:
        pytest.skip(why)
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


def _trainer(uid, queue, steps, snapshot, stage_bytes):
    import torch
    from transformers import Qwen2ForCausalLM

    torch.cuda.set_device(0)
    torch.manual_seed(0)
    with torch.device("cuda:0"):
        model = Qwen2ForCausalLM(_config()).to(torch.bfloat16)
        master = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.AdamW(master, lr=1e-5)
    comm = dcc.NcclComm(uid, 2, 0, 0)
    sender = dcc.GpuSender(
        comm, model.named_parameters(), chunk_elems=4096, capacity=0.5, snapshot=snapshot,
        stage_bytes=stage_bytes,
    )
    reports = [sender.seed()]
    gen = torch.Generator(device="cuda:0").manual_seed(1)
    for _ in range(steps):
        tokens = torch.randint(0, 1024, (2, 32), device="cuda:0", generator=gen)
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
    queue.put(("trainer", reports, state, sender.host_bytes, model_bytes))


def _receiver(uid, queue):
    import torch
    from transformers import Qwen2ForCausalLM

    torch.cuda.set_device(1)
    torch.manual_seed(123)  # other weights than the trainer's: the seed must replace them
    with torch.device("cuda:1"):
        model = Qwen2ForCausalLM(_config()).to(torch.bfloat16)
    comm = dcc.NcclComm(uid, 2, 1, 1)
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
    queue = ctx.Queue()
    uid = dcc.nccl_unique_id()
    steps = 4
    procs = [
        ctx.Process(target=_trainer, args=(uid, queue, steps, snapshot, stage_bytes)),
        ctx.Process(target=_receiver, args=(uid, queue)),
    ]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        item = queue.get(timeout=300)
        got[item[0]] = item
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    _, sent, truth, host_bytes, trainer_model_bytes = got["trainer"]
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
