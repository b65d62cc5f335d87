# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Across-shape aggregates (equal-weight geomeans of every ratio, by registry group and by row kind; the
gated/ungated check) and tables: the answer table (fla_bwd against each peer, by row kind) and the detail tables.

Pure Python over the run's JSON (tables through tabulate), shared by the runner and benchmarks/report.py.
"""

import functools
import json
import os

from tabulate import tabulate

from .metrics import GRAPH_KEY
from .timing import geomean

OURS, LEGACY = "fla_bwd", "fla_bwd[legacy]"
GATED_TWINS = (("g8-T8192-gated", "g8-T8192"), ("gqa4-long-gated", "gqa4-long"))
GATED_LIMIT = 1.15
BASELINE_PREFIX = "fla_bwd@"  # an earlier commit's package (`candidates.load_baseline`)
BASELINE_LONG_US = 400.0  # issue 18: rows this long compare eager medians, within BASELINE_SLACK
BASELINE_SLACK = 1.02
# Issue 18 sorts rows by their backward "in the record at 12ac0d6": a baseline commit's record, where the repository
# has one, classifies the rows it ran; the baseline's median in this run (host-bound rows vary by host) the rest.
RECORDS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")

# Row kinds, derived from the shape alone (first rule that applies), in the answer table's column order.
SHORT_T = 512
KINDS = ("dense GQA", "MHA", f"short (T<={SHORT_T})", "windowed", "gated", "sink", "variant", "varlen", "fp32")
KIND_RULES = {
    "fp32": "fp32 inputs (a control: most peers are fp16/bf16 only)",
    "varlen": "packed variable-length batch (gated or not)",
    "gated": "forget gate, dense",
    "sink": "attention sink, dense",
    "variant": "the call's variants: causal=False, softcap, return_lse, queries shorter than keys",
    "windowed": "sliding window",
    f"short (T<={SHORT_T})": f"dense causal, T <= {SHORT_T} (host-bound)",
    "MHA": "dense causal, G = 1",
    "dense GQA": "dense causal, G >= 2 (any K, V)",
}
PEER_ORDER = ("fa3", "fa4", "fa4-det", "sdpa-cudnn", "sdpa-fa2", "flex", "fla-0.6")
MODE_TITLES = {"bwd": "backward alone", "fwdbwd": "forward + backward", "fwd": "forward"}


def row_kind(shape: dict) -> str:
    """The row's kind from its shape record (`Shape.as_dict()`): fp32, varlen, gated, sink, variant (a record with
    `causal`, `softcap`, `lse` or `Tq`: only variant rows carry them), windowed, short, MHA or GQA."""
    if shape.get("dtype") == "fp32":
        return "fp32"
    if shape.get("varlen"):
        return "varlen"
    if shape.get("gated"):
        return "gated"
    if shape.get("sink"):
        return "sink"
    if shape.get("causal") is False or shape.get("softcap") or shape.get("lse") or shape.get("Tq") is not None:
        return "variant"
    if shape.get("W"):
        return "windowed"
    if shape.get("T", 0) <= SHORT_T:
        return f"short (T<={SHORT_T})"
    return "MHA" if shape.get("G", shape.get("HQ", 0) // max(shape.get("H", 1), 1)) == 1 else "dense GQA"


def _peer_sort(p):
    return (PEER_ORDER.index(p) if p in PEER_ORDER else len(PEER_ORDER), p)


def ratio_keys(records, mode):
    keys = set()
    for r in records:
        m = r.get("modes", {}).get(mode, {})
        if m.get("ab", {}).get("median"):
            keys.add("ab")
        keys |= {f"vs:{p}" for p, v in m.get("vs", {}).items() if v.get("median")}
    return sorted(keys, key=lambda k: (k != "ab", k))


def _ratio(m, key):
    return (m.get("ab") if key == "ab" else m.get("vs", {}).get(key[3:], {})) or {}


def aggregate(records, modes) -> dict:
    """geomean[mode][key] = {all, n, by_group, by_kind}; key `ab` is legacy/auto, `vs:PEER` is peer/fla_bwd
    (> 1: fla_bwd faster)."""
    out = {}
    for mode in modes:
        out[mode] = {}
        for key in ratio_keys(records, mode):
            vals, groups, kinds = [], {}, {}
            for r in records:
                x = _ratio(r.get("modes", {}).get(mode, {}), key).get("median")
                if x:
                    vals.append(x)
                    groups.setdefault(r["shape"]["group"], []).append(x)
                    kinds.setdefault(row_kind(r["shape"]), []).append(x)
            out[mode][key] = {"all": geomean(vals), "n": len(vals),
                              "by_group": {g: geomean(v) for g, v in sorted(groups.items())},
                              "by_kind": {k: geomean(kinds[k]) for k in KINDS if k in kinds}}
    return out


def checks(records, modes) -> list:
    """The gated/ungated checks, then `baseline_checks`: per twin and mode, our median's ratio (the check of
    record), and where both rows measured host overhead (`--overhead`), the same ratio of their whole-step CUDA-graph
    kernel times, labelled "graph kernels": at T = 2048 the eager medians sit at the host/GPU line (host-bound rows), so
    that line says what the kernels alone cost."""
    by = {r["shape"]["name"]: r for r in records}
    out = []
    for gated, plain in GATED_TWINS:
        if gated not in by or plain not in by:
            continue
        for mode in modes:
            a = by[gated]["modes"].get(mode, {}).get("candidates", {}).get(OURS)
            b = by[plain]["modes"].get(mode, {}).get("candidates", {}).get(OURS)
            if not (a and b):
                continue
            ratios = [("", a["median_us"] / b["median_us"])]
            graph_a, graph_b = (c.get("overhead", {}).get(GRAPH_KEY[mode]) for c in (a, b))
            if graph_a and graph_b:
                ratios.append((", graph kernels", graph_a / graph_b))
            out += [{"check": f"gated/ungated {gated} vs {plain}{label} ({mode})", "ratio": r, "limit": GATED_LIMIT,
                     "pass": r <= GATED_LIMIT} for label, r in ratios]
    return out + (baseline_checks(records) if "bwd" in modes else [])


@functools.lru_cache(maxsize=None)
def record_bwd_us(label: str) -> dict:
    """{row: our backward-alone median, us} in the benchmark of record of the commit `label` names, where that
    record is the newest one (`benchmarks/results/summary.json`, its commit in `env`), else {} (an older record
    lives in git history; a patched candidate's label has none): then this run's figures sort the rows."""
    commit = label[len(BASELINE_PREFIX):]
    path = os.path.join(RECORDS_DIR, "summary.json")
    if not commit or not os.path.isfile(path):
        return {}
    with open(path) as f:
        data = json.load(f)
    env = data.get("env", {})
    recorded = str(env.get("bench_commit") or env.get("git_commit") or "")
    if not recorded or not (recorded.startswith(commit) or commit.startswith(recorded)):
        return {}
    return {r["shape"]["name"]: r["modes"]["bwd"]["candidates"][OURS]["median_us"] for r in data.get("results", [])
            if OURS in r.get("modes", {}).get("bwd", {}).get("candidates", {})}


def baseline_checks(records) -> list:
    """Issue 18's bar against an earlier commit timed in the same run (`--baseline`, a candidate `fla_bwd@COMMIT`):
    a row whose baseline backward takes BASELINE_LONG_US or more (in that commit's record where there is one,
    `record_bwd_us`, else in this run) may be at most BASELINE_SLACK slower by eager medians; a shorter one no
    slower by whole-step CUDA-graph kernel time (labelled "paired" where both packages' graphs were replayed
    interleaved, `metrics.paired_graphs_us`), or by eager medians where either graph figure is missing (stricter
    wherever our host path is the faster one)."""
    out = []
    for r in records:
        c = r.get("modes", {}).get("bwd", {}).get("candidates", {})
        if OURS not in c:
            continue
        for name in (n for n in c if n.startswith(BASELINE_PREFIX)):
            ours, base, row = c[OURS], c[name], r["shape"]["name"]
            graphs = [x.get("overhead", {}).get(GRAPH_KEY["bwd"]) for x in (ours, base)]
            paired = all(x.get("overhead", {}).get("graphs_paired") for x in (ours, base))
            blocks = [x.get("overhead", {}).get("graph_bwd_blocks_us") for x in (ours, base)]
            extra = {}
            if record_bwd_us(name).get(row, base["median_us"]) >= BASELINE_LONG_US:
                label, ratio, limit = "", ours["median_us"] / base["median_us"], BASELINE_SLACK
            elif all(graphs):
                label, ratio, limit = ", graph kernels" + (" paired" if paired else ""), graphs[0] / graphs[1], 1.0
                if paired and all(blocks):
                    extra = {"blocks": [a / b for a, b in zip(*blocks)]}
            else:
                label, ratio, limit = ", eager (no graph figure)", ours["median_us"] / base["median_us"], 1.0
            out.append({"check": f"{row} {OURS}/{name}{label} (bwd)", "ratio": ratio, "limit": limit,
                        "pass": ratio <= limit, **extra})
    return out


def _fmt(x, spec="{:.1f}", none="-"):
    if x is None:
        return none
    return spec.format(x) if abs(x) >= 1 or x == 0 else f"{x:.3g}"


def peer_names(records, mode):
    names = set()
    for r in records:
        names |= set(r.get("modes", {}).get(mode, {}).get("candidates", {}))
    return sorted(names - {OURS, LEGACY}, key=_peer_sort)


ROW_VIEWS = ("all", "user", "dev")
TWIN_HEAD = "vs twin (ours/twin per visible pair)"


def twin_ratios(records, mode) -> dict:
    """{row: (twin, ratio)} for the rows whose twin (`Shape.twin`) ran `mode` in the same record: our median per
    visible pair over our median per visible pair on the twin (> 1: the row costs more per pair). Where both rows
    have the same pairs (a sink, or equal sequences packed) this is the plain time ratio."""
    per_pair = {}
    for r in records:
        ours = r.get("modes", {}).get(mode, {}).get("candidates", {}).get(OURS)
        if ours and r["shape"].get("pairs"):
            per_pair[r["shape"]["name"]] = ours["median_us"] / r["shape"]["pairs"]
    return {r["shape"]["name"]: (r["shape"]["twin"], per_pair[r["shape"]["name"]] / per_pair[r["shape"]["twin"]])
            for r in records if r["shape"]["name"] in per_pair and r["shape"].get("twin") in per_pair}


def _is_baseline(name: str) -> bool:
    return name.startswith(BASELINE_PREFIX)


def rows(data: dict, mode: str, view: str = "all"):
    """Header and rows of the per-shape table for one mode. `view`: "all" (every column, the runner's table),
    "user" (our time against the peers, no internal variant or earlier commit) or "dev" (host time, kernel count,
    the A/B against the forced-legacy dispatch and the earlier commits timed in the same run)."""
    assert view in ROW_VIEWS, view
    records = data.get("results", [])
    peers = peer_names(records, mode)
    if view == "user":
        peers = [p for p in peers if not _is_baseline(p)]
    elif view == "dev":
        peers = [p for p in peers if _is_baseline(p)]
    user, dev = view in ("all", "user"), view in ("all", "dev")
    twins = twin_ratios(records, mode) if user and data.get("gate", {}).get("status") != "red" else {}
    head = ["shape"] + (["config"] if user else []) + [f"{OURS} us"] + (["TFLOP/s"] if user else [])
    head += [TWIN_HEAD] if twins else []
    head += (["host us", "A/B legacy/auto [min-max]", f"{LEGACY} us"] if dev else [])
    head += [f"{p} us (x)" for p in peers] + (["kernels"] if dev else []) + (["peak-inputs MiB"] if user else [])
    body = []
    for r in records:
        m = r.get("modes", {}).get(mode)
        if not m:
            continue
        c = m["candidates"]
        ours = c[OURS]
        ab = m.get("ab") or {}
        abs_ = f"{ab['median']:.3f} [{ab['min']:.3f}-{ab['max']:.3f}]" if ab.get("median") else "-"
        row = [r["shape"]["name"]] + ([r["shape"]["describe"]] if user else []) + [_fmt(ours["median_us"])]
        row += [_fmt(ours.get("tflops"))] if user else []
        if twins:
            twin = twins.get(r["shape"]["name"])
            row.append(f"{twin[1]:.3f} ({twin[0]})" if twin else "-")
        row += [_fmt(ours.get("host_us")), abs_, _fmt(c.get(LEGACY, {}).get("median_us"))] if dev else []
        for p in peers:
            if p in c:
                x = m.get("vs", {}).get(p, {}).get("median")
                same = m.get("vs", {}).get(p, {}).get("same_method")  # fa3: both timed its way (`timed_as_fa3`)
                row.append(_fmt(c[p]["median_us"]) + (f" ({x:.2f}x)" if x else "")
                           + (f" [{same:.2f}x]" if same else ""))
            else:
                row.append("skip")
        if dev:
            row.append(str(ours.get("kernels", {}).get("kernels", "-")))
        if user:
            row.append(_fmt(ours.get("memory", {}).get("peak_alloc_minus_inputs_MiB")))
        body.append(row)
    return head, body


def text_table(head, body) -> str:
    if not body:
        return "(no rows)"
    return tabulate(body, headers=head, tablefmt="simple", disable_numparse=True)


def md_table(head, body) -> str:
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True)


def answer(data: dict, modes=("bwd", "fwdbwd")):
    """The answer table: one row per peer, one column per row kind (and all rows); each cell the geomean over the
    kind's rows of the per-row ratio peer time / fla_bwd time (the median over rounds) for each of `modes`, "n/a"
    where the peer ran no row of the kind, "(k of n)" where it ran only some. Returns (head, body, kinds present)."""
    records = [r for r in data.get("results", []) if any(m in r.get("modes", {}) for m in modes)]
    rows_of = {}
    for r in records:
        rows_of.setdefault(row_kind(r["shape"]), []).append(r)
    kinds = [k for k in KINDS if k in rows_of]
    peers = sorted({p for r in records for m in modes for p in r["modes"].get(m, {}).get("vs", {})}, key=_peer_sort)
    head = ["peer"] + [f"all rows ({len(records)})"] + [f"{k} ({len(rows_of[k])})" for k in kinds]
    body = []
    for p in peers:
        row = [p]
        for group in [records] + [rows_of[k] for k in kinds]:
            cells, counts = [], []
            for m in modes:
                xs = [x for x in (r["modes"].get(m, {}).get("vs", {}).get(p, {}).get("median") for r in group) if x]
                cells.append(f"{geomean(xs):.2f}" if xs else "n/a")
                counts.append(len(xs))
            if not any(counts):
                row.append("n/a")
                continue
            cell = " / ".join(cells)
            if len(set(counts)) > 1:
                cell += " (" + ", ".join(f"{MODE_TITLES[m]} {c}" for m, c in zip(modes, counts)) + f" of {len(group)})"
            elif counts[0] < len(group):
                cell += f" ({counts[0]} of {len(group)})"
            row.append(cell)
        body.append(row)
    return head, body, {k: [r["shape"]["name"] for r in rows_of[k]] for k in kinds}


def fmt_check(ratio: float, limit: float, ok: bool) -> str:
    """`ratio <= limit` or `ratio > limit`, the operator from the outcome and as many digits as it takes for the
    printed ratio to stand on the printed side of the limit (1.1516 against 1.15 prints `1.152 > 1.15`)."""
    for digits in range(3, 16):
        shown = f"{ratio:.{digits}f}"
        if (float(shown) <= limit) == ok:
            break
    return f"{shown} {'<=' if ok else '>'} {limit}"


def banner(data: dict) -> list:
    lines = []
    gate = data.get("gate", {})
    if data.get("smoke"):
        lines.append("SMOKE RUN: CPU interpreter self-test timings. NOT A PERFORMANCE NUMBER.")
    if gate.get("skipped"):
        lines.append("WARNING: correctness gate SKIPPED (--skip-gate): speedups are not gated.")
    elif gate.get("status") == "red":
        lines.append(f"GATE RED ({gate.get('file')}): no speedup reported.")
    elif gate.get("status") == "deferred":
        lines.append(f"GATE DEFERRED to part {gate.get('ran_in_part', 1)}: these ratios count only once "
                     "benchmarks/merge.py has checked that part's green gate.")
    part = data.get("part")
    if part:
        lines.append(f"PART {part['index']}/{part['of']} of a split run ({len(part.get('shapes', []))} shapes): "
                     "merge every part with benchmarks/merge.py for the benchmark of record.")
    if data.get("partial"):
        lines.append("PARTIAL RUN: the run stopped before finishing every shape.")
    return lines


def geomean_lines(data: dict, mode: str, view: str = "all") -> list:
    """The mode's geomean lines: "user" the peers', "dev" the A/B's and the earlier commits', "all" every one and
    the mode's checks."""
    g = data.get("geomean", {}).get(mode, {})
    out = []
    for key, v in g.items():
        internal = key == "ab" or _is_baseline(key[3:])
        if (view == "user" and internal) or (view == "dev" and not internal):
            continue
        label = "A/B legacy/auto (dispatch speedup)" if key == "ab" else f"{key[3:]} / {OURS} (our speedup)"
        groups = ", ".join(f"{k} {x:.3f}" for k, x in v["by_group"].items())
        out.append(f"geomean {mode} {label}: {v['all']:.3f} over {v['n']} shapes  ({groups})")
    return out + (check_lines(data, mode) if view == "all" else [])  # the report lists the checks apart


def check_lines(data: dict, mode: str = None) -> list:
    """One line per check (of `mode`, or all): the ratio against its limit, and where the check has them, the
    ratio's spread over consecutive blocks of its paired graph replays (`metrics.PAIRED_BLOCKS`)."""
    def spread(c):
        b = c.get("blocks")
        return f" (over {len(b)} blocks of its replays: {min(b):.3f}-{max(b):.3f})" if b else ""
    return [f"check {c['check']}: {fmt_check(c['ratio'], c['limit'], c['pass'])} -> {'PASS' if c['pass'] else 'FAIL'}"
            f"{spread(c)}" for c in data.get("checks", []) if mode is None or c["check"].endswith(f"({mode})")]


def render(data: dict, mode: str, markdown: bool = False, with_banner: bool = True, view: str = "all",
           title: str = None, heading: str = "##") -> str:
    """One mode's table and its notes (peers skipped, geomeans, checks); `view` as in `rows`; `heading` the
    Markdown title's level."""
    head, body = rows(data, mode, view)
    title = title or f"{mode} ({MODE_TITLES.get(mode, mode)})"
    parts = banner(data) if with_banner else []
    skipped = {}
    for r in data.get("results", []):
        for p, why in r.get("skipped_peers", {}).items():
            skipped.setdefault(p, set()).add(why)
    skip_line = "peers skipped: " + "; ".join(f"{p}: {' / '.join(sorted(w))[:300]}" for p, w in skipped.items())
    notes = ([skip_line] if skipped and view != "dev" else []) + geomean_lines(data, mode, view)
    if markdown:
        parts += [f"{heading} {title}", md_table(head, body)] + (["\n".join(f"- {x}" for x in notes)] if notes else [])
    else:
        parts += [f"== {title} ==", text_table(head, body)] + notes
    return ("\n\n" if markdown else "\n").join(parts)
