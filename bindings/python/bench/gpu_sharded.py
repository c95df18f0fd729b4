#!/usr/bin/env python3
"""Sharded GPU sync benchmark: two trainer ranks holding dim-0 shards (as FSDP2 does) sync a
Qwen2-shaped BF16 model to a receiver, deltacast against gathering and broadcasting it whole.

    python bindings/python/bench/gpu_sharded.py --model 0.5b|7b [--transport nvlink|socket]
                                                 [--steps 8] [--lr 1e-6] [--out DIR]

Three processes (torch.multiprocessing, a gloo world for barriers): trainer rank 0 on cuda:0
(the leader), trainer rank 1 on cuda:1, and the receiver on cuda:1 too (it shares that GPU with
trainer rank 1: two processes, so the GPU is time-sliced between them; with more GPUs the
receiver would have one of its own). Needs two GPUs; with fewer it says SKIPPED and exits 0.

Each trainer rank holds, for every parameter of a Qwen2 model at 0.5B or 7B shape (shapes from
the config on the meta device, nothing downloaded), its dim-0 shard as torch.chunk and FSDP2
cut it: an fp32 master (random, std 0.02) and its BF16 copy, the weights synced. A step is
synthetic, not training: every master element moves by +-lr (random sign, as AdamW's first
steps move every weight by about lr), then the BF16 copy is refreshed from the masters. The
default lr, 3.5e-7, makes about 1.5 % of the BF16 elements change per step, as real AdamW steps
at lr 1e-6 did in the trained benchmark (gpu_sync.py); at 1e-6 this update changes ~4.2 %.
deltacast runs in one stage by default (--stage-mib 0): with more, trainer rank 1 would wait
in each stage's exchange while the leader sends the stage before, holding cuda:1 that the
receiver's process needs.

Per step, both ways on the same processes, each timed on trainer rank 0 from its first call
until the receiver has applied and acked:
  (a) whole   every parameter gathered exactly to the leader (batched NCCL isend/irecv of each
              rank's shard, in 512 MiB buckets of whole parameters) and broadcast to the
              receiver, who copies each bucket into its copy B; ack: an all-reduce after the
              receiver's copy;
  (b) deltacast  GpuShardedSender.sync() on both trainer ranks, GpuReceiver.receive() into the
              receiver's copy A (each rank diffs its shards against its own snapshot; the
              leader gathers the encoded changes and sends them on).
Correctness every step, on the receiver: A == B bit for bit (B is what the whole path moved)
and deltacast's digest check; the leader's and the receiver's digests are compared at the end.

Output: a line per step, a table, and JSON at DIR/gpu_sharded_<model>_<transport>.json. Exit
status 0 when every check passed (or SKIPPED), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_sync import SHAPES, free_port, log, make_config, nccl_env, set_transport_env  # noqa: E402

BUCKET = 512 << 20
LEADER, OTHER, RECEIVER = 0, 1, 2


def param_shapes(model: str):
    """(name, shape) of every parameter of the Qwen2 model, from the meta device."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        m = Qwen2ForCausalLM(make_config(model))
    return [(n, tuple(int(d) for d in p.shape)) for n, p in m.named_parameters()]


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def buckets(shapes):
    """Consecutive runs of whole parameters of at most BUCKET BF16 bytes (a larger parameter
    alone)."""
    out, cur, size = [], [], 0
    for i, (_, shape) in enumerate(shapes):
        b = 2 * numel(shape)
        if cur and size + b > BUCKET:
            out.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += b
    if cur:
        out.append(cur)
    return out


def run(rank: int, args, port: int, uids, queue):
    set_transport_env(args.transport)
    import torch
    import torch.distributed as dist

    import deltacast.cuda as dcc

    device = 0 if rank == LEADER else 1
    torch.cuda.set_device(device)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=3)
    # Two NCCL groups, never the world (two of its ranks share cuda:1).
    trainers_pg = dist.new_group([LEADER, OTHER], backend="nccl")
    link_pg = dist.new_group([LEADER, RECEIVER], backend="nccl")
    shapes = param_shapes(args.model)
    plan = buckets(shapes)
    dev = torch.device(f"cuda:{device}")
    out = {"rank": rank}

    if rank in (LEADER, OTHER):
        cuts = []  # (first element, elements) of this rank's shard per parameter
        masters, weights = [], []
        gen = torch.Generator(device=dev).manual_seed(1000 + rank)
        for _, shape in shapes:
            first_row, rows = dcc.dim0_shard(shape[0], rank, 2)
            row = numel(shape[1:])
            cuts.append((first_row * row, rows * row))
            m = torch.empty(rows * row, dtype=torch.float32, device=dev).normal_(
                0.0, 0.02, generator=gen)
            masters.append(m)
            weights.append(m.to(torch.bfloat16))
        trainers = dcc.NcclComm(uids[0], 2, rank, device)
        receivers = dcc.NcclComm(uids[1], 2, 0, device) if rank == LEADER else None
        sender = dcc.GpuShardedSender(
            trainers, receivers,
            [(n, w, list(shape), first) for (n, shape), w, (first, _) in
             zip(shapes, weights, cuts)],
            capacity=args.capacity, entropy=args.entropy,
            stage_bytes=int(args.stage_mib * (1 << 20)))
        # The whole path's buffers: the leader assembles each bucket, parameter after
        # parameter, its own shard copied in and the other rank's received in place.
        staging = (torch.empty(max(sum(2 * numel(shapes[i][1]) for i in b) for b in plan),
                               dtype=torch.uint8, device=dev) if rank == LEADER else None)
        ack = torch.zeros(1, dtype=torch.int32, device=dev)
    else:
        A = [torch.zeros(shape, dtype=torch.bfloat16, device=dev) for _, shape in shapes]
        B = [torch.zeros(shape, dtype=torch.bfloat16, device=dev) for _, shape in shapes]
        comm = dcc.NcclComm(uids[1], 2, 1, device)
        receiver = dcc.GpuReceiver(comm, [(n, a) for (n, _), a in zip(shapes, A)])
        staging = torch.empty(max(sum(2 * numel(shapes[i][1]) for i in b) for b in plan),
                              dtype=torch.uint8, device=dev)
        ack = torch.zeros(1, dtype=torch.int32, device=dev)

    def whole():
        """(a): gather every parameter to the leader, broadcast it, the receiver copies."""
        for b in plan:
            if rank == OTHER:
                ops = [dist.P2POp(dist.isend, weights[i].view(torch.uint8), LEADER, trainers_pg)
                       for i in b if cuts[i][1] > 0]
                for w in dist.batch_isend_irecv(ops) if ops else []:
                    w.wait()
                continue
            total = sum(2 * numel(shapes[i][1]) for i in b)
            buf = staging[:total]
            if rank == LEADER:
                ops, at = [], 0
                for i in b:
                    mine = 2 * cuts[i][1]
                    buf[at:at + mine].copy_(weights[i].view(torch.uint8))
                    other = 2 * numel(shapes[i][1]) - mine
                    if other:
                        ops.append(dist.P2POp(dist.irecv, buf[at + mine:at + mine + other],
                                              OTHER, trainers_pg))
                    at += 2 * numel(shapes[i][1])
                for w in dist.batch_isend_irecv(ops) if ops else []:
                    w.wait()
            dist.broadcast(buf, src=LEADER, group=link_pg)
            if rank == RECEIVER:
                at = 0
                for i in b:
                    n = 2 * numel(shapes[i][1])
                    B[i].view(-1).view(torch.uint8).copy_(buf[at:at + n])
                    at += n
        if rank != OTHER:
            dist.all_reduce(ack, group=link_pg)
        torch.cuda.synchronize()

    def step_update():
        for m, w in zip(masters, weights):
            m.add_(torch.randn_like(m).sign_(), alpha=args.lr)
            w.copy_(m)
        torch.cuda.synchronize()

    rows, ok = [], True
    for step in range(args.steps + 2):  # step 0: seed; step 1: warm-up
        if rank in (LEADER, OTHER) and step > 0:
            step_update()
        dist.barrier()
        t0 = time.perf_counter()
        whole()
        t_whole = (time.perf_counter() - t0) * 1e3
        dist.barrier()
        t0 = time.perf_counter()
        if rank == RECEIVER:
            try:
                rep = receiver.receive()
                err = None
            except Exception as e:  # counted, reported
                rep, err = None, repr(e)
            torch.cuda.synchronize()
            same = all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                       for a, b in zip(A, B))
            ok &= same and err is None
            rows.append({"step": step, "equal": same, "error": err,
                         "kind": rep and rep["kind"]})
        else:
            rep = sender.seed() if step == 0 else sender.sync()
            t_ours = (time.perf_counter() - t0) * 1e3
            rows.append({"step": step, "whole_ms": t_whole, "deltacast_ms": rep["time_ms"],
                         "wall_ms": t_ours, "kind": rep["kind"], "changed": rep["changed"],
                         "numel": rep["numel"], "payload_bytes": rep["payload_bytes"],
                         "entropy": rep["entropy"], "stages": rep["stages"],
                         "phases_ms": rep.get("phases_ms", {})})
            if rank == LEADER:
                r = rows[-1]
                log(f"step {step}: {r['kind']:5s} changed {r['changed'] / r['numel']:.4%} "
                    f"whole {t_whole:8.2f} ms  deltacast {r['deltacast_ms']:8.2f} ms "
                    f"({r['payload_bytes'] / 1e6:.1f} MB) "
                    + " ".join(f"{k} {v:.2f}" for k, v in r["phases_ms"].items()))
        dist.barrier()
    if rank in (LEADER, OTHER):
        sender.close()
        out["digests"] = sender.digests
    else:
        receiver.receive()  # the close
        out["digests"] = receiver.digests
    out["rows"], out["ok"] = rows, ok
    queue.put(out)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="0.5b")
    ap.add_argument("--transport", choices=["nvlink", "socket"], default="nvlink")
    ap.add_argument("--steps", type=int, default=8, help="timed steps (after a warm-up)")
    ap.add_argument("--lr", type=float, default=3.5e-7)
    ap.add_argument("--stage-mib", type=float, default=0,
                    help="deltacast stage size in MiB (default 0: one stage)")
    ap.add_argument("--capacity", type=float, default=0.05)
    ap.add_argument("--entropy", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--out", default="bench-out")
    args = ap.parse_args(argv)
    set_transport_env(args.transport)
    import torch
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < 2:
        log("SKIPPED: two GPUs needed (two trainer ranks on cuda:0 and cuda:1)")
        return 0
    import deltacast.cuda as dcc

    uids = (dcc.nccl_unique_id(), dcc.nccl_unique_id())
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=run, args=(r, args, port, uids, queue)) for r in range(3)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        item = queue.get(timeout=1800)
        got[item["rank"]] = item
    for p in procs:
        p.join(timeout=120)
    lead, recv = got[LEADER], got[RECEIVER]
    timed = [r for r in lead["rows"] if r["step"] >= 2]
    med = lambda k: statistics.median(r[k] for r in timed)  # noqa: E731
    res = {
        "model": args.model, "transport": args.transport, "lr": args.lr,
        "stage_mib": args.stage_mib, "entropy": args.entropy,
        "steps": args.steps, "device": torch.cuda.get_device_name(0),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__, "env": nccl_env(),
        "median_whole_ms": med("whole_ms"), "median_deltacast_ms": med("deltacast_ms"),
        "median_changed_ratio": statistics.median(r["changed"] / r["numel"] for r in timed),
        "median_payload_bytes": med("payload_bytes"),
        "model_bytes": 2 * timed[0]["numel"] if timed else 0,
        "leader": lead["rows"], "other": got[OTHER]["rows"], "receiver": recv["rows"],
        "digests_equal": lead["digests"] == recv["digests"] == got[OTHER]["digests"],
        "ok": all(g["ok"] for g in got.values()) and lead["digests"] == recv["digests"],
        "exit_codes": [p.exitcode for p in procs],
    }
    res["speedup"] = res["median_whole_ms"] / res["median_deltacast_ms"]
    res["ok"] &= all(c == 0 for c in res["exit_codes"])
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"gpu_sharded_{args.model}_{args.transport}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    log(f"{args.model} {args.transport}: whole {res['median_whole_ms']:.2f} ms, deltacast "
        f"{res['median_deltacast_ms']:.2f} ms ({res['speedup']:.2f}x), changed "
        f"{res['median_changed_ratio']:.4%}, payload {res['median_payload_bytes'] / 1e6:.1f} MB "
        f"of {res['model_bytes'] / 1e9:.2f} GB; receiver A == B every step and digests equal: "
        f"{res['ok']} -> {path}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
