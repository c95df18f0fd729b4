"""Block FP8 on the GPU: the quantizer (kernels/quant.cu, through ``GpuSender``'s FP8 wire
dtypes) against the plain-torch rule of tests/fp8_reference.py, and an FP8 sync over CUDA IPC
into a receiver that holds FP8 weights and their ``weight_scale_inv``. Needs a GPU with torch
(scripts/gpu-tests.sh runs it on the device); skips elsewhere."""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

import numpy as np
import pytest

import deltacast.cuda as dcc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fp8_reference import masters, reference  # noqa: E402
from gpu_case import require_gpu  # noqa: E402



def _quantize(torch, x):
    """(FP8 bits, scales) of CUDA fp32 ``x`` by deltacast's kernel."""
    from deltacast import _native

    *lead, m, n = x.shape
    q = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    s = torch.empty((*lead, -(-m // 128), -(-n // 128)), dtype=torch.float32, device=x.device)
    quant = _native.Fp8Quantizer(x.device.index or 0, [(x.data_ptr(), q.data_ptr(), s.data_ptr(), list(x.shape))])
    quant.run(torch.cuda.current_stream().cuda_stream)
    return q, s


def test_the_kernel_equals_the_torch_rule_on_every_kind_of_block():
    torch = require_gpu()
    rng = np.random.default_rng(90)
    for shape in [(1, 1), (128, 128), (300, 257), (3, 130, 64), (2, 1, 385), (129, 1)]:
        x = torch.from_numpy(masters(rng, shape)).cuda()
        flat = x.view(-1)
        # NaN, ±Inf and huge values in some blocks.
        for v in (float("nan"), float("inf"), -float("inf"), 3e38, -1e30):
            flat[int(rng.integers(0, flat.numel()))] = v
        q, s = _quantize(torch, x)
        want_q, want_s = reference(x)
        assert torch.equal(q, want_q), shape
        assert torch.equal(s.view(torch.int32), want_s.view(torch.int32)), shape
        # The CPU torch gives the same (the rule is the platform's own only on NaN signs,
        # which it pins).
        cq, cs = reference(x.cpu())
        assert torch.equal(q.cpu(), cq) and torch.equal(s.view(torch.int32).cpu(), cs.view(torch.int32))


def test_work_after_run_on_torchs_default_stream_reads_the_new_bits():
    """``run`` on torch's default stream (handle 0, CUDA's legacy stream): what torch enqueues
    on it afterwards must wait for the kernel. The quantizer stays alive and nothing
    synchronizes in between, so a stream that does not wait reads the zeros it started with."""
    from deltacast import _native

    torch = require_gpu()
    assert torch.cuda.current_stream().cuda_stream == 0
    gen = torch.Generator(device="cuda").manual_seed(91)
    x = torch.randn((8192, 8192), device="cuda", generator=gen)  # 64 M elements
    want_q, want_s = reference(x)
    side = torch.cuda.Stream()
    for stream in (torch.cuda.default_stream(), side):
        with torch.cuda.stream(stream):
            q = torch.zeros(x.shape, dtype=torch.uint8, device="cuda")
            s = torch.zeros((64, 64), dtype=torch.float32, device="cuda")
            quant = _native.Fp8Quantizer(0, [(x.data_ptr(), q.data_ptr(), s.data_ptr(), [8192, 8192])])
            for _ in range(3):  # the first run also waits for the zeros above
                quant.run(stream.cuda_stream)
                same = torch.equal(q, want_q) and torch.equal(s.view(torch.int32), want_s.view(torch.int32))
                assert same, f"stream {stream.cuda_stream}"
                q.zero_()
                s.zero_()
            del quant


def test_every_fp32_pattern_up_to_448_quantizes_as_torch_casts_it():
    """Every fp32 bit pattern of magnitude at most 448 (2.3 billion, ±0 and subnormals among
    them), in blocks whose amax is exactly 448, so the scale is 1 and each element is torch's
    own ``.to(float8_e4m3fn)`` of the pattern."""
    torch = require_gpu()
    top = 0x43E00000  # 448.0
    chunk = 1 << 26  # patterns per chunk: a [2^19, 128] matrix
    checked = 0
    for sign in (0, 0x80000000):
        for start in range(0, top + 1, chunk):
            n = min(chunk, top + 1 - start)
            rows = -(-n // 128)
            bits = torch.arange(start, start + rows * 128, dtype=torch.int64, device="cuda")
            bits = torch.clamp(bits, max=top) | sign
            x = bits.to(torch.int32).view(torch.float32).view(rows, 128)
            x[::128, 0] = 448.0  # each row block's amax
            q, s = _quantize(torch, x)
            assert torch.all(s.view(torch.int32) == 0x3F800000), hex(start)
            want = x.to(torch.float8_e4m3fn).view(torch.uint8)
            bad = (q != want).nonzero()
            assert bad.numel() == 0, f"pattern {int(x.view(-1)[bad[0, 0] * 128 + bad[0, 1]].view(torch.int32)):#x}"
            checked += n
    assert checked == 2 * (top + 1)


def _fp8_names(named):
    return {n for n, t in named if t.dim() == 2 and n.endswith("_proj.weight")}


def _model(torch, seed):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(hidden_size=256, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1024, max_position_embeddings=256,
                      tie_word_embeddings=False)
    with torch.device("cuda:0"):
        return Qwen2ForCausalLM(cfg).float()


def _fp8_trainer(address, secret, queue, steps):
    import torch

    model = _model(torch, 0)
    named = list(model.named_parameters())
    fp8 = _fp8_names(named)
    wire = {n: ("F8_E4M3" if n in fp8 else "BF16") for n, _ in named}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    comm = dcc.IpcComm(address, 2, 0, 0, timeout_s=120, secret=secret)
    sender = dcc.GpuSender(comm, named, chunk_elems=4096, wire_dtypes=wire)
    reports, wants = [], []
    w = model.model.layers[0].self_attn.q_proj.weight
    for step in range(steps + 1):
        if step:
            tokens = torch.randint(0, 1024, (2, 32), device="cuda:0")
            model(tokens, labels=tokens).loss.backward()
            opt.step()
            opt.zero_grad()
        poisoned = step == 2  # a NaN block and an Inf block for one sync, then back
        if poisoned:
            kept = (w[3, 3].item(), w[200, 5].item())
            with torch.no_grad():
                w[3, 3], w[200, 5] = float("nan"), float("inf")
        # What the receiver must hold: torch's quantization and rounding of the masters.
        want = {}
        for n, p in named:
            if n in fp8:
                q, s = reference(p.detach())
                want[n], want[n + "_scale_inv"] = q.cpu().numpy(), s.view(torch.int32).cpu().numpy()
            else:
                want[n] = p.detach().to(torch.bfloat16).view(torch.int16).cpu().numpy()
        wants.append(want)
        reports.append(sender.sync())  # the first is the seed
        if poisoned:
            with torch.no_grad():
                w[3, 3], w[200, 5] = kept
    sender.close()
    torch.cuda.synchronize()
    queue.put(("trainer", reports, wants))


def _fp8_receiver(address, secret, queue):
    import torch

    model = _model(torch, 1)
    named = list(model.named_parameters())
    fp8 = _fp8_names(named)
    held = []
    for n, p in named:
        if n in fp8:
            *lead, m, k = p.shape
            held += [(n, torch.zeros(p.shape, dtype=torch.float8_e4m3fn, device="cuda:0")),
                     (n + "_scale_inv", torch.zeros((-(-m // 128), -(-k // 128)), device="cuda:0"))]
        else:
            held.append((n, torch.zeros(p.shape, dtype=torch.bfloat16, device="cuda:0")))
    comm = dcc.IpcComm(address, 2, 1, 0, timeout_s=120, secret=secret)
    receiver = dcc.GpuReceiver(comm, held)
    states = []
    while True:
        r = receiver.receive()
        if r is None:
            break
        torch.cuda.synchronize()
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
        states.append({n: t.view(ints[t.element_size()]).cpu().numpy() for n, t in held})
    queue.put(("receiver", states))


def test_fp32_masters_synced_as_block_fp8_over_cuda_ipc_are_bit_identical():
    require_gpu()
    try:
        import transformers  # noqa: F401
    except ImportError:
        pytest.skip("transformers not installed")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    secret = dcc.IpcComm.generate_secret()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    steps = 4
    procs = [ctx.Process(target=_fp8_trainer, args=(address, secret, queue, steps)),
             ctx.Process(target=_fp8_receiver, args=(address, secret, queue))]
    for p in procs:
        p.start()
    got = {}
    try:
        while len(got) < 2:
            try:
                msg = queue.get(timeout=5)
            except Exception:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"a process failed: exit codes {[p.exitcode for p in procs]}"
                continue
            got[msg[0]] = msg[1:]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    reports, wants = got["trainer"]
    (states,) = got["receiver"]
    assert len(states) == len(wants) == steps + 1
    for k, (want, state) in enumerate(zip(wants, states)):
        for n, w in want.items():
            assert state[n].tobytes() == w.tobytes(), f"sync {k}: {n}"
    assert reports[0]["kind"] == "seed"
    assert all(r["kind"] in ("delta", "dense") and r["changed"] > 0 for r in reports[1:]), reports
