# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Across-shape aggregates (equal-weight geomeans of every ratio, the gated/ungated check) and tables.

Pure Python over the run's JSON, shared by the runner and benchmarks/report.py.
"""

from .timing import geomean

OURS, LEGACY = "fla_bwd", "fla_bwd[legacy]"
GATED_TWINS = (("g8-T8192-gated", "g8-T8192"), ("gqa4-long-gated", "gqa4-long"))
GATED_LIMIT = 1.15


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
    """geomean[mode][key] = {all, n, by_group}; key `ab` is legacy/auto, `vs:PEER` is peer/fla_bwd (>1: faster)."""
    out = {}
    for mode in modes:
        out[mode] = {}
        for key in ratio_keys(records, mode):
            vals, groups = [], {}
            for r in records:
                x = _ratio(r.get("modes", {}).get(mode, {}), key).get("median")
                if x:
                    vals.append(x)
                    groups.setdefault(r["shape"]["group"], []).append(x)
            out[mode][key] = {"all": geomean(vals), "n": len(vals),
                              "by_group": {g: geomean(v) for g, v in sorted(groups.items())}}
    return out


def checks(records, modes) -> list:
    by = {r["shape"]["name"]: r for r in records}
    out = []
    for gated, plain in GATED_TWINS:
        if gated not in by or plain not in by:
            continue
        for mode in modes:
            a = by[gated]["modes"].get(mode, {}).get("candidates", {}).get(OURS)
            b = by[plain]["modes"].get(mode, {}).get("candidates", {}).get(OURS)
            if a and b:
                r = a["median_us"] / b["median_us"]
                out.append({"check": f"gated/ungated {gated} vs {plain} ({mode})", "ratio": r, "limit": GATED_LIMIT,
                            "pass": r <= GATED_LIMIT})
    return out


def _fmt(x, spec="{:.1f}", none="-"):
    if x is None:
        return none
    return spec.format(x) if abs(x) >= 1 or x == 0 else f"{x:.3g}"


def peer_names(records, mode):
    names = set()
    for r in records:
        names |= set(r.get("modes", {}).get(mode, {}).get("candidates", {}))
    return sorted(names - {OURS, LEGACY})


def rows(data: dict, mode: str):
    """Header and rows of the per-shape table for one mode."""
    records = data.get("results", [])
    peers = peer_names(records, mode)
    head = ["shape", "config", f"{OURS} us", "TFLOP/s", "A/B legacy/auto [min-max]", f"{LEGACY} us"]
    head += [f"{p} us (x)" for p in peers] + ["kernels", "peak-inputs MiB"]
    body = []
    for r in records:
        m = r.get("modes", {}).get(mode)
        if not m:
            continue
        c = m["candidates"]
        ours = c[OURS]
        ab = m.get("ab") or {}
        abs_ = f"{ab['median']:.3f} [{ab['min']:.3f}-{ab['max']:.3f}]" if ab.get("median") else "-"
        row = [r["shape"]["name"], r["shape"]["describe"], _fmt(ours["median_us"]), _fmt(ours.get("tflops")), abs_,
               _fmt(c.get(LEGACY, {}).get("median_us"))]
        for p in peers:
            if p in c:
                x = m.get("vs", {}).get(p, {}).get("median")
                row.append(_fmt(c[p]["median_us"]) + (f" ({x:.2f}x)" if x else ""))
            else:
                row.append("skip")
        row.append(str(ours.get("kernels", {}).get("kernels", "-")))
        row.append(_fmt(ours.get("memory", {}).get("peak_alloc_minus_inputs_MiB")))
        body.append(row)
    return head, body


def text_table(head, body) -> str:
    if not body:
        return "(no rows)"
    w = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda r: "  ".join(str(x).ljust(n) for x, n in zip(r, w))  # noqa: E731
    return "\n".join([line(head), "  ".join("-" * n for n in w)] + [line(r) for r in body])


def md_table(head, body) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(x) for x in r) + " |" for r in body]
    return "\n".join(out)


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


def geomean_lines(data: dict, mode: str) -> list:
    g = data.get("geomean", {}).get(mode, {})
    out = []
    for key, v in g.items():
        label = "A/B legacy/auto (dispatch speedup)" if key == "ab" else f"{key[3:]} / {OURS} (our speedup)"
        groups = ", ".join(f"{k} {x:.3f}" for k, x in v["by_group"].items())
        out.append(f"geomean {mode} {label}: {v['all']:.3f} over {v['n']} shapes  ({groups})")
    for c in data.get("checks", []):
        if c["check"].endswith(f"({mode})"):
            out.append(f"check {c['check']}: {c['ratio']:.3f} <= {c['limit']} -> {'PASS' if c['pass'] else 'FAIL'}")
    return out


def render(data: dict, mode: str, markdown: bool = False, with_banner: bool = True) -> str:
    head, body = rows(data, mode)
    title = f"{mode} ({ {'bwd': 'backward alone', 'fwdbwd': 'forward and backward'}.get(mode, 'forward')})"
    parts = banner(data) if with_banner else []
    skipped = {}
    for r in data.get("results", []):
        for p, why in r.get("skipped_peers", {}).items():
            skipped.setdefault(p, set()).add(why)
    skip_line = "peers skipped: " + "; ".join(f"{p}: {' / '.join(sorted(w))[:300]}" for p, w in skipped.items())
    notes = ([skip_line] if skipped else []) + geomean_lines(data, mode)
    if markdown:
        parts += [f"## {title}", md_table(head, body), "\n".join(f"- {x}" for x in notes)]
    else:
        parts += [f"== {title} ==", text_table(head, body)] + notes
    return ("\n\n" if markdown else "\n").join(parts)
