"""Draws the charts of docs/benchmarks.md that no command of the repository draws, from the
committed raw results (standard library only, SVG out):

    python3 docs/data/charts.py     # writes docs/img/codec-bytes.svg, codec-speed.svg, gpu-diff.svg,
                                    # gpu-density.svg, gpu-density-steps.svg, context-speed.svg

The GPU sync and network charts come from `deltacast gpu-report` and `deltacast bench`.
"""

import json
import math
import re
import statistics
from pathlib import Path

DATA = Path(__file__).resolve().parent
IMG = DATA.parent / "img"
COLORS = ["#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd"]


def bars(path, title, ylabel, groups, series, ref=None, fmt="{:g}"):
    """A grouped bar chart: `groups` labels along x, `series` [(name, [value per group])]."""
    w, h, left, right, top, bottom = 900, 420, 70, 230, 40, 60
    top_value = max([v for _, vals in series for v in vals] + [ref or 0]) * 1.1
    step = 10 ** math.floor(math.log10(top_value / 5))
    step = next(m * step for m in (1, 2, 2.5, 5, 10) if top_value / (m * step) <= 6)
    top_value = math.ceil(top_value / step) * step
    plot_w, plot_h = w - left - right, h - top - bottom
    y = lambda v: top + plot_h - v / top_value * plot_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="12"><rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="15">{title}</text>']
    for i in range(round(top_value / step) + 1):
        v = i * step
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke="#ddd"/><text x="{left - 6}" y="{y(v) + 4:.1f}" '
                   f'text-anchor="end">{fmt.format(round(v, 3))}</text>')
    out.append(f'<text transform="translate(18,{top + plot_h / 2}) rotate(-90)" '
               f'text-anchor="middle">{ylabel}</text>')
    gw = plot_w / len(groups)
    bw = gw * 0.8 / len(series)
    for g, label in enumerate(groups):
        x0 = left + g * gw + gw * 0.1
        for s, (_, vals) in enumerate(series):
            v = vals[g]
            out.append(f'<rect x="{x0 + s * bw:.1f}" y="{y(v):.1f}" width="{bw - 2:.1f}" '
                       f'height="{y(0) - y(v):.1f}" fill="{COLORS[s]}"/>')
        out.append(f'<text x="{left + g * gw + gw / 2:.1f}" y="{top + plot_h + 18}" '
                   f'text-anchor="middle">{label}</text>')
    if ref is not None:
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(ref):.1f}" y2="{y(ref):.1f}" '
                   f'stroke="black" stroke-dasharray="5,4"/>')
    for s, (name, _) in enumerate(series):
        ly = top + 10 + s * 22
        out.append(f'<rect x="{left + plot_w + 15}" y="{ly}" width="14" height="14" '
                   f'fill="{COLORS[s]}"/><text x="{left + plot_w + 35}" y="{ly + 12}">{name}</text>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{y(0)}" stroke="black"/>'
               f'<line x1="{left}" x2="{left + plot_w}" y1="{y(0)}" y2="{y(0)}" stroke="black"/>'
               '</svg>\n')
    path.write_text("\n".join(out))


def codec_bytes():
    steps = [json.loads(line) for line in (DATA / "codecs/trace-bytes.jsonl").open()]
    steps = [s for s in steps if "step" in s]
    kb = lambda key: [s[key] / 1e3 for s in steps]
    bars(IMG / "codec-bytes.svg", "Wire bytes per step on the recorded AdamW trace (6.77 M BF16)",
         "kB per step", [f"step {s['step']}" for s in steps],
         [("abs32+raw", kb("abs32_raw_bytes")), ("deltacast (auto)", kb("chosen_bytes")),
          ("entropy bound", kb("bound_bytes"))])


def codec_speed():
    runs, build = {}, None
    for line in (DATA / "codecs/prefetch-decoder.txt").open():
        m = re.match(r"== round \d+ (\w+) \((bench chunk|chunks)", line)
        if m:
            build, data = m.group(1), ("new chunks" if m.group(2) == "chunks" else "bench chunk")
            continue
        if line.startswith("d=") and build == "new":
            kv = dict(field.split("=") for field in line.split())
            runs.setdefault((data, float(kv["d"])), []).append(kv)
    keys = [k for k in sorted(runs, key=lambda k: (k[1], k[0])) if k[1] >= 0.1]
    ratio = lambda k, what: statistics.median(float(r[what]) / float(r["diff"]) for r in runs[k])
    bars(IMG / "codec-speed.svg", "Codec per core against the diff (median ratio, 0ac59fd)",
         "changes/s ÷ the diff's", [f"{k[1] * 100:g} %, {k[0]}" for k in keys],
         [("chunk encode", [ratio(k, "auto") for k in keys]),
          ("chunk decode", [ratio(k, "chunk_dec") for k in keys])], ref=1.0)


def gpu_diff():
    rows = {}
    for line in (DATA / "gpu-diff/densities/gpu_bench.txt").open():
        m = re.match(r"\s+([\d.]+)%\s+(.+?)\s{2,}[\d.]+ ms\s+\d+ GB/s\s+(\d+)% of copy", line)
        if m:
            rows[(float(m.group(1)), m.group(2).strip())] = int(m.group(3))
    dens = sorted({d for d, _ in rows})
    configs = [("1 tensor, new bits", "new bits"), ("1 tensor, new bits, digest", "+ digest"),
               ("339 tensors, new+old, digest", "+ old bits, 339 tensors")]
    bars(IMG / "gpu-diff.svg", "GPU diff on one H200: % of a device copy of the same 2 GiB",
         "% of cuMemcpyDtoD", [f"{d:g} %" for d in dens],
         [(name, [rows[(d, c)] for d in dens]) for c, name in configs], ref=70)


def gpu_density():
    """Each timed step of the one-GPU bench at three learning rates: deltacast's time and wire
    bytes as a share of the same step's full copy."""
    groups, time, wire = [], [], []
    for lr in ("", "_lr1e-05", "_lr6e-05"):
        run = json.load((DATA / f"gpu-sync/one-pass-diff/gpu_sync_0.5b_ipc{lr}_onegpu.json").open())
        full = {r["step"]: r for r in run["rows"] if r["method"] == "full" and r["step"] > 0}
        for r in run["rows"]:
            if r["method"] == "deltacast" and r["step"] in full:
                groups.append(f"{100 * r['changed_ratio']:.0f}%")
                time.append(r["time_ms"] / full[r["step"]]["time_ms"])
                wire.append(r["wire_bytes"] / full[r["step"]]["wire_bytes"])
    bars(IMG / "gpu-density.svg",
         "0.5B on one H200 over CUDA IPC, defaults: deltacast ÷ full copy per step (lr 1e-6, 1e-5, 6e-5)",
         "÷ the full copy", groups, [("time", time), ("wire bytes", wire)], ref=1.0)


def gpu_density_steps():
    """The one-GPU bench with every codec among the choices (1×H100, 2026-12-08 00:20 UTC,
    the map diffs of aa88ecc): each timed step's deltacast time and wire bytes as a share of the same step's
    full copy, labelled with what went (P plain delta, B plain delta diffed straight into
    bitmap + raw, E entropy codecs, S steps code, W whole)."""
    groups, time, wire = [], [], []
    for lr in ("", "_lr1e-05", "_lr6e-05"):
        path = DATA / f"gpu-sync/map-diff-balanced-1xh100/bench/gpu_sync_0.5b_ipc{lr}_onegpu.json"
        run = json.load(path.open())
        full = {r["step"]: r for r in run["rows"] if r["method"] == "full" and r["step"] > 0}
        for r in run["rows"]:
            if r["method"] == "deltacast" and r["step"] in full:
                how = ("W" if r["kind"] == "dense" else "S" if r.get("steps")
                       else "E" if r.get("entropy") else "B" if r.get("bitmap_stages")
                       else "P")
                groups.append(f"{100 * r['changed_ratio']:.0f}% {how}")
                time.append(r["time_ms"] / full[r["step"]]["time_ms"])
                wire.append(r["wire_bytes"] / full[r["step"]]["wire_bytes"])
    bars(IMG / "gpu-density-steps.svg",
         "0.5B on one H100 over CUDA IPC, defaults: deltacast ÷ full copy per step "
         "(P plain, B bitmap diff, E entropy, S steps, W whole)",
         "÷ the full copy", groups, [("time", time), ("wire bytes", wire)], ref=1.0)


def context_speed():
    def load(name):
        runs = {}
        for line in (DATA / "codecs" / name).open():
            if line.startswith("d="):
                kv = dict(field.split("=") for field in line.split())
                runs.setdefault(float(kv["d"]), []).append(kv)
        return runs
    now, before = load("ctxgaps-one-pass.txt"), load("ctxgaps-one-pass-before.txt")
    ds = sorted(now)
    ratio = lambda runs, d, what: statistics.median(
        float(r[what]) / float(r["diff"]) for r in runs[d])
    bars(IMG / "context-speed.svg",
         "auto+ctx per core against the diff (median of three runs each, 3a3ae20 and before)",
         "changes/s ÷ the diff's", [f"{d * 100:g} % changed" for d in ds],
         [("encode, a walk per class", [ratio(before, d, "ctx_enc") for d in ds]),
          ("encode, one pass", [ratio(now, d, "ctx_enc") for d in ds]),
          ("decode, a walk per class", [ratio(before, d, "ctx_dec") for d in ds]),
          ("decode, one pass", [ratio(now, d, "ctx_dec") for d in ds])], ref=1.0, fmt="{:g}")


if __name__ == "__main__":
    codec_bytes()
    codec_speed()
    context_speed()
    gpu_diff()
    gpu_density()
    gpu_density_steps()
