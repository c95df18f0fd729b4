#!/usr/bin/env python3
"""fp32 trainer export benchmark (issue 26): deltacast over fp32 sources vs cast to BF16 + sync.

    python bindings/python/bench/gpu_fp32_export.py --model 0.5b|3b [--steps 8]
                                                     [--warmup-steps 1] [--lr 1e-6] [--out DIR]

A trainer like verl's: a Qwen2 model at Qwen2.5-0.5B or -3B shape built from a config (random
init, nothing downloaded) with fp32 parameters, torch.optim.AdamW(fused=True), and every step a
real forward/backward (BF16 autocast, fp32 grads) on random tokens: batch 2x64, random actions,
advantages of +-1, loss = -mean(adv * logprob(action)). The BF16 weights an inference engine
serves are exported from those fp32 parameters two ways, side by side in the same run:

  (A) fp32   GpuSender over the fp32 parameters themselves, wire_dtypes=torch.bfloat16: the
             sender rounds to BF16 inside its diff (no converted copy); bf16_nan=0x7FFF, what
             torch CUDA's cast gives, so (A) and (B) agree even on NaN;
  (B) cast   today's way: `buf.copy_(p)` of every parameter into persistent BF16 export
             buffers, then a GpuSender over those buffers (--cast foreach: one
             torch._foreach_copy_ instead of the per-parameter loop).

Two processes on one GPU (cuda:0), started by this script: rank 0 the trainer, rank 1 the
receiver with two BF16 copies of the weights, RA for (A) and RB for (B), each a GpuReceiver over
its own deltacast IpcComm (CUDA IPC; control over torch.distributed gloo). Each step, after the
optimizer step, (A) and (B) run one after the other, in alternating order (odd steps A first),
an untimed barrier before each. Each is timed by the trainer as wall time from the start of the
export until sync() returned, i.e. until the receiver had applied, checked its digest and acked
(as gpu_sync.py times); torch.cuda.synchronize() ends each. (B) is split into cast ms (CUDA
events around the casts, GPU time) and sync ms (the rest); no host synchronisation between the
two, so the sync's host work may overlap the casts' tail as it would in a trainer.

Correctness every step, independent of deltacast's digests: the trainer hands the receiver its
fp32 parameters once by CUDA IPC (torch's handles, as torch.multiprocessing shares them); after
both syncs, while the trainer waits at a barrier, the receiver casts each one itself
(`.to(torch.bfloat16)`) and compares the int16 views of RA and RB with it (torch.equal). It
also counts NaN in the fp32 parameters (none arise in this training; were there any, torch
CUDA's cast gives 0x7FFF, which (A)'s bf16_nan matches). A deltacast error (digest mismatch,
refusal) is counted and followed by a reseed of that method. --inject-corruption STEP flips one
bit of RA on the receiver after STEP's syncs, to see the check fail (exit 1). Step 0 seeds
both; --warmup-steps steps (default 1) run everything but stay out of the medians.

Output: a progress line per step, a table, and JSON at DIR/gpu_fp32_export_<model>.json: per
step A ms, B ms (cast ms, sync ms), A/B, wire bytes of each, changed fraction; the medians,
median(A)/median(B) and the acceptance (<= 0.6). Exit status: 0 every check passed (or no GPU:
SKIPPED), 1 a mismatch or a deltacast error, 3 deltacast's GPU path was not available.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import socket
import statistics
import sys
import time
import traceback

from gpu_sync_report import SHAPES  # noqa: E402  (the bench's folder is on sys.path)

ACCEPT = 0.6  # issue 26: (A) <= 0.6x (B)
NAN_BF16 = 0x7FFF  # torch CUDA's fp32 NaN -> bf16 (measured on an H200, commit 133b770)


def log(*a):
    print(*a, flush=True)


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deltacast_module():
    """(deltacast.cuda, its base error class, None) when the GPU path runs here, else
    (None, None, why). DELTACAST_FP32_BENCH_MODULE names a stand-in with the same API (to
    exercise this script where there is no GPU)."""
    import importlib
    name = os.environ.get("DELTACAST_FP32_BENCH_MODULE", "deltacast.cuda")
    try:
        dcc = importlib.import_module(name)
        base = dcc.DeltacastError if hasattr(dcc, "DeltacastError") else \
            importlib.import_module("deltacast").DeltacastError
        ok, why = dcc.available()
    except Exception as e:  # noqa: BLE001 - any failure is a reason not to run
        return None, None, f"{name}: {type(e).__name__}: {e}"
    return (dcc, base, None) if ok else (None, None, f"{name}.available() is False: {why}")


class Link:
    """Rank, device, the store and a gloo group for meetings (CPU tensors)."""

    def __init__(self, rank, device, store):
        import torch
        self.torch, self.rank, self.device, self.store = torch, rank, device, store
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def barrier(self):
        """Both ranks here with their GPU work done (untimed)."""
        import torch.distributed as dist
        self.sync()
        dist.all_reduce(self.torch.zeros(1, dtype=self.torch.int32))

    def sum_ints(self, values):
        import torch.distributed as dist
        t = self.torch.tensor(values, dtype=self.torch.int64)
        dist.all_reduce(t)
        return [int(x) for x in t.tolist()]


class Trainer:
    """fp32 parameters, fused AdamW, one forward/backward per step; the BF16 export buffers
    that (B) syncs."""

    def __init__(self, cfg, device, args):
        import torch
        from transformers import Qwen2ForCausalLM
        self.torch, self.device, self.args = torch, device, args
        torch.manual_seed(args.seed)
        with torch.device(device):
            self.model = Qwen2ForCausalLM(cfg).to(torch.float32)
        self.model.train()  # dropout is 0.0 in this config: train mode changes nothing else
        self.named = [(n, p) for n, p in self.model.named_parameters()]
        for n, p in self.named:
            if p.dtype != torch.float32 or not p.is_contiguous():
                raise SystemExit(f"gpu_fp32_export: {n} is {p.dtype}, contiguous "
                                 f"{p.is_contiguous()}")
        kw = dict(lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        if device.type == "cuda":
            kw["fused"] = True
        self.opt = torch.optim.AdamW([p for _, p in self.named], **kw)
        self.params = [p.detach() for _, p in self.named]
        self.bufs = [torch.empty_like(p, dtype=torch.bfloat16) for p in self.params]
        self.vocab = cfg.vocab_size
        self.gen = torch.Generator().manual_seed(args.seed + 1000)

    def step(self):
        torch = self.torch
        shape = (self.args.batch, self.args.seq)
        ids = torch.randint(0, self.vocab, shape, generator=self.gen).to(self.device)
        act = torch.randint(0, self.vocab, shape, generator=self.gen).to(self.device)
        adv = (torch.randint(0, 2, shape, generator=self.gen) * 2 - 1).float().to(self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            logits = self.model(input_ids=ids, use_cache=False).logits
        lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, act.unsqueeze(-1)).squeeze(-1)
        loss = -(adv * lp).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    def cast(self):
        """(B)'s export: every fp32 parameter into its BF16 buffer."""
        with self.torch.no_grad():
            if self.args.cast == "foreach":
                self.torch._foreach_copy_(self.bufs, self.params)
            else:
                for b, p in zip(self.bufs, self.params):
                    b.copy_(p)


def worker(rank, args, port):
    try:
        run_rank(rank, args, port)
    except SystemExit:
        raise
    except BaseException:
        log(f"[rank {rank}] FAILED:\n{traceback.format_exc()}")
        raise


def run_rank(rank, args, port):
    import torch
    import torch.distributed as dist
    import torch.multiprocessing.reductions  # noqa: F401  (registers torch's reductions)
    from multiprocessing.reduction import ForkingPickler
    from transformers import Qwen2Config

    cuda = not args.cpu
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.multiprocessing.set_sharing_strategy("file_system")  # CPU handles by name
    timeout = datetime.timedelta(seconds=args.timeout_s)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    link = Link(rank, device, store)
    cfg = Qwen2Config(**SHAPES[args.model], max_position_embeddings=32768, rms_norm_eps=1e-6,
                      use_sliding_window=False, attention_dropout=0.0)

    t0 = time.perf_counter()
    trainer = None
    if rank == 0:
        trainer = Trainer(cfg, device, args)
        sig = [(n, list(p.shape)) for n, p in trainer.named]
        store.set("sig", json.dumps(sig))
        # The independent check's source: the fp32 parameters themselves, mapped by the
        # receiver (no copy); it casts them with torch, outside deltacast.
        # (ForkingPickler: torch's reductions, a CUDA IPC handle per tensor, no bytes copied.)
        store.set("fp32", bytes(ForkingPickler.dumps(trainer.params)))
        names = [n for n, _ in sig]
    else:
        sig = json.loads(store.get("sig").decode())
        names = [n for n, _ in sig]
        RA = [torch.zeros(s, dtype=torch.bfloat16, device=device) for _, s in sig]
        RB = [torch.zeros(s, dtype=torch.bfloat16, device=device) for _, s in sig]
        fp32 = pickle.loads(store.get("fp32"))
    numel = sum(_numel(s) for _, s in sig)
    build_s = time.perf_counter() - t0
    link.barrier()
    if rank == 0:
        log(f"gpu_fp32_export: model {args.model} ({len(sig)} tensors, {numel / 1e6:.1f}M "
            f"elements: {fmt_bytes(4 * numel)} fp32, {fmt_bytes(2 * numel)} BF16), "
            f"{torch.cuda.get_device_name(device) if cuda else 'CPU'}, both processes on "
            f"{device}, lr {args.lr:g}, cast {args.cast}, built in {build_s:.1f} s")

    dcc, dc_error, why = deltacast_module()
    if link.sum_ints([dcc is not None])[0] != 2:
        if rank == 0:
            log(f"gpu_fp32_export: deltacast not available: {why or 'on the receiver'}")
            _write(args, {"ok": False, "deltacast": {"ran": False, "skipped_because": why}})
        link.barrier()
        dist.destroy_process_group()
        return
    if cuda:
        torch.cuda.empty_cache()  # torch's cached blocks back before deltacast allocates
    if rank == 0:
        for m in "AB":
            store.set(f"addr{m}", f"127.0.0.1:{free_port()}")
        store.set("secret", dcc.IpcComm.generate_secret())
    secret = store.get("secret").decode()
    comms = {m: dcc.IpcComm(store.get(f"addr{m}").decode(), 2, rank, device.index or 0,
                            timeout_s=args.timeout_s, secret=secret) for m in "AB"}
    kw = dict(device=device.index or 0, entropy=args.entropy)
    if rank == 0:
        ends = {"A": dcc.GpuSender(comms["A"], list(zip(names, trainer.params)),
                                   wire_dtypes=torch.bfloat16, bf16_nan=NAN_BF16, **kw),
                "B": dcc.GpuSender(comms["B"], list(zip(names, trainer.bufs)), **kw)}
    else:
        kw.pop("entropy")
        ends = {"A": dcc.GpuReceiver(comms["A"], list(zip(names, RA)), **kw),
                "B": dcc.GpuReceiver(comms["B"], list(zip(names, RB)), **kw)}

    totals = {"mismatch_A": 0, "mismatch_B": 0, "mismatch_elems_A": 0, "mismatch_elems_B": 0,
              "nan_fp32": 0, "deltacast_errors": 0, "reseeds": 0, "changed_disagree": 0}

    def run(m, kind):
        """Method m once on this rank: (wall ms, cast ms or None, report or None, error)."""
        link.barrier()
        ev = None
        t = time.perf_counter()
        try:
            if rank == 1:
                info = ends[m].receive()
            else:
                if m == "B":
                    if cuda:
                        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                        ev[0].record()
                    trainer.cast()
                    if cuda:
                        ev[1].record()
                info = (ends[m].seed if kind == "seed" else ends[m].sync)()
            link.sync()
            err = None
        except dc_error as e:
            link.sync()
            info, err = None, f"{type(e).__name__}: {e}"
        ms = (time.perf_counter() - t) * 1e3
        cast_ms = ev[0].elapsed_time(ev[1]) if ev else None
        return ms, cast_ms, (dict(info) if info else None), err

    def method(m, kind):
        ms, cast_ms, info, err = run(m, kind)
        if link.sum_ints([err is not None])[0]:
            if err:
                log(f"[rank {rank}] ({m}) {kind} failed: {err}")
            totals["deltacast_errors"] += err is not None
            totals["reseeds"] += 1
            _, _, _, err2 = run(m, "seed")  # untimed recovery, as a deployment would
            if link.sum_ints([err2 is not None])[0]:
                raise RuntimeError(f"({m}) reseed failed after {err}: {err2}")
        row = {"ms": None if err else ms, "error": err}  # a failed sync is no timing
        if m == "B" and cast_ms is not None and not err:
            row.update(cast_ms=cast_ms, sync_ms=ms - cast_ms)
        if info:
            row.update({k: info.get(k) for k in ("kind", "version", "changed", "numel",
                                                 "payload_bytes", "time_ms", "diff_ms",
                                                 "entropy", "stages", "dense_stages")})
        return row

    def check(step):
        """Receiver: RA and RB against torch's own cast of the trainer's fp32 parameters."""
        link.barrier()  # the trainer idles (its parameters stay put) until the next barrier
        got = [0] * 5
        if rank == 1:
            with torch.no_grad():
                if step == args.inject_corruption:  # testing the check: one bit of RA
                    RA[0].view(-1)[:1].view(torch.int16).bitwise_xor_(1)
                    log(f"[rank 1] --inject-corruption: flipped one bit of RA at step {step}")
                for src, a, b in zip(fp32, RA, RB):
                    ref = src.to(torch.bfloat16).view(torch.int16)
                    for i, r in ((0, a), (1, b)):
                        if not torch.equal(r.view(torch.int16), ref):
                            got[i] += 1
                            got[2 + i] += int((r.view(torch.int16) != ref).sum())
                    got[4] += int(torch.isnan(src).sum())
                    del ref
        got = link.sum_ints(got)
        for k, v in zip(("mismatch_A", "mismatch_B", "mismatch_elems_A", "mismatch_elems_B",
                         "nan_fp32"), got):
            totals[k] += v
        link.barrier()
        return got

    rows = []
    seed = {m: method(m, "seed") for m in "AB"}
    got = check(0)
    if rank == 0:
        log(f"step 0 [seed] (A) {_f(seed['A']['ms'])} ms, (B) {_f(seed['B']['ms'])} ms "
            f"(cast {_f(seed['B'].get('cast_ms'))}); mismatching tensors A {got[0]} B {got[1]}")
    nsteps = args.warmup_steps + args.steps
    for step in range(1, nsteps + 1):
        phase = "warmup" if step <= args.warmup_steps else "timed"
        train_ms = loss = None
        if rank == 0:
            link.sync()
            t = time.perf_counter()
            loss = trainer.step()
            link.sync()
            train_ms = (time.perf_counter() - t) * 1e3
        order = "AB" if step % 2 else "BA"
        r = {m: None for m in "AB"}
        for m in order:
            r[m] = method(m, "sync")
        got = check(step)
        row = {"step": step, "phase": phase, "order": order, "A": r["A"], "B": r["B"],
               "mismatch_A": got[0], "mismatch_B": got[1], "nan_fp32": got[4]}
        if rank == 0:
            a, b = r["A"], r["B"]
            row.update(train_ms=train_ms, loss=loss,
                       a_over_b=a["ms"] / b["ms"] if a["ms"] and b["ms"] else None)
            if a.get("changed") is not None:
                row["changed_ratio"] = a["changed"] / numel
                if b.get("changed") is not None and a["changed"] != b["changed"]:
                    totals["changed_disagree"] += 1
            log(f"step {step}/{nsteps} [{phase}] {order[0]} first  changed "
                f"{100 * row.get('changed_ratio', float('nan')):.2f}%  (A) fp32 {_f(a['ms'])} ms "
                f"({a.get('kind')}, {fmt_bytes(a.get('payload_bytes'))})  (B) cast+sync "
                f"{_f(b['ms'])} ms = {_f(b.get('cast_ms'))} + {_f(b.get('sync_ms'))} "
                f"({b.get('kind')}, {fmt_bytes(b.get('payload_bytes'))})  A/B "
                f"{_f(row['a_over_b'])}  "
                f"mismatching tensors A {got[0]} B {got[1]}  (train {train_ms:.0f} ms)")
        rows.append(row)

    if rank == 1:
        del fp32  # release the IPC mappings before the trainer's parameters go
        if cuda:
            torch.cuda.ipc_collect()
        store.set("receiver_rows", json.dumps(rows))
    mem = ({"max_allocated": torch.cuda.max_memory_allocated(device),
            "max_reserved": torch.cuda.max_memory_reserved(device)} if cuda else None)
    store.set(f"mem{rank}", json.dumps(mem))
    link.barrier()
    if rank == 0:
        for e in ends.values():
            e.close()
        recv = json.loads(store.get("receiver_rows").decode())
        report(args, cfg, torch, rows, recv, seed, totals, numel, len(sig), build_s,
               {"trainer": mem, "receiver": json.loads(store.get("mem1").decode()),
                "staging_A": ends["A"].staging_bytes, "staging_B": ends["B"].staging_bytes})
        store.set("done", "1")
    else:
        for m in "AB":
            ends[m].receive()  # the sender's close: returns None
        store.get("done")  # the store's server (rank 0) stays up until rank 0 has read
    dist.destroy_process_group()


def _numel(shape):
    return int(__import__("math").prod(shape))


def out_path(args):
    return os.path.join(args.out, f"gpu_fp32_export_{args.model}.json")


def _write(args, result):
    os.makedirs(args.out, exist_ok=True)
    with open(out_path(args), "w") as fh:
        json.dump(result, fh, indent=1)
    log(f"gpu_fp32_export: wrote {out_path(args)}")


def report(args, cfg, torch, rows, recv, seed, totals, numel, ntensors, build_s, mem):
    timed = [r for r in rows if r["phase"] == "timed"]

    def med(f):
        return median([f(r) for r in timed])

    # <method>_<key>: the trainer's medians ("deltacast_time_ms": the sync's own report).
    s = {f"{m}_{k if k != 'time_ms' else 'deltacast_time_ms'}": med(lambda r: r[m].get(k))
         for m in "AB" for k in ("ms", "cast_ms", "sync_ms", "time_ms", "diff_ms",
                                 "payload_bytes") if m == "B" or k not in ("cast_ms", "sync_ms")}
    s.update({f"receiver_{m}_ms": median([r[m]["ms"] for r in recv if r["phase"] == "timed"])
              for m in "AB"})
    s.update({f"kinds_{m}": sorted({r[m].get("kind") or "-" for r in timed}) for m in "AB"})
    s.update(changed_ratio=med(lambda r: r.get("changed_ratio")), steps=len(timed),
             a_over_b_per_step_median=med(lambda r: r["a_over_b"]),
             train_ms=med(lambda r: r["train_ms"]))
    s["a_over_b"] = s["A_ms"] / s["B_ms"] if s["A_ms"] and s["B_ms"] else None
    ok = (totals["mismatch_A"] == 0 and totals["mismatch_B"] == 0
          and totals["deltacast_errors"] == 0 and totals["reseeds"] == 0)
    dev = torch.cuda.get_device_name(0) if not args.cpu else "cpu"
    result = {
        "bench": "gpu_fp32_export", "model": args.model, "ok": ok,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": f"cuda:0 {dev} (trainer and receiver processes on it, CUDA IPC)",
        "deltacast": {"ran": True, "skipped_because": None},
        "acceptance": {"rule": f"median A / median B <= {ACCEPT}",
                       "met": s["a_over_b"] is not None and s["a_over_b"] <= ACCEPT},
        "numel": numel, "bytes_bf16": 2 * numel, "bytes_fp32": 4 * numel, "tensors": ntensors,
        "config": {k: getattr(cfg, k) for k in SHAPES[args.model]},
        "args": vars(args),
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__,
                     "cuda": torch.version.cuda,
                     "deltacast": getattr(__import__("deltacast"), "__version__", None)},
        "build_s": build_s, "memory": mem,
        "method": __doc__.split("\n\n", 2)[2],  # what A and B are, the timing, the checks
        "summary": s, "seed": seed,
        "correctness": totals,
        "rows": rows, "receiver_rows": recv,
    }
    _write(args, result)
    log("")
    log(f"{'step':>4} {'first':>5} {'changed':>8} {'A ms':>8} {'B ms':>8} {'cast ms':>8} "
        f"{'sync ms':>8} {'A/B':>6} {'A bytes':>10} {'B bytes':>10}")
    for r in rows:
        a, b = r["A"], r["B"]
        ch = r.get("changed_ratio")
        log(f"{r['step']:>4} {r['order'][0]:>5} "
            f"{'-' if ch is None else f'{100 * ch:.2f}%':>8} {_f(a['ms']):>8} {_f(b['ms']):>8} "
            f"{_f(b.get('cast_ms')):>8} {_f(b.get('sync_ms')):>8} {_f(r['a_over_b']):>6} "
            f"{fmt_bytes(a.get('payload_bytes')):>10} {fmt_bytes(b.get('payload_bytes')):>10}"
            + ("" if r["phase"] == "timed" else "  (warm-up)"))
    log(f"median of {s['steps']} timed steps: (A) fp32 {_f(s['A_ms'])} ms, (B) cast + sync "
        f"{_f(s['B_ms'])} ms = {_f(s['B_cast_ms'])} + {_f(s['B_sync_ms'])}; A/B "
        f"{_f(s['a_over_b'])} (per-step median {_f(s['a_over_b_per_step_median'])}); changed "
        f"{_f(None if s['changed_ratio'] is None else 100 * s['changed_ratio'])}%; acceptance "
        f"(<= {ACCEPT}) {'MET' if result['acceptance']['met'] else 'NOT MET'}")
    log(f"checks: {'OK' if ok else 'FAILED'}: mismatching tensors A {totals['mismatch_A']} "
        f"B {totals['mismatch_B']} over all steps, deltacast errors "
        f"{totals['deltacast_errors']}, NaN in fp32 {totals['nan_fp32']}, changed counts "
        f"disagreeing {totals['changed_disagree']}")


def _f(x):
    return "-" if x is None else f"{x:.2f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--model", choices=sorted(SHAPES), default="0.5b")
    ap.add_argument("--steps", type=int, default=8, help="timed steps (default 8)")
    ap.add_argument("--warmup-steps", type=int, default=1,
                    help="steps run but left out of the medians (default 1)")
    ap.add_argument("--out", default="bench-out", help="folder for the JSON (default bench-out)")
    ap.add_argument("--lr", type=float, default=1e-6, help="AdamW lr (default 1e-6)")
    ap.add_argument("--cast", choices=["loop", "foreach"], default="loop",
                    help="(B)'s cast: buf.copy_(p) per parameter (default) or one "
                         "torch._foreach_copy_")
    ap.add_argument("--entropy", choices=["auto", "on", "off"], default="auto",
                    help="deltacast's entropy codecs, both senders (default auto)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=int, default=300)
    ap.add_argument("--inject-corruption", type=int, default=-1, metavar="STEP",
                    help="testing the check: the receiver flips one bit of RA after STEP's "
                         "syncs (the run must then fail)")
    ap.add_argument("--cpu", action="store_true",
                    help="run on CPU (only with a stand-in DELTACAST_FP32_BENCH_MODULE)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup_steps < 0:
        ap.error("--steps must be >= 1 and --warmup-steps >= 0")
    # Machine rule: NVLink multicast stays off (no NCCL communicator is made here anyway).
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                      NVSHMEM_DISABLE_NVLS="1")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")

    import torch
    import torch.multiprocessing as mp

    if not args.cpu and torch.cuda.device_count() < 1:
        log("gpu_fp32_export: SKIPPED: no GPU")
        return 0
    path = out_path(args)
    if os.path.exists(path):
        os.remove(path)  # never report an older run's result
    t = time.perf_counter()
    mp.spawn(worker, args=(args, free_port()), nprocs=2, join=True)
    log(f"gpu_fp32_export: both processes finished in {time.perf_counter() - t:.1f} s")
    if not os.path.exists(path):
        log("gpu_fp32_export: FAILED: no result was written")
        return 1
    with open(path) as fh:
        res = json.load(fh)
    if not res["deltacast"]["ran"]:
        return 3
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
