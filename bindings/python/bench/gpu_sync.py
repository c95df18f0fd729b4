#!/usr/bin/env python3
"""GPU sync benchmark: deltacast against a full NCCL broadcast and a plain PyTorch delta.

    python bindings/python/bench/gpu_sync.py --model 0.5b|7b --transport nvlink|socket
                                              [--steps 8] [--warmup-steps 1] [--out DIR]
    python bindings/python/bench/gpu_sync.py --model 0.5b --transport ipc [--same-gpu] [...]
    python bindings/python/bench/gpu_sync.py --cpu-smoke [--steps 3] [--out DIR]

Two processes, started by this script (torch.multiprocessing.spawn, MASTER_ADDR=127.0.0.1):
rank 0 is the trainer on cuda:0, rank 1 the receiver on cuda:1. NCCL does not put two ranks of
one communicator on one GPU (communicator set-up fails with "Duplicate GPU detected"; NCCL's
maintainers call it unsupported, NVIDIA/nccl issue 418), so with fewer than two GPUs
--transport nvlink/socket says so and exits 0 (SKIPPED).

--transport ipc runs without NCCL: both processes on cuda:0 when only one GPU is visible (or
with --same-gpu; else cuda:0 and cuda:1), torch.distributed over gloo for control messages
(CPU tensors, each sent after the sender's GPU work it announces has finished), and each
method's bytes by CUDA IPC: (a) and (b) through a bucket on the trainer's GPU that the
receiver mapped once (torch's reduce_tensor handle; per bucket the trainer fills it and says
so, the receiver copies out of it, on another GPU first into a bucket of its own, and says so),
(c) through deltacast's IpcComm. Where the descriptions below say "broadcast" and "NCCL
all-reduce", read those. The output file gets an _onegpu suffix when both ran on cuda:0.

The trainer holds a Qwen2 model built from a config at Qwen2.5-0.5B or Qwen2.5-7B shape (random
init in fp32, nothing downloaded); the fp32 tensors become the masters and the model is converted
to BF16: its parameters are the weights that get synced (--master-init bf16: init in BF16,
masters copied from it, so they start on the BF16 grid and fewer elements change in the first
steps). Training runs the optimizer inside backward (a post-accumulate-grad hook per
parameter: fp32 grad, one AdamW(lr=1e-6) step on the master, both grads freed), then copies the
masters into the BF16 parameters. The loss is policy-gradient style: random tokens (2x64),
random actions, random advantages of +-1, loss = -mean(adv * logprob(action)).

Every step (after one optimizer step) syncs the new BF16 weights three ways, in this order, each
on the same two processes and timed by the trainer as wall time from its first call until the
receiver has applied:

  (a) full    torch.distributed NCCL broadcast of all BF16 bytes in 512 MiB buckets (pack into a
              preallocated bucket, broadcast, receiver unpacks) into the receiver's copy B;
  (b) plain   plain PyTorch delta: per parameter bit compare against the trainer's snapshot
              (view int16, !=), nonzero, int32 positions (per parameter) + BF16 values packed
              into 512 MiB buckets; the per-parameter counts are broadcast first; the receiver
              index_copy_'s into its copy C;
  (c) deltacast  GpuSender.sync() / GpuReceiver.receive() into the receiver's model A (the HF
              model whose parameters are its named tensors).

Ack: every method ends with one NCCL all-reduce of a tiny status tensor that the receiver enters
only after its apply, and the trainer's clock stops when that all-reduce has completed on its
GPU. For (a) and (b) that all-reduce is torch's (1 int32 element), issued right after the apply;
for (c) it is deltacast's own (sync() returns after every receiver has applied, checked its
digest and acked). Before each timed method both ranks meet at an untimed barrier.

(b) and (c) share one snapshot: a list of BF16 tensors the trainer allocates and passes to
GpuSender(snapshots=...). (b) runs before (c) each step and reads the snapshot as (c) left it;
(c) refreshes it in place. (b) does not refresh the snapshot itself, which favours the baseline
by the cost of that refresh (a real plain delta sync would also have to update its snapshot).
When (c) does not run (deltacast not importable, or no CUDA: the CPU smoke), (b) refreshes the
snapshot itself after its timed region, untimed.

Step 0: seed for (c), a full copy (the (a) path) into B and into C. Then --warmup-steps steps
(default 1) run all three methods but are left out of the medians; then --steps timed steps.

Correctness, every step, on the receiver: B is a fresh full broadcast of the trainer's bytes, so
A == B and C == B bit for bit (torch.equal on int16 views) means A and C equal the trainer's BF16
weights. deltacast's digest check counts too (receive() raises on a mismatch; counted, then both
sides reseed). The trainer also checks that the snapshot equals its weights after (c). At the end,
greedy generation (32 new tokens, 4 fixed prompts of token ids) from the trainer's model and from
the receiver's model A; the token ids must be identical.

Output: a progress line per step, a table, and JSON at DIR/gpu_sync_<model>_<transport>.json
(DIR/gpu_sync_tiny_cpu.json for the smoke). Exit status: 0 when every check passed (or SKIPPED),
1 on any mismatch, digest error or generation difference, 3 when deltacast's GPU path was not
available on a GPU run (the baselines still run and are written).

Environment: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1
are always set (NVLink multicast stays off). --transport socket sets NCCL_P2P_DISABLE=1 and
NCCL_SHM_DISABLE=1 (NCCL over sockets on loopback: a cross-node proxy; also NCCL_IB_DISABLE=1
and NCCL_SOCKET_IFNAME=lo unless set); --transport nvlink removes those two if inherited. All
of it is set before any NCCL communicator exists, in both processes.

--cpu-smoke: a tiny Qwen2 config (hidden 64, 2 layers, vocab 512), gloo, two CPU processes; runs
(a), (b), the comparisons and the generation check; (c) is skipped with the reason.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import socket
import sys
import time
import traceback

from gpu_sync_report import (  # noqa: E402  (the bench's folder is on sys.path)
    MIB,
    SHAPES,
    fmt_bytes,
    log,
    out_name,
    report,
)

# ----------------------------------------------------------------------------- environment


def set_transport_env(transport: str) -> None:
    """NCCL settings; called in the parent before spawn and again in each child."""
    # Machine rule: NVLink multicast stays off, whatever was inherited.
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
    if transport == "socket":
        os.environ["NCCL_P2P_DISABLE"] = "1"
        os.environ["NCCL_SHM_DISABLE"] = "1"
        os.environ.setdefault("NCCL_IB_DISABLE", "1")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    elif transport == "nvlink":
        os.environ.pop("NCCL_P2P_DISABLE", None)
        os.environ.pop("NCCL_SHM_DISABLE", None)
    # Fewer fragments at 7B, where the trainer's memory is tight.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- torch helpers
# torch is imported inside the functions so that `--help` and the skip path stay fast.


class Ctx:
    """What both ranks share: rank, device, store, and a few collectives. With ``ipc`` the
    process group is gloo (NCCL refuses two ranks on one GPU): control messages are CPU
    tensors, and GPU work is synchronised before each of them."""

    def __init__(self, rank, device, store, cpu, ipc=False):
        import torch
        self.torch = torch
        self.rank = rank
        self.device = device
        self.store = store
        self.cpu = cpu
        self.ipc = ipc
        # Where control tensors live: the GPU for NCCL, the host for gloo.
        self.ctl = torch.device("cpu") if ipc or cpu else device

    def cuda_sync(self):
        if not self.cpu:
            self.torch.cuda.synchronize(self.device)

    def meet(self):
        """Both ranks at one point (host only; the caller synchronised what it must)."""
        import torch.distributed as dist
        dist.all_reduce(self.torch.zeros(1, dtype=self.torch.int32, device=self.ctl))

    def barrier(self):
        """Untimed meeting point: both ranks idle, all queued GPU work done."""
        import torch.distributed as dist
        self.cuda_sync()
        t = self.torch.zeros(1, dtype=self.torch.int32, device=self.ctl)
        dist.all_reduce(t)
        self.cuda_sync()

    def ack(self, status: int = 1):
        """The receiver's acknowledgement for (a) and (b): one all-reduce of one int32, entered
        by the receiver after its apply was queued on its stream (so it completes only after
        the apply; over gloo the receiver first waits for its GPU). Returns the summed
        status."""
        import torch.distributed as dist
        if self.ipc:
            self.cuda_sync()
        t = self.torch.full((1,), status, dtype=self.torch.int32, device=self.ctl)
        dist.all_reduce(t)
        return t

    def broadcast_ints(self, values, n):
        """The trainer's ``n`` int64 values to both ranks (timed: part of (b))."""
        import torch.distributed as dist
        t = (self.torch.tensor(values, dtype=self.torch.int64, device=self.ctl)
             if self.rank == 0 else self.torch.empty(n, dtype=self.torch.int64, device=self.ctl))
        dist.broadcast(t, src=0)
        return t.tolist()

    def sum_ints(self, values):
        """Untimed exchange of a few counters (summed over both ranks)."""
        import torch.distributed as dist
        t = self.torch.tensor(values, dtype=self.torch.int64, device=self.ctl)
        dist.all_reduce(t)
        return [int(x) for x in t.tolist()]


class NcclBucket:
    """A bucket each rank holds, moved by one torch.distributed NCCL broadcast."""

    def __init__(self, ctx, nbytes, name):
        import torch
        self.buf = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)

    def send(self, n):
        import torch.distributed as dist
        dist.broadcast(self.buf[:n], src=0)

    def recv_begin(self, n):
        import torch.distributed as dist
        dist.broadcast(self.buf[:n], src=0)
        return self.buf[:n]

    def recv_end(self):
        pass


class IpcBucket:
    """A bucket on the trainer's GPU that the receiver maps by CUDA IPC (torch's
    ``reduce_tensor`` handle, shared once through the store), as colocated RL systems hand
    weights to an inference engine: the trainer fills it, waits for its GPU and says so; the
    receiver copies out of it, waits for its GPU and says so; then the trainer may refill."""

    def __init__(self, ctx, nbytes, name):
        import pickle
        import torch
        from torch.multiprocessing.reductions import reduce_tensor
        self.ctx = ctx
        if ctx.rank == 0:
            self.buf = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
            ctx.store.set(f"ipc_{name}", pickle.dumps(reduce_tensor(self.buf)))
        else:
            rebuild, rargs = pickle.loads(ctx.store.get(f"ipc_{name}"))
            self.buf = rebuild(*rargs)
        # On another GPU the receiver first copies the bucket to its own (one peer copy),
        # then unpacks there.
        self.local = (torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
                      if self.buf.device != ctx.device else None)
        ctx.meet()  # the receiver has mapped it before the trainer goes on

    def send(self, n):
        self.ctx.cuda_sync()
        self.ctx.meet()  # filled
        self.ctx.meet()  # drained

    def recv_begin(self, n):
        self.ctx.meet()
        if self.local is None:
            return self.buf[:n]
        self.local[:n].copy_(self.buf[:n])
        return self.local[:n]

    def recv_end(self):
        self.ctx.cuda_sync()
        self.ctx.meet()


def make_config(name: str):
    from transformers import Qwen2Config
    cfg = Qwen2Config(**SHAPES[name], max_position_embeddings=32768, rms_norm_eps=1e-6,
                      use_sliding_window=False, attention_dropout=0.0)
    return cfg


def build_model(cfg, device, seed: int, fp32_masters: bool = False):
    """The HF Qwen2 model, random init, built directly on `device`; returns (model, masters).

    fp32_masters: built in fp32, those fp32 tensors kept as the masters, and the model then
    converted to BF16 (the usual mixed-precision state: masters off the BF16 grid). Else built
    in BF16, masters None (the trainer makes them from the BF16 values)."""
    import torch
    from transformers import Qwen2ForCausalLM
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32 if fp32_masters else torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    masters = None
    if fp32_masters:
        # The fp32 storages live on as the masters; the parameters get new BF16 storage.
        masters = [p.detach() for p in model.parameters()]
        # Buffers (rotary inv_freq) are not synced and must stay as a BF16-built model has
        # them (fp32): `.to()` would round them to BF16, and generation would differ from the
        # receiver's for that reason alone.
        buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        model.to(torch.bfloat16)
        for n, b in model.named_buffers():
            b.data = buffers[n]
    model.eval()  # no dropout anywhere; eval keeps generation and training identical in mode
    for n, p in model.named_parameters():
        if p.dtype != torch.bfloat16 or not p.is_contiguous():
            raise SystemExit(f"gpu_sync: parameter {n} is {p.dtype}, "
                             f"contiguous={p.is_contiguous()}")
    return model, masters


class Trainer:
    """fp32 masters + per-parameter AdamW run inside backward; the BF16 params are synced."""

    def __init__(self, model, masters, lr, device, cpu, batch, seq, seed):
        import torch
        self.torch = torch
        self.model = model
        self.device = device
        self.batch, self.seq = batch, seq
        self.vocab = model.config.vocab_size
        self.params = [p for _, p in model.named_parameters()]
        if masters is None:
            # .float() of a BF16 tensor is already a new tensor: no extra clone (memory at 7B).
            masters = [p.detach().float() for p in self.params]
        assert len(masters) == len(self.params)
        assert all(m.dtype == torch.float32 and m.shape == p.shape
                   for m, p in zip(masters, self.params))
        self.masters = masters
        kw = dict(lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        if not cpu:
            kw["fused"] = True
        else:
            kw["foreach"] = False
        self.opts = [torch.optim.AdamW([m], **kw) for m in self.masters]
        for p, m, o in zip(self.params, self.masters, self.opts):
            p.register_post_accumulate_grad_hook(self._hook(m, o))
        self.gen = torch.Generator().manual_seed(seed + 1000)

    @staticmethod
    def _hook(master, opt):
        def hook(p):
            master.grad = p.grad.float()
            p.grad = None
            opt.step()
            master.grad = None
        return hook

    def step(self):
        torch = self.torch
        shape = (self.batch, self.seq)
        ids = torch.randint(0, self.vocab, shape, generator=self.gen).to(self.device)
        actions = torch.randint(0, self.vocab, shape, generator=self.gen).to(self.device)
        adv = (torch.randint(0, 2, shape, generator=self.gen) * 2 - 1).float().to(self.device)
        logits = self.model(input_ids=ids, use_cache=False).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        lp = logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        loss = -(adv * lp).mean()
        loss.backward()  # the optimizer steps happen in the hooks
        del logits, logp, lp
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                p.copy_(m)
        return float(loss.detach())


def bytes_view(t):
    """A contiguous tensor as a flat uint8 view (no copy)."""
    import torch
    return t.reshape(-1).view(torch.uint8)


class FullBroadcast:
    """(a): the usual full sync. The model's bytes as one stream cut in bucket-size pieces (a
    tensor larger than a bucket spans several); pack, broadcast, unpack; one bucket buffer."""

    def __init__(self, ctx, tensors, bucket_bytes):
        import torch
        self.ctx = ctx
        sizes = [t.numel() * t.element_size() for t in tensors]
        self.total = sum(sizes)
        self.plan = []  # [(used, [(tensor index, src byte offset, length, bucket offset)])]
        pieces, used = [], 0
        for i, n in enumerate(sizes):
            off = 0
            while off < n:
                take = min(n - off, bucket_bytes - used)
                pieces.append((i, off, take, used))
                used += take
                off += take
                if used == bucket_bytes:
                    self.plan.append((used, pieces))
                    pieces, used = [], 0
        if used:
            self.plan.append((used, pieces))
        self.bucket = (IpcBucket if ctx.ipc else NcclBucket)(
            ctx, min(bucket_bytes, max(self.total, 1)), "full")

    def send(self, tensors):
        flat = [bytes_view(t) for t in tensors]
        b = self.bucket.buf
        for used, pieces in self.plan:
            for i, src, n, dst in pieces:
                b[dst:dst + n].copy_(flat[i][src:src + n])
            self.bucket.send(used)
        return self.ctx.ack()

    def recv(self, targets):
        flat = [bytes_view(t) for t in targets]
        for used, pieces in self.plan:
            b = self.bucket.recv_begin(used)
            for i, src, n, dst in pieces:
                flat[i][src:src + n].copy_(b[dst:dst + n])
            self.bucket.recv_end()
        return self.ctx.ack()


class PlainDelta:
    """(b): what one would write in plain PyTorch. Entries are (int32 position within its
    parameter, BF16 value), 6 bytes; a bucket holds up to bucket_bytes // 6 entries, its
    positions first, then its values. The per-parameter counts go first (one int64 each)."""

    ENTRY = 6

    def __init__(self, ctx, tensors, bucket_bytes):
        import torch
        self.ctx = ctx
        self.n = len(tensors)
        self.cap = bucket_bytes // self.ENTRY
        self.xfer = (IpcBucket if ctx.ipc else NcclBucket)(ctx, self.cap * self.ENTRY, "plain")
        self.bucket = self.xfer.buf

    def _buckets(self, counts):
        """For every bucket: (entries, [(param, first entry within it, length, bucket slot)])."""
        total = sum(counts)
        out, segs, fill = [], [], 0
        for i, c in enumerate(counts):
            a = 0
            while a < c:
                take = min(c - a, self.cap - fill)
                segs.append((i, a, take, fill))
                fill += take
                a += take
                if fill == self.cap:
                    out.append((fill, segs))
                    segs, fill = [], 0
        if fill:
            out.append((fill, segs))
        assert sum(f for f, _ in out) == total
        return out

    def _views(self, k, bucket=None):
        import torch
        b = self.bucket if bucket is None else bucket
        pos = b[:4 * k].view(torch.int32)
        val = b[4 * k:6 * k].view(torch.bfloat16)
        return pos, val

    def send(self, cur, snaps):
        import torch
        idxs, vals = [], []
        for c, s in zip(cur, snaps):
            ne = c.view(torch.int16) != s.view(torch.int16)
            idx = ne.flatten().nonzero().squeeze(1).to(torch.int32)
            idxs.append(idx)
            vals.append(c.flatten()[idx])
        del ne
        counts = [int(i.numel()) for i in idxs]
        self.ctx.broadcast_ints(counts, self.n)
        for k, segs in self._buckets(counts):
            pos, val = self._views(k)
            for i, a, n, off in segs:
                pos[off:off + n].copy_(idxs[i][a:a + n])
                val[off:off + n].copy_(vals[i][a:a + n])
            self.xfer.send(self.ENTRY * k)
        self.ctx.ack()
        return sum(counts)

    def recv(self, targets):
        counts = self.ctx.broadcast_ints(None, self.n)
        flat = [t.view(-1) for t in targets]
        for k, segs in self._buckets(counts):
            pos, val = self._views(k, self.xfer.recv_begin(self.ENTRY * k))
            for i, _, n, off in segs:
                # index_copy_ takes int64 indices only: widen on the receiver (wire stays int32).
                flat[i].index_copy_(0, pos[off:off + n].long(), val[off:off + n])
            self.xfer.recv_end()
        self.ctx.ack()
        return sum(counts)

    def wire_bytes(self, changed):
        return 8 * self.n + self.ENTRY * changed


def mismatches(xs, ys) -> int:
    """Number of tensors whose bits differ (int16 views: exact, NaN- and -0-proof)."""
    import torch
    return sum(0 if torch.equal(x.view(torch.int16), y.view(torch.int16)) else 1
               for x, y in zip(xs, ys))


# ----------------------------------------------------------------------------- deltacast


def deltacast_probe(cpu: bool):
    """(module, base error class, None) when the GPU path can run here, else (None, None, why).

    Testing hook: GPU_SYNC_DELTACAST_MODULE names a stand-in module with deltacast.cuda's API
    and a DeltacastError class, used instead (also in the CPU smoke) to exercise the (c) code
    path of this script where there is no GPU."""
    stand_in = os.environ.get("GPU_SYNC_DELTACAST_MODULE")
    if cpu and not stand_in:
        return None, None, "CPU smoke: deltacast's GPU path needs CUDA tensors"
    try:
        if stand_in:
            import importlib
            dcc = importlib.import_module(stand_in)
            base = dcc.DeltacastError
        else:
            import deltacast
            import deltacast.cuda as dcc
            base = deltacast.DeltacastError
    except Exception as e:  # noqa: BLE001 - any import failure is a reason to skip
        name = stand_in or "deltacast.cuda"
        return None, None, f"import {name} failed: {type(e).__name__}: {e}"
    try:
        ok, why = dcc.available()
    except Exception as e:  # noqa: BLE001
        return None, None, f"deltacast.cuda.available() raised {type(e).__name__}: {e}"
    if not ok:
        return None, None, f"deltacast.cuda.available() is False: {why}"
    return dcc, base, None


# ----------------------------------------------------------------------------- the run


def worker(rank: int, args, port: int):
    try:
        code = run_rank(rank, args, port)
    except SystemExit:
        raise
    except BaseException:
        log(f"[rank {rank}] FAILED:\n{traceback.format_exc()}")
        raise
    # mp.spawn has no return values: the parent reads the outcome from the JSON rank 0 wrote.
    return code


def run_rank(rank: int, args, port: int):
    set_transport_env(args.transport)
    import numpy as np
    import torch
    import torch.distributed as dist

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    cpu = args.cpu_smoke
    ipc = args.transport == "ipc"
    if cpu:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    else:
        device = torch.device("cuda", args.devices[rank])
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=args.timeout_s)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timeout)
    kw = dict(backend="gloo" if cpu or ipc else "nccl", store=store, rank=rank, world_size=2,
              timeout=timeout)
    if not cpu and not ipc:
        kw["device_id"] = device
    try:
        dist.init_process_group(**kw)
    except TypeError:  # an older torch without device_id
        kw.pop("device_id", None)
        dist.init_process_group(**kw)
    ctx = Ctx(rank, device, store, cpu, ipc)
    ctx.barrier()  # torch's communicator exists from here on

    cfg = make_config(args.model)
    t0 = time.perf_counter()
    # Different init seeds on purpose: the receiver's initial weights must not matter.
    model, masters = build_model(cfg, device, args.seed if rank == 0 else args.seed + 1,
                                 fp32_masters=rank == 0 and args.master_init == "fp32")
    named = [(n, p.detach()) for n, p in model.named_parameters()]
    tensors = [t for _, t in named]
    numel = sum(t.numel() for t in tensors)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    sig = json.dumps([(n, list(t.shape), str(t.dtype)) for n, t in named])
    store.set(f"sig{rank}", sig)
    if store.get(f"sig{1 - rank}").decode() != sig:
        raise SystemExit("gpu_sync: trainer and receiver enumerate different parameters")
    trainer = None
    if rank == 0:
        trainer = Trainer(model, masters, args.lr, device, cpu, args.batch, args.seq, args.seed)
        snaps = [t.clone() for t in tensors]  # shared by (b) and (c); (c) seeds it
        B = C = None
        del masters
    else:
        B = [torch.empty_like(t) for t in tensors]
        C = [torch.empty_like(t) for t in tensors]
    build_s = time.perf_counter() - t0
    if rank == 0:
        log(f"gpu_sync: model {args.model} ({len(tensors)} tensors, {numel / 1e6:.2f}M elements, "
            f"{fmt_bytes(nbytes)} BF16), transport {args.transport}, "
            f"{'gloo/CPU' if cpu else torch.cuda.get_device_name(device)}"
            f"{' (both processes on cuda:0)' if ipc and args.devices[1] == 0 else ''}, "
            f"built in {build_s:.1f} s")

    # deltacast: both ranks must agree that it runs.
    dcc, dc_error, why = deltacast_probe(cpu)
    both = ctx.sum_ints([0 if dcc is None else 1])[0]
    if dcc is not None and both != 2:
        dcc, why = None, "deltacast.cuda is not available on the other rank"
    use_dc = dcc is not None
    if not use_dc and rank == 0:
        log(f"gpu_sync: (c) deltacast SKIPPED: {why}")

    bucket = int(args.bucket_mib * MIB)
    full = FullBroadcast(ctx, tensors, bucket)
    plain = PlainDelta(ctx, tensors, bucket)

    sender = receiver = None
    dc_errors = (Exception,)
    if use_dc:
        if not cpu:
            torch.cuda.empty_cache()  # hand torch's cached blocks back before deltacast allocates
        ordinal = rank if cpu else device.index  # cpu: only with a stand-in module
        if ipc:
            if rank == 0:
                store.set("deltacast_ipc", f"127.0.0.1:{free_port()}")
                store.set("deltacast_ipc_secret", dcc.IpcComm.generate_secret())
            address = store.get("deltacast_ipc").decode()
            secret = store.get("deltacast_ipc_secret").decode()
            comm = dcc.IpcComm(address, 2, rank, ordinal, timeout_s=args.timeout_s,
                               secret=secret)
        else:
            if rank == 0:
                uid = dcc.nccl_unique_id()
                store.set("deltacast_uid", uid)
            else:
                uid = store.get("deltacast_uid")
            comm = dcc.NcclComm(bytes(uid), 2, rank, ordinal)
        stage_kw = ({} if args.stage_mib is None
                    else {"stage_bytes": int(args.stage_mib * (1 << 20))})
        if rank == 0:
            capacity_kw = {} if args.capacity is None else {"capacity": args.capacity}
            sender = dcc.GpuSender(comm, named, device=ordinal, root=0, snapshots=snaps,
                                   chunk_elems=args.chunk_elems, entropy=args.entropy,
                                   **capacity_kw, **stage_kw)
        else:
            receiver = dcc.GpuReceiver(comm, named, device=ordinal, root=0)
        dc_errors = (dc_error,)

    rows = []  # trainer's rows (rank 0) / receiver's rows (rank 1)
    totals = {"mismatch_A": 0, "mismatch_C": 0, "digest_errors": 0, "deltacast_errors": 0,
              "snapshot_stale": 0, "reseeds": 0, "changed_disagree": 0}

    def timed(fn):
        ctx.barrier()
        t = time.perf_counter()
        out = fn()
        ctx.cuda_sync()
        return (time.perf_counter() - t) * 1e3, out

    def dc_call(kind):
        """(c) on this rank; returns (ms, info or None, error string or None)."""
        try:
            if rank == 0:
                ms, info = timed(sender.seed if kind == "seed" else sender.sync)
            else:
                ms, info = timed(receiver.receive)
            return ms, dict(info), None
        except dc_errors as e:
            return None, None, f"{type(e).__name__}: {e}"

    def dc_step(step, phase, kind):
        ms, info, err = dc_call(kind)
        digest = int(err is not None and "Digest" in err)
        flags = ctx.sum_ints([int(err is not None), digest])
        if flags[0]:
            if err:
                log(f"[rank {rank}] deltacast {kind} at step {step} failed: {err}")
            totals["deltacast_errors"] += int(err is not None)
            totals["digest_errors"] += digest
            # Recover the way a deployment would: a fresh seed (untimed).
            ms2, info2, err2 = dc_call("seed")
            totals["reseeds"] += 1
            if err2:
                raise RuntimeError(f"deltacast reseed failed after {err}: {err2}")
        row = {"method": "deltacast", "step": step, "phase": phase, "time_ms": ms,
               "error": err}
        if info:
            row.update({"kind": info.get("kind"), "version": info.get("version"),
                        "changed": info.get("changed"), "numel": info.get("numel", numel),
                        "wire_bytes": info.get("payload_bytes"),
                        "chunks": info.get("chunks"), "diff_ms": info.get("diff_ms"),
                        "deltacast_time_ms": info.get("time_ms"),
                        "entropy": info.get("entropy"),
                        "steps": info.get("steps"),
                        "stages": info.get("stages"),
                        "dense_stages": info.get("dense_stages"),
                        "bitmap_stages": info.get("bitmap_stages"),
                        "phases_ms": info.get("phases_ms"),
                        "choice": info.get("choice")})
            if info.get("changed") is not None:
                row["changed_ratio"] = info["changed"] / numel
        return row

    # ---- step 0: full copies into B and C, seed for A.
    for target, copy in (("B", B), ("C", C)):
        if rank == 0:
            ms, _ = timed(lambda: full.send(tensors))
        else:
            ms, _ = timed(lambda copy=copy: full.recv(copy))
        rows.append({"method": "full", "step": 0, "phase": "init", "target": target,
                     "time_ms": ms, "wire_bytes": nbytes})
    if use_dc:
        rows.append(dc_step(0, "init", "seed"))
    else:
        rows.append({"method": "deltacast", "step": 0, "phase": "init", "skipped": why})
    check0 = check_receiver(ctx, rank, model, B, C, use_dc, totals)
    if rank == 0:
        seed = rows[-1]
        log(f"step 0 [init] full copy B {rows[0]['time_ms']:.1f} ms, C {rows[1]['time_ms']:.1f} ms"
            + (f", deltacast seed {seed['time_ms']:.1f} ms ({fmt_bytes(seed.get('wire_bytes'))})"
               if use_dc and seed.get("time_ms") is not None else "")
            + f"; mismatching tensors A {check0[0]} C {check0[1]}")

    # ---- the steps.
    nsteps = args.warmup_steps + args.steps
    for step in range(1, nsteps + 1):
        phase = "warmup" if step <= args.warmup_steps else "timed"
        train_ms = loss = None
        if rank == 0:
            ctx.cuda_sync()
            t = time.perf_counter()
            loss = trainer.step()
            ctx.cuda_sync()
            train_ms = (time.perf_counter() - t) * 1e3
        # (a)
        if rank == 0:
            ms, _ = timed(lambda: full.send(tensors))
        else:
            ms, _ = timed(lambda: full.recv(B))
        ra = {"method": "full", "step": step, "phase": phase, "time_ms": ms, "wire_bytes": nbytes}
        # (b) before (c): it reads the snapshot as (c) left it after the previous step.
        if rank == 0:
            ms, changed = timed(lambda: plain.send(tensors, snaps))
        else:
            ms, changed = timed(lambda: plain.recv(C))
        if rank == 1 and step == args.inject_corruption:
            with torch.no_grad():  # testing the checks: flip one bit of C (the lowest of C[0][0])
                C[0].view(-1)[:1].view(torch.int16).bitwise_xor_(1)
            log(f"[rank 1] --inject-corruption: flipped one bit of C after step {step}")
        rb = {"method": "plain", "step": step, "phase": phase, "time_ms": ms, "changed": changed,
              "changed_ratio": changed / numel, "wire_bytes": plain.wire_bytes(changed)}
        ra["changed_ratio"] = rb["changed_ratio"]
        # (c)
        if use_dc:
            rc = dc_step(step, phase, "sync")
            if rank == 0:
                # deltacast refreshes the shared snapshot in place; it must now equal the weights.
                stale = mismatches(snaps, tensors)
                totals["snapshot_stale"] += stale
                dc_changed = rc.get("changed")
                if dc_changed is not None and dc_changed != changed and not rc.get("error"):
                    totals["changed_disagree"] += 1
                    log(f"  note: deltacast counted {rc['changed']} changed elements, "
                        f"the plain delta {changed}")
        else:
            rc = {"method": "deltacast", "step": step, "phase": phase, "skipped": why}
            if rank == 0:
                with torch.no_grad():
                    for s, t in zip(snaps, tensors):
                        s.copy_(t)  # untimed: nobody else refreshes the snapshot
        rows += [ra, rb, rc]
        ma, mc = check_receiver(ctx, rank, model, B, C, use_dc, totals)
        if rank == 0:
            rows.append({"method": "train", "step": step, "phase": phase, "time_ms": train_ms,
                         "loss": loss})
            dc_txt = "skipped"
            if use_dc:
                how = rc.get("kind")
                how = f"{how}, steps code" if rc.get("steps") else \
                    f"{how}, entropy codecs" if rc.get("entropy") else \
                    f"{how}, bitmap diff" if rc.get("bitmap_stages") else how
                dc_txt = (f"{rc['time_ms']:.1f} ms ({how}, "
                          f"{fmt_bytes(rc.get('wire_bytes'))})" if rc.get("time_ms") is not None
                          else f"ERROR {rc.get('error')}")
            log(f"step {step}/{nsteps} [{phase}] changed {100 * rb['changed_ratio']:.2f}%  "
                f"full {ra['time_ms']:.1f} ms  plain {rb['time_ms']:.1f} ms "
                f"({fmt_bytes(rb['wire_bytes'])})  deltacast {dc_txt}  "
                f"mismatching tensors A {ma} C {mc}  (train {train_ms:.0f} ms, loss {loss:.4f})")

    # ---- greedy generation: trainer's model vs the receiver's model A.
    gen = generation_check(ctx, rank, args, model, C, use_dc)

    # torch's own peaks (deltacast allocates outside torch's allocator: not counted here).
    mem = None if cpu else {"max_allocated": torch.cuda.max_memory_allocated(device),
                            "max_reserved": torch.cuda.max_memory_reserved(device)}
    if rank == 1:
        store.set("receiver_report", json.dumps({"rows": rows, "totals": totals,
                                                 "torch_memory": mem}))
    ctx.barrier()
    code = 0
    if rank == 0:
        recv = json.loads(store.get("receiver_report").decode())
        code = report(args, rows, recv, totals, gen, use_dc, why, numel, nbytes, len(tensors),
                      mem, build_s, torch, cfg)
        store.set("done", "1")
    else:
        store.get("done")  # keep the store's server (rank 0) alive until rank 0 has read
    dist.destroy_process_group()
    return code


def check_receiver(ctx, rank, model, B, C, use_dc, totals):
    """Receiver: A == B and C == B bit for bit (B = this step's full broadcast of the trainer's
    bytes). The counts are shared with the trainer; returns (A mismatches, C mismatches)."""
    ma = mc = 0
    if rank == 1:
        A = [p.detach() for p in model.parameters()]
        ma = mismatches(A, B) if use_dc else 0
        mc = mismatches(C, B)
    ma, mc = ctx.sum_ints([ma, mc])
    totals["mismatch_A"] += ma
    totals["mismatch_C"] += mc
    return ma, mc


def generation_check(ctx, rank, args, model, C, use_dc):
    import torch
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(4321)
    prompts = torch.randint(0, vocab, (4, args.prompt_len), generator=g)
    source = "A (deltacast)" if use_dc else "A loaded from C (plain delta; deltacast skipped)"
    if rank == 1 and not use_dc:
        # Without deltacast, A was never synced: load the plain delta's copy C into it, so the
        # generation check still compares a receiver-side model with the trainer's.
        with torch.no_grad():
            for p, c in zip(model.parameters(), C):
                p.copy_(c)
    ids = prompts.to(ctx.device)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=args.gen_tokens, pad_token_id=0)
    tokens = out[:, ids.shape[1]:].cpu().tolist()
    ctx.store.set(f"gen{rank}", json.dumps(tokens))
    other = json.loads(ctx.store.get(f"gen{1 - rank}").decode())
    mine_is_trainer = rank == 0
    trainer_tokens = tokens if mine_is_trainer else other
    receiver_tokens = other if mine_is_trainer else tokens
    return {"identical": trainer_tokens == receiver_tokens, "receiver_model": source,
            "prompts": prompts.tolist(), "trainer": trainer_tokens, "receiver": receiver_tokens}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(SHAPES), default=None,
                    help="model shape (default 0.5b; tiny with --cpu-smoke)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps (default 8)")
    ap.add_argument("--warmup-steps", type=int, default=1,
                    help="steps that run every method but stay out of the medians (default 1)")
    ap.add_argument("--transport", choices=["nvlink", "socket", "ipc"], default="nvlink",
                    help="nvlink / socket: NCCL (two GPUs); ipc: CUDA IPC for all three "
                         "methods, gloo for control (two processes on one GPU, or two GPUs)")
    ap.add_argument("--same-gpu", action="store_true",
                    help="with --transport ipc: both processes on cuda:0 even when a second "
                         "GPU is visible (the default when only one is)")
    ap.add_argument("--out", default="bench-out", help="folder for the JSON (default bench-out)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny model, gloo, two CPU processes; (c) skipped")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--master-init", choices=["fp32", "bf16"], default="fp32",
                    help="fp32: random init in fp32 kept as the masters, BF16 weights rounded "
                         "from it (default); bf16: init in BF16, masters start on the BF16 grid "
                         "(fewer elements change in the first steps)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bucket-mib", type=float, default=512, help="bucket size of (a) and (b)")
    ap.add_argument("--chunk-elems", type=int, default=1 << 20, help="deltacast chunk_elems")
    ap.add_argument("--capacity", type=float, default=None,
                    help="deltacast capacity (default: the library's DEFAULT_CAPACITY)")
    ap.add_argument("--entropy", choices=["auto", "on", "off"], default="auto",
                    help="deltacast's entropy codecs (gaps + ulp): auto (default: measures "
                         "both, keeps the faster), on, off (abs32/bitmap + raw only)")
    ap.add_argument("--stage-mib", type=float, default=None,
                    help="deltacast's stage size in MiB (default: the library's, 2048; 0: one "
                         "stage)")
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--inject-corruption", type=int, default=-1, metavar="STEP",
                    help="testing the checks: the receiver flips one bit of C after (b) at STEP")
    ap.add_argument("--timeout-s", type=int, default=300,
                    help="store and process-group timeout (a hang fails after this)")
    args = ap.parse_args(argv)
    if args.model is None:
        args.model = "tiny" if args.cpu_smoke else "0.5b"
    if args.steps < 1 or args.warmup_steps < 0:
        ap.error("--steps must be >= 1 and --warmup-steps >= 0")
    if args.cpu_smoke:
        args.transport = "gloo"
    set_transport_env(args.transport)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("PYTHONUNBUFFERED", "1")

    import torch
    import torch.multiprocessing as mp

    args.devices = [0, 1]
    if not args.cpu_smoke:
        n = torch.cuda.device_count()
        if args.transport == "ipc" and n >= 1:
            args.devices = [0, 0] if n < 2 or args.same_gpu else [0, 1]
        elif n < 2:
            log(f"gpu_sync: SKIPPED: --transport {args.transport} needs two GPUs (trainer on "
                f"cuda:0, receiver on cuda:1), found {n}; NCCL cannot put both ranks on one "
                f"GPU (--transport ipc can). Nothing was measured.")
            return 0
    port = free_port()
    os.environ["MASTER_PORT"] = str(port)
    path = os.path.join(args.out, out_name(args))
    if os.path.exists(path):
        os.remove(path)  # never report an older run's result
    t = time.perf_counter()
    mp.spawn(worker, args=(args, port), nprocs=2, join=True)
    log(f"gpu_sync: both processes finished in {time.perf_counter() - t:.1f} s")
    if not os.path.exists(path):
        log("gpu_sync: FAILED: no result was written")
        return 1
    with open(path) as fh:
        res = json.load(fh)
    if not res["ok"]:
        return 1
    if not args.cpu_smoke and not res["deltacast"]["ran"]:
        log("gpu_sync: deltacast's GPU path did not run on a GPU machine (exit 3)")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
