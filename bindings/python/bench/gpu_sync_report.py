"""The shapes gpu_sync.py benchmarks, and how it reports a run: the summary and JSON record
(`report`), the table (`print_table`), the output file's name (`out_name`)."""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys

MIB = 1 << 20

SHAPES = {
    # Qwen2.5-0.5B: 494M parameters, tied embeddings.
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                 tie_word_embeddings=True),
    # Qwen2.5-3B: 3.09B parameters, tied embeddings.
    "3b": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2, intermediate_size=11008, vocab_size=151936,
               tie_word_embeddings=True),
    # Qwen2.5-7B: 7.6B parameters, untied.
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, intermediate_size=18944, vocab_size=152064,
               tie_word_embeddings=False),
    # For the CPU smoke (and a quick GPU check).
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=512,
                 tie_word_embeddings=True),
}

METHODS = ("full", "plain", "deltacast")


def log(*a):
    print(*a, flush=True)


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def nccl_env() -> dict:
    keys = sorted(k for k in os.environ
                  if k.startswith(("NCCL_", "TORCH_SYMM", "NVSHMEM_", "PYTORCH_CUDA_ALLOC"))
                  or k == "CUDA_VISIBLE_DEVICES")
    return {k: os.environ[k] for k in keys}


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def report(args, rows, recv, totals, gen, use_dc, why, numel, nbytes, ntensors, mem, build_s,
           torch, cfg):
    timed = [r for r in rows if r.get("phase") == "timed"]
    summary = {}
    for m in METHODS:
        rs = [r for r in timed if r["method"] == m and r.get("time_ms") is not None]
        summary[m] = {"median_ms": median([r["time_ms"] for r in rs]),
                      "min_ms": min((r["time_ms"] for r in rs), default=None),
                      "max_ms": max((r["time_ms"] for r in rs), default=None),
                      "median_wire_bytes": median([r.get("wire_bytes") for r in rs]),
                      "steps": len(rs)}
    recv_dc = [r for r in recv["rows"] if r.get("method") == "deltacast"
               and r.get("phase") == "timed" and r.get("time_ms") is not None]
    summary["deltacast"]["receiver_median_ms"] = median([r["time_ms"] for r in recv_dc])
    dc_rows = [r for r in timed if r["method"] == "deltacast" and r.get("kind")]
    summary["deltacast"]["kinds"] = sorted({r["kind"] for r in dc_rows})
    summary["deltacast"]["entropy_steps"] = sum(1 for r in dc_rows if r.get("entropy"))
    summary["deltacast"]["steps_code_steps"] = sum(1 for r in dc_rows if r.get("steps"))
    summary["deltacast"]["median_diff_ms"] = median([r.get("diff_ms") for r in dc_rows])
    f, p, d = (summary[m]["median_ms"] for m in METHODS)
    summary["full_over_deltacast"] = f / d if f and d else None
    summary["plain_over_deltacast"] = p / d if p and d else None
    summary["train_median_ms"] = median([r["time_ms"] for r in timed if r["method"] == "train"])
    changed = [r["changed_ratio"] for r in timed if r["method"] == "plain"]
    summary["changed_ratio_median"] = median(changed)
    summary["changed_ratio_per_step"] = [r["changed_ratio"] for r in rows
                                        if r["method"] == "plain"]
    for k, v in recv["totals"].items():  # the receiver's own error counts
        if k in ("deltacast_errors", "digest_errors"):
            totals[f"receiver_{k}"] = v
    ok = (totals["mismatch_A"] == 0 and totals["mismatch_C"] == 0
          and totals["deltacast_errors"] == 0 and totals.get("receiver_deltacast_errors", 0) == 0
          and totals["snapshot_stale"] == 0 and gen["identical"])
    result = {
        "model": args.model, "transport": args.transport,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "ok": ok,
        "deltacast": {"ran": use_dc, "skipped_because": why},
        "numel": numel, "bytes_bf16": nbytes, "tensors": ntensors,
        "config": {k: getattr(cfg, k) for k in SHAPES[args.model]},
        "args": vars(args),
        "env": nccl_env(),
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__,
                     "cuda": torch.version.cuda, "nccl": _nccl_version(torch)},
        "devices": ([f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in args.devices]
                    if not args.cpu_smoke else ["cpu", "cpu"]),
        "build_s": build_s,
        "torch_memory": {"trainer": mem, "receiver": recv["torch_memory"]},
        "ack": "one NCCL all-reduce of a tiny status tensor entered by the receiver after its "
               "apply: torch's (1 x int32) for full and plain, deltacast's own for deltacast",
        "notes": ["(b) plain delta reads the snapshot that (c) deltacast refreshes and does not "
                  "refresh it itself: this favours the baseline by the cost of a snapshot refresh",
                  "order each step: train, (a) full, (b) plain, (c) deltacast, then the checks; "
                  "an untimed barrier before each method"],
        "summary": summary,
        "correctness": {**totals, "generation_identical": gen["identical"],
                        "generation": gen},
        "rows": rows,
        "receiver_rows": recv["rows"],
    }
    print_table(result)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, out_name(args))
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    log(f"gpu_sync: wrote {path}")
    return 0 if ok else 1


def _nccl_version(torch):
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # noqa: BLE001
        return None


def print_table(res):
    s = res["summary"]

    def ms(x):
        return "-" if x is None else f"{x:.2f}"

    log("")
    log(f"== per step ({res['model']}, {res['transport']})")
    log(f"{'method':<10} {'step':>4} {'phase':<7} {'time_ms':>10} {'wire':>11} {'changed':>8} "
        f"{'kind':<6}")
    for r in res["rows"]:
        if r["method"] == "train":
            continue
        cr = r.get("changed_ratio")
        log(f"{r['method']:<10} {r['step']:>4} {r.get('phase', ''):<7} {ms(r.get('time_ms')):>10} "
            f"{fmt_bytes(r.get('wire_bytes')):>11} "
            f"{'-' if cr is None else f'{100 * cr:.2f}%':>8} {r.get('kind', '') or '':<6}"
            + (f" skipped: {r['skipped']}" if r.get("skipped") else "")
            + (f" ERROR: {r['error']}" if r.get("error") else ""))
    log("")
    cm = s["changed_ratio_median"]
    cm = "-" if cm is None else f"{100 * cm:.2f}%"
    log(f"== summary: median over {s['full']['steps']} timed steps "
        f"({res['numel'] / 1e6:.2f}M elements, {fmt_bytes(res['bytes_bf16'])} BF16, "
        f"changed {cm})")
    log(f"{'method':<10} {'median_ms':>10} {'min_ms':>9} {'max_ms':>9} {'wire':>11}")
    for m in METHODS:
        x = s[m]
        log(f"{m:<10} {ms(x['median_ms']):>10} {ms(x['min_ms']):>9} {ms(x['max_ms']):>9} "
            f"{fmt_bytes(x['median_wire_bytes']):>11}")
    fo, po = s["full_over_deltacast"], s["plain_over_deltacast"]
    log(f"full/deltacast {'-' if fo is None else f'{fo:.2f}x'}   "
        f"plain/deltacast {'-' if po is None else f'{po:.2f}x'}")
    c = res["correctness"]
    log(f"correctness: mismatching tensors A {c['mismatch_A']} C {c['mismatch_C']}, "
        f"deltacast errors {c['deltacast_errors']} (digest {c['digest_errors']}), "
        f"stale snapshot tensors {c['snapshot_stale']}, "
        f"generation {'IDENTICAL' if c['generation_identical'] else 'DIFFERENT'} "
        f"[{c['generation']['receiver_model']}]")
    mem = res["torch_memory"]
    if mem["trainer"]:
        log("torch memory peak (allocated/reserved): " + ", ".join(
            f"{who} {mem[who]['max_allocated'] / 2**30:.1f}/"
            f"{mem[who]['max_reserved'] / 2**30:.1f} GiB"
            for who in ("trainer", "receiver")) + " (deltacast's own allocations not included)")
    if not res["deltacast"]["ran"]:
        log(f"deltacast: SKIPPED ({res['deltacast']['skipped_because']})")
    log(f"result: {'OK' if res['ok'] else 'FAILED'}")


def out_name(args):
    if args.cpu_smoke:
        return f"gpu_sync_{args.model}_cpu.json"
    suffix = {"auto": "", "on": "_entropy", "off": "_noentropy"}[args.entropy]
    if args.stage_mib is not None:
        suffix += f"_stage{args.stage_mib:g}"
    if args.lr != 1e-6:
        suffix += f"_lr{args.lr:g}"
    if args.transport == "ipc" and args.devices[1] == 0:
        suffix += "_onegpu"
    return f"gpu_sync_{args.model}_{args.transport}{suffix}.json"


# ----------------------------------------------------------------------------- main
