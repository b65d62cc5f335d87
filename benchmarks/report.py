# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Regenerate the Markdown table and the backward TFLOP/s plot from a run's JSON.

    python benchmarks/report.py benchmarks/results/summary.json --out-dir benchmarks/results \
        [--anchors /work/shared/anchors/h200-2026-11-29.jsonl] [--print-mode bwd]

Writes OUT_DIR/summary.md and OUT_DIR/bwd_tflops.png (matplotlib, Agg backend: no display needed).
"""

import argparse
import json
import os
import sys

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.ops.summary import OURS, banner, render  # noqa: E402

ANCHOR_ALIASES = {"flex-gated": "flex"}  # the anchors name flex's gated rows apart; this run does not


def load_anchors(path):
    """{(peer, shape): bwd_tflops} from the anchors' JSONL (rows without bwd_tflops are ignored)."""
    out = {}
    if not path:
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                row = json.loads(line)
                if row.get("bwd_tflops"):
                    out[(ANCHOR_ALIASES.get(row["peer"], row["peer"]), row["shape"])] = row["bwd_tflops"]
    return out


def markdown(data: dict) -> str:
    env = data.get("env", {})
    gate = data.get("gate", {})
    head = [
        f"# Benchmark: {data.get('op', '?')}",
        "",
        f"- GPU: {env.get('gpu')} (driver {env.get('driver')}, CUDA {env.get('cuda')}); torch {env.get('torch')}, "
        f"triton {env.get('triton')}, Python {env.get('python')}",
        f"- commit: {env.get('bench_commit') or env.get('git_commit')}{' (dirty)' if env.get('git_dirty') else ''}"
        f" (source fingerprint {env.get('source_fingerprint')}); started {env.get('started')}",
        f"- command: `{env.get('command')}`",
        f"- timer: {data.get('timer')}; gate: {gate.get('status')} ({gate.get('file')})"
        + (f", ran in part {gate['ran_in_part']}" if gate.get("ran_in_part") and data.get("parts") else ""),
        "- times in microseconds (median); `(x)` = peer time / fla_bwd time (> 1: fla_bwd faster); "
        "A/B = forced-legacy time / dispatch time, median over independent rounds [min-max]",
        "",
    ]
    if data.get("parts"):
        head[4] = f"- commands: {len(data['parts'])} parts of a split run, merged by benchmarks/merge.py"
        for p in data["parts"]:
            e = p.get("env") or {}
            g = p.get("gate") or {}
            gs = g.get("status") if not g.get("inherited") else f"{g.get('status')} (inherited from part 1)"
            head.insert(-1, f"- part {p['index']}/{p['of']}: {len(p.get('shapes') or [])} shapes, "
                            f"{p.get('elapsed_s')} s (estimate {p.get('estimate_s')} s), gate {gs}, started "
                            f"{e.get('started')} on {e.get('gpu')} {e.get('host')}, fingerprint "
                            f"{e.get('source_fingerprint')}: `{p.get('command')}`")
    head += [f"**{line}**" for line in banner(data)] + ([""] if banner(data) else [])
    modes = [m for m in ("bwd", "fwdbwd", "fwd") if any(m in r.get("modes", {}) for r in data.get("results", []))]
    body = [render(data, m, markdown=True, with_banner=False) for m in modes]
    if data.get("skipped_shapes"):
        body.append("Shapes not run: " + ", ".join(f"{k} ({v})" for k, v in data["skipped_shapes"].items()))
    errs = [(r["shape"]["name"], k, v) for r in data.get("results", []) for k, v in r.get("errors", {}).items()]
    if errs:
        body.append("Errors:\n\n" + "\n".join(f"- {n} {k}: {v}" for n, k, v in errs))
    return "\n".join(head) + "\n" + "\n\n".join(body) + "\n"


def series(data: dict, anchors: dict):
    """Shapes (with a bwd row) and {label: [TFLOP/s or None per shape]}; anchor values fill peers not run."""
    recs = [r for r in data.get("results", []) if "bwd" in r.get("modes", {})]
    shapes = [r["shape"]["name"] for r in recs]
    labels = []
    for r in recs:
        for name in r["modes"]["bwd"]["candidates"]:
            if name not in labels:
                labels.append(name)
    labels.sort(key=lambda n: (n != OURS, n))
    out = {lab: [r["modes"]["bwd"]["candidates"].get(lab, {}).get("tflops") for r in recs] for lab in labels}
    for peer in sorted({p for p, _ in anchors}):
        if peer in out:
            continue
        vals = [anchors.get((peer, s)) for s in shapes]
        if any(vals):
            out[f"{peer} (anchor)"] = vals
    return shapes, out


def plot(data: dict, path: str, anchors: dict = None) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes, ser = series(data, anchors or {})
    if not shapes:
        return False
    n = len(ser)
    width = 0.8 / max(n, 1)
    # wide enough for a bar group a shape, capped so that a full run (26 shapes x 7 series) stays readable
    fig, ax = plt.subplots(figsize=(min(22.0, max(8.0, 0.75 * len(shapes) * max(n, 2) / 2)), 6.0))
    for i, (label, vals) in enumerate(ser.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(shapes))]
        ys = [v if v else 0.0 for v in vals]
        ax.bar(xs, ys, width, label=label, hatch="//" if "anchor" in label else None,
               edgecolor="black" if label == OURS else None, linewidth=0.8)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(shapes, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s, backward alone")
    env = data.get("env", {})
    title = f"Backward alone on {env.get('gpu') or 'CPU'} (FLOPs = 2.5 x forward, visible pairs counted exactly)"
    if data.get("smoke"):
        title += " - SMOKE RUN, NOT A PERFORMANCE NUMBER"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("json", help="the run's JSON (benchmarks.ops.run --json)")
    p.add_argument("--out-dir", default=None, help="default: the JSON's folder")
    p.add_argument("--anchors", default=None, help="peer anchors JSONL: fills peers this run did not time (hatched)")
    p.add_argument("--print-mode", default=None, help="also print this mode's text table to stdout (e.g. bwd)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--suffix", default="", help="name the files summary{SUFFIX}.md and bwd_tflops{SUFFIX}.png")
    a = p.parse_args(argv)
    try:
        with open(a.json) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        print(f"error: cannot read {a.json}: {e}", file=sys.stderr)
        return 2
    out = a.out_dir or os.path.dirname(os.path.abspath(a.json))
    os.makedirs(out, exist_ok=True)
    md = os.path.join(out, f"summary{a.suffix}.md")
    with open(md, "w") as f:
        f.write(markdown(data))
    print(f"wrote {md}")
    if not a.no_plot:
        png = os.path.join(out, f"bwd_tflops{a.suffix}.png")
        if plot(data, png, load_anchors(a.anchors)):
            print(f"wrote {png}")
        else:
            print("no backward rows: no plot")
    if a.print_mode:
        print("\n" + render(data, a.print_mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
