# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The README's figures are the record's: every cell of its performance table, its memory line and the record it
names (commit, GPU, date) are read back from `benchmarks/results/summary.json`, rounded as the README prints them;
and its two commands are the ones `.ci/run` reads."""

import json
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
PEERS = {"FA3": "fa3", "cuDNN": "sdpa-cudnn", "SDPA-FA2": "sdpa-fa2", "Flex": "flex", "FLA 0.6": "fla-0.6"}


def _read(*parts):
    with open(os.path.join(REPO, *parts)) as f:
        return f.read()


@pytest.fixture(scope="module")
def readme():
    return _read("README.md")


@pytest.fixture(scope="module")
def record():
    return json.loads(_read("benchmarks", "results", "summary.json"))


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end >= 0 else len(text)]


def _table(section: str):
    """(header cells, rows of cells) of the first Markdown table in `section`."""
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    return cells[0], cells[2:]


def _by_name(record):
    return {r["shape"]["name"]: r for r in record["results"]}


def _ratio(rec, mode, peer):
    return rec["modes"].get(mode, {}).get("vs", {}).get(peer, {}).get("median")


def test_the_record_named_is_the_newest(readme, record):
    env = record["env"]
    perf = " ".join(_section(readme, "Performance").split())
    assert f"commit {str(env['bench_commit'])[:7]}" in perf
    assert env["gpu"] in perf and str(env["started"])[:10] in perf
    peers = {p for r in record["results"] for m in r["modes"].values() for p in m.get("vs", {})}
    assert "FA4 is not in the record" in perf and not any("fa4" in p.lower() for p in peers)


def test_every_table_cell_is_the_records(readme, record):
    head, rows = _table(_section(readme, "Performance"))
    assert head[:3] == ["row", "shape", "ours, us"] and [PEERS[h] for h in head[3:]]
    recs = _by_name(record)
    seen_loss = False
    for row in rows:
        name = row[0].strip("`")
        for col, cell in zip(head[3:], row[3:]):
            peer = PEERS[col]
            if name == "geomean":
                want = [record["geomean"][m][f"vs:{peer}"]["all"] for m in ("bwd", "fwdbwd")]
                assert row[2] == ""
            else:
                rec = recs[name]
                modes = ["bwd", "fwdbwd"] if "bwd" in rec["modes"] else ["fwd"]
                ours = rec["modes"][modes[0]]["candidates"]["fla_bwd"]["median_us"]
                assert row[2] == f"{ours:.0f}", (name, row[2], ours)
                assert re.search(rf"(^|\D){rec['shape']['T']}(\D|$)", row[1]), (name, row[1])
                want = [_ratio(rec, m, peer) for m in modes]
            if not any(want):
                assert cell == "-", (name, col, cell)
                continue
            assert cell == " / ".join(f"{x:.2f}" for x in want), (name, col, cell, want)
            seen_loss |= min(want) < 1
    assert seen_loss  # the rows where it loses are in the table
    assert {r[0].strip("`") for r in rows} >= {"geomean", "mha-long", "mha-short"}


def test_memory_and_forward_figures_are_the_records(readme, record):
    perf = _section(readme, "Performance")
    recs = _by_name(record)
    mem = {}
    for name in ("g8-T16384-W512", "g8-T8192"):
        cands = recs[name]["modes"]["fwdbwd"]["candidates"]
        mem[name] = {p: c.get("memory", {}).get("peak_alloc_minus_inputs_MiB") for p, c in cands.items()}
    w, d = mem["g8-T16384-W512"], mem["g8-T8192"]
    assert (f"`g8-T16384-W512` {w['fla_bwd']:.0f} MiB against FlexAttention's {w['flex']:.0f} and FLA 0.6's "
            f"{w['fla-0.6']:.0f}") in " ".join(perf.split())
    dense = json.loads(_read("benchmarks", "results", "record-2207b11-h100", "session35", "memory-g8-T16384.json"))
    assert f"dense G8 T16384 call also stays at {dense['memory_MiB']['g8-T16384']['auto']:.0f} MiB" in " ".join(
        perf.split())
    assert (f"`g8-T8192` {d['fla_bwd']:.0f} MiB against FLA 0.6's {d['fla-0.6']:.0f} and cuDNN's "
            f"{d['sdpa-cudnn']:.0f}") in " ".join(perf.split())
    fwd = _ratio(recs["ctl-fwd-g8-T8192"], "fwd", "fa3")
    assert f"ours is {fwd:.2f}x FA3's in the record" in " ".join(readme.split())


def test_the_two_commands_ci_reads(readme):
    section = _section(readme, "Two commands on a fresh machine")
    assert [ln[4:] for ln in section.splitlines() if ln.startswith("    pip install -e ")] == [
        "pip install -e . && python scripts/main_job.py",
        "pip install -e '.[test]' && python -m pytest tests -q -n 2 --dist loadfile",
    ]
