# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Regenerate the Markdown summary and the peer-ratio plot from a run's JSON.

    python benchmarks/report.py benchmarks/results/summary.json --out-dir benchmarks/results \
        [--anchors benchmarks/results/anchors-h200-2026-11-29.jsonl] [--print-mode bwd]

Writes OUT_DIR/summary.md (first the answer: fla_bwd against each peer, geomean ratio by row kind, backward alone
and forward + backward; then the run and the per-row tables against the peers; last, for developers, the earlier
commit timed beside ours, the checks, how the run was made and the internal columns: host time, kernel count, the
dispatch's A/B) and OUT_DIR/peer_ratios.png (peer time / fla_bwd time
per row, log scale, one panel per peer, rows grouped by kind; matplotlib, Agg backend: no display needed).
"""

import argparse
import json
import os
import re
import sys

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.ops import summary as S  # noqa: E402
from benchmarks.ops.summary import OURS, banner, render  # noqa: E402

ANCHOR_ALIASES = {"flex-gated": "flex"}  # the anchors name flex's gated rows apart; this run does not


PLOT_NAME = "peer_ratios{suffix}.png"


GPU_TOKEN = re.compile(r"(?<![a-z0-9])([abhl]\d{2,3}|gb\d{3})(?![0-9])", re.I)  # h100, h200, a100, b200, l40, gb200


def _gpu_token(text) -> str:
    m = GPU_TOKEN.search(str(text or ""))
    return m.group(1).lower() if m else ""


def load_anchors(path, gpu: str = None):
    """{(peer, shape): bwd_tflops} from the anchors' JSONL (rows without bwd_tflops are ignored). An anchor is a
    time from another run: it is drawn only on a run of the same GPU model (`gpu`, the run's name for it), the
    anchor's model read from its row's "gpu" field, else from the file's name (anchors-h200-...); a TFLOP/s ratio
    across GPU models would be a marker that measures the GPUs, not the kernels."""
    out = {}
    if not path:
        return out
    run_gpu = _gpu_token(gpu)
    dropped = 0
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                row = json.loads(line)
                if row.get("bwd_tflops"):
                    theirs = _gpu_token(row.get("gpu")) or _gpu_token(os.path.basename(path))
                    if gpu is not None and theirs and theirs != run_gpu:
                        dropped += 1
                        continue
                    out[(ANCHOR_ALIASES.get(row["peer"], row["peer"]), row["shape"])] = row["bwd_tflops"]
    if dropped:
        print(f"anchors: {dropped} row(s) of {path} measured on another GPU than this run's ({gpu}): not drawn")
    return out


def _one(value) -> str:
    """A recorded field that may hold one line per GPU (e.g. a driver version): its distinct lines, comma-joined."""
    if value is None:
        return "?"
    lines = [x.strip() for x in str(value).splitlines() if x.strip()]
    return ", ".join(dict.fromkeys(lines)) or "?"


def answer_section(data: dict) -> list:
    """The user's answer: our time against each peer by row kind (an earlier commit of ours is no peer: its row goes
    to the developers' section)."""
    head, body, kinds = S.answer(data)
    body = [r for r in body if not r[0].startswith(S.BASELINE_PREFIX)]
    out = ["## Answer: fla_bwd against each peer", ""]
    if not body:
        why = "the gate is red" if data.get("gate", {}).get("status") == "red" else "no peer was timed"
        return out + [f"No peer ratio in this run ({why}).", ""]
    out += [
        "Each cell: the geometric mean, over the rows of that kind, of **peer time / fla_bwd time** (per row the "
        "median over independent rounds), **backward alone / forward + backward**. Above 1 fla_bwd is faster "
        "(2.00 = the peer takes twice our time); below 1 the peer is faster. `n/a`: the peer cannot run any row "
        "of the kind; `(k of n)`: it ran k of the kind's n rows. Column headers count the rows.",
        "",
        S.md_table(head, body),
        "",
        "Row kinds (derived from each shape, first rule that applies: fp32, varlen, gated, sink, windowed, short, MHA, "
        "dense GQA):",
        "",
    ]
    out += [f"- {k}: {S.KIND_RULES[k]}: {', '.join(names)}" for k, names in kinds.items()]
    return out + [""]


def developer_section(data: dict, modes: list) -> list:
    """What the project's developers read and a user need not: earlier commits of ours timed in the same run, the
    checks (gated against ungated, against the earlier commit), how the run was made, and per row the host time,
    kernel count and the A/B of the dK/dV dispatch against its forced-legacy path."""
    out = ["## For developers", "",
           "Internal checks of the same run: they say whether the package holds its own bars, not how it compares "
           "with a peer.", ""]
    head, body, _ = S.answer(data)
    base = [r for r in body if r[0].startswith(S.BASELINE_PREFIX)]
    if base:
        out += ["### An earlier commit of fla_bwd, timed in the same run", "",
                "Its time over ours, as in the answer table (above 1: this commit is faster).", "",
                S.md_table(head, base), ""]
    checks = S.check_lines(data)
    if checks:
        out += ["### Checks", "",
                f"The gated row's time over its ungated twin's (PASS when at most {S.GATED_LIMIT}), and each row's "
                "backward against the earlier commit's.", ""] + [f"- {c[len('check '):]}" for c in checks] + [""]
    env, gate = data.get("env", {}), data.get("gate", {})
    how = ["### How the run was made", ""]
    if data.get("parts"):
        how.append(f"- {len(data['parts'])} parts of a split run, merged by benchmarks/merge.py; correctness gate "
                   f"{gate.get('status')} ({gate.get('file')})"
                   + (f", ran in part {gate['ran_in_part']}" if gate.get("ran_in_part") else ""))
        fill_shapes = {s for f in data.get("fills") or [] for s in f["shapes"]}
        for p in data["parts"]:
            e = p.get("env") or {}
            g = p.get("gate") or {}
            gs = g.get("status") if not g.get("inherited") else f"{g.get('status')} (inherited from part 1)"
            filled = [s for s in p.get("shapes") or [] if s in fill_shapes]
            how.append(f"- part {p['index']}/{p['of']}: {len(p.get('shapes') or [])} shapes"
                       + (f" ({', '.join(filled)} not reported, measured by a fill)" if filled else "")
                       + f", {p.get('elapsed_s')} s (estimate {p.get('estimate_s')} s), gate {gs}, started "
                       f"{e.get('started')} on {e.get('gpu')} {e.get('host')}, fingerprint "
                       f"{e.get('source_fingerprint')}: `{p.get('command')}`")
        for f in data.get("fills") or []:
            e, g = f.get("env") or {}, f.get("gate") or {}
            how.append(f"- fill {f['file']}: {', '.join(f['shapes'])}, {f.get('elapsed_s')} s, gate {g.get('status')}"
                       f" (its own run), started {e.get('started')} on {e.get('gpu')} {e.get('host')}, fingerprint "
                       f"{e.get('source_fingerprint')}: `{f.get('command')}`")
    else:
        how.append(f"- command: `{env.get('command')}`; correctness gate {gate.get('status')} ({gate.get('file')})")
    out += how + ["", "Per row: host us (the host's share of a call), the kernel count, A/B = forced-legacy time / "
                  "dispatch time (median over independent rounds [min-max]) and the earlier commit's time (x = its "
                  "time over ours).", ""]
    out += ["\n\n".join(S.render(data, m, markdown=True, with_banner=False, view="dev", heading="###",
                                  title=f"{m} ({S.MODE_TITLES.get(m, m)}): internals") for m in modes)]
    return out


def markdown(data: dict) -> str:
    env = data.get("env", {})
    gate = data.get("gate", {})
    commit = str(env.get("bench_commit") or env.get("git_commit") or "?")[:7]
    day = str(env.get("started") or "")[:10]
    # the first line names what was measured where: the record is read against one GPU and one commit
    head = [f"# Benchmark: {data.get('op', '?')}, {OURS} against its peers: commit {commit} on "
            f"{env.get('gpu') or 'no GPU'}{', ' + day if day else ''}", ""]
    head += [f"**{line}**" for line in banner(data)] + ([""] if banner(data) else [])
    head += answer_section(data)
    gpu = env.get("gpu") or "no GPU"
    run = [
        "## Run",
        "",
        f"- GPU: {gpu} (driver {_one(env.get('driver'))}, CUDA {env.get('cuda')}); torch {env.get('torch')}, "
        f"triton {env.get('triton')}, Python {env.get('python')}",
        f"- commit: {env.get('bench_commit') or env.get('git_commit')}{' (dirty)' if env.get('git_dirty') else ''}"
        f" (source fingerprint {env.get('source_fingerprint')}); started {env.get('started')}",
        f"- timer: {data.get('timer')}; correctness gate: {gate.get('status')} (how the run was made: "
        "[For developers](#for-developers))",
    ]
    if env.get("collect_env") and "error" not in env["collect_env"]:
        run.append("- environment: torch.utils.collect_env, recorded whole in the JSON under `env.collect_env`")
    run += [
        "",
        "## Detail tables",
        "",
        "Times in microseconds (median over independent rounds); `(x)` = peer time / fla_bwd time (> 1: fla_bwd "
        "faster); `[x]` beside FA3: both timed FA3's way; `skip`: the peer did not run the row (reasons below each "
        "table); vs twin: our time per visible pair over ours on the row it is compared with (the same work "
        "without the sink or the packing; equal pairs make it the time ratio), where both ran; peak-inputs MiB: peak "
        "memory over the inputs.",
        "",
    ]
    modes = [m for m in ("bwd", "fwdbwd", "fwd") if any(m in r.get("modes", {}) for r in data.get("results", []))]
    body = [render(data, m, markdown=True, with_banner=False, view="user") for m in modes]
    if data.get("skipped_shapes"):
        body.append("Shapes not run: " + ", ".join(f"{k} ({v})" for k, v in data["skipped_shapes"].items()))
    errs = [(r["shape"]["name"], k, v) for r in data.get("results", []) for k, v in r.get("errors", {}).items()]
    if errs:
        body.append("Errors:\n\n" + "\n".join(f"- {n} {k}: {v}" for n, k, v in errs))
    body.append("\n".join(developer_section(data, modes)))
    return "\n".join(head + run) + "\n" + "\n\n".join(body) + "\n"


def ratio_rows(data: dict, anchors: dict = None):
    """What the plot draws: rows (bwd or fwdbwd) grouped by kind, peers, and per (peer, row) the ratios
    {mode: peer time / fla_bwd time} of this run, or {"anchor": ...} (bwd, from the anchors' TFLOP/s and ours)
    where the run has none for that peer, or {} (n/a)."""
    recs = [r for r in data.get("results", []) if {"bwd", "fwdbwd"} & set(r.get("modes", {}))]
    by_kind = {}
    for r in recs:
        by_kind.setdefault(S.row_kind(r["shape"]), []).append(r)
    groups = [(k, by_kind[k]) for k in S.KINDS if k in by_kind]
    peers = sorted({p for r in recs for m in r["modes"].values() for p in m.get("vs", {})}, key=S._peer_sort)
    anchors = anchors or {}
    ratios = {}
    for r in recs:
        name = r["shape"]["name"]
        ours_tf = r["modes"].get("bwd", {}).get("candidates", {}).get(OURS, {}).get("tflops")
        for p in set(peers) | {a for a, _ in anchors}:
            got = {m: r["modes"][m].get("vs", {}).get(p, {}).get("median") for m in ("bwd", "fwdbwd")
                   if m in r["modes"]}
            got = {m: x for m, x in got.items() if x}
            if not got and anchors.get((p, name)) and ours_tf and data.get("gate", {}).get("status") != "red":
                got = {"anchor": ours_tf / anchors[(p, name)]}  # same FLOP count: TFLOP/s ratio = time ratio
            ratios[(p, name)] = got
    extra = sorted({p for (p, n), v in ratios.items() if p not in peers and v}, key=S._peer_sort)
    return groups, peers + extra, ratios


def plot(data: dict, path: str, anchors: dict = None) -> bool:
    """Peer time / fla_bwd time per row, log x; one panel per peer, rows grouped by kind; `n/a` where the peer
    has no time for the row. False (nothing written) when the run has no peer ratio at all."""
    groups, peers, ratios = ratio_rows(data, anchors)
    if not groups or not any(ratios.values()):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    labels, ys, kind_ys, y = [], {}, [], 0  # top to bottom: a header line per kind, then its rows
    for kind, recs in groups:
        kind_ys.append((y, kind))
        labels.append(kind)
        y += 1
        for r in recs:
            ys[r["shape"]["name"]] = y
            labels.append(r["shape"]["name"])
            y += 1
    vals = [x for v in ratios.values() for x in v.values()]
    lo, hi = min(vals + [1.0]) / 1.25, max(vals + [1.0]) * 1.25
    fig, axes = plt.subplots(1, len(peers), sharey=True, squeeze=False,
                             figsize=(1.6 + 2.5 * len(peers), 1.6 + 0.24 * len(labels)))
    styles = {"bwd": dict(marker="o", color="tab:blue", label="backward alone"),
              "fwdbwd": dict(marker="D", color="tab:orange", mfc="none", label="forward + backward"),
              "anchor": dict(marker="x", color="tab:gray", label="backward, anchors (another run)")}
    for ax, peer in zip(axes[0], peers):
        ax.axvspan(1.0, hi, color="tab:green", alpha=0.07, lw=0)
        ax.axvline(1.0, color="black", lw=0.8)
        for ky, _ in kind_ys:
            ax.axhline(ky - 0.5, color="0.75", lw=0.6)
        for name, yy in ys.items():
            got = ratios.get((peer, name), {})
            if not got:
                ax.text(1.0, yy, "n/a", ha="center", va="center", fontsize=7, color="0.45",
                        bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="0.8", lw=0.5))
            for m, x in got.items():
                st = dict(styles[m])
                st.pop("label")
                ax.plot([x], [yy], ls="none", ms=5, **st)
        g = {m: S.geomean([v[m] for (p, _), v in ratios.items() if p == peer and m in v]) for m in ("bwd", "fwdbwd")}
        sub = ", ".join(f"{({'bwd': 'bwd', 'fwdbwd': 'fwd+bwd'})[m]} {x:.2f}" for m, x in g.items() if x == x)
        ax.set_title(f"{peer}\ngeomean {sub}" if sub else f"{peer}\n(anchors only)", fontsize=9)
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ticks = [t for t in (0.125, 0.25, 0.5, 1, 2, 4, 8) if lo <= t <= hi]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{t:g}" for t in ticks], fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    ax0 = axes[0][0]
    ax0.set_ylim(len(labels) - 0.5, -0.5)
    ax0.set_yticks(range(len(labels)))
    ax0.set_yticklabels(labels, fontsize=8)
    for ky, _ in kind_ys:
        ax0.get_yticklabels()[ky].set_fontweight("bold")
    ax0.tick_params(axis="y", length=0)
    env = data.get("env", {})
    title = (f"Peer time / {OURS} time per row, log scale (right of 1, shaded: {OURS} faster) on "
             f"{env.get('gpu') or 'CPU'}, commit {(env.get('bench_commit') or env.get('git_commit') or '?')[:7]}")
    if data.get("smoke"):
        title += " - SMOKE RUN, NOT A PERFORMANCE NUMBER"
    fig.suptitle(title, fontsize=10)
    used = {m for v in ratios.values() for m in v}
    handles = [plt.Line2D([], [], ls="none", ms=5, **styles[m]) for m in ("bwd", "fwdbwd", "anchor") if m in used]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("json", help="the run's JSON (benchmarks.ops.run --json)")
    p.add_argument("--out-dir", default=None, help="default: the JSON's folder")
    p.add_argument("--anchors", default=None,
                   help="peer anchors JSONL: marks (x) a backward ratio where this run has no time for the peer "
                        "(anchors of another GPU model than the run's are not drawn)")
    p.add_argument("--print-mode", default=None, help="also print this mode's text table to stdout (e.g. bwd)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--suffix", default="", help="name the files summary{SUFFIX}.md and peer_ratios{SUFFIX}.png")
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
        png = os.path.join(out, PLOT_NAME.format(suffix=a.suffix))
        if plot(data, png, load_anchors(a.anchors, data.get("env", {}).get("gpu") or "")):
            print(f"wrote {png}")
        else:
            print("no peer ratio in this run: no plot")
    if a.print_mode:
        print("\n" + render(data, a.print_mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
