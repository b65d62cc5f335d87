# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""CPU tests of the split benchmark: the plan (parts balanced by estimated time), peers on every row, the merge of
part JSONs (refusals: other code or commit, a red or skipped gate, a missing or doubled part), and one tiny split
run through the runner (Triton interpreter) with the gate in part 1 and inherited in part 2."""

import copy
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_runner import run_cli, synthetic  # noqa: E402

from benchmarks import merge as M  # noqa: E402
from benchmarks.ops import plan, registry  # noqa: E402
from benchmarks.ops.shapes import PEERS, RECORD_PEERS, unsupported  # noqa: E402

FP = "0123456789abcdef"
COMMIT = "ab6efdcd692e1fd5cf04c6079faef679a718b6d1"


# ------------------------------------------------------------------ plan
@pytest.mark.parametrize("parts", [3, 4, 5])
def test_split_covers_every_shape_once_and_is_deterministic(parts):
    plan_ = plan.split(parts=parts)
    names = [s.name for p in plan_ for s in p]
    assert sorted(names) == sorted(s.name for s in registry.SHAPES) and len(names) == len(set(names))
    assert plan_ == plan.split(parts=parts)
    order = [s.name for s in registry.SHAPES]
    for p in plan_:  # registry (priority) order inside a part
        assert [s.name for s in p] == [n for n in order if n in {s.name for s in p}]
    for k, p in enumerate(plan_, 1):
        assert 0 < plan.part_estimate(p, k) <= plan.COMMAND_LIMIT_S, (k, plan.part_estimate(p, k))


def test_two_parts_are_flagged_over_the_command_limit():
    # the gate took 235 s in the records of b0781de and 08ece6b: two parts no longer fit one device command each
    assert plan.part_estimate(plan.split(parts=2)[0], 1) > plan.COMMAND_LIMIT_S
    text = plan.describe(2)
    assert "OVER the 540 s limit" in text.splitlines()[1] and "OVER" not in plan.describe(3)


def gpu_run_parts() -> int:
    """gpu_run.sh's default PARTS."""
    with open(os.path.join(REPO, "benchmarks", "gpu_run.sh")) as f:
        return int(re.search(r"^PARTS=\$\{PARTS:-(\d+)\}$", f.read(), re.M).group(1))


def test_default_parts_leave_headroom_and_balance():
    parts = gpu_run_parts()
    assert parts == 5  # four stopped leaving headroom with the "variants" rows
    est = [plan.part_estimate(p, k) for k, p in enumerate(plan.split(parts=parts), 1)]
    assert max(est) <= 0.75 * plan.COMMAND_LIMIT_S  # the runner's own budget (TOTAL - ~100 s) must not bite
    assert max(est) - min(est) < 60
    assert plan.parse_part("2/3") == (2, 3)
    for bad in ("0/2", "3/2", "x", "1-2"):
        with pytest.raises(ValueError):
            plan.parse_part(bad)


def test_peers_on_every_row_they_can_represent():
    assert all(s.peers is True for s in registry.SHAPES)  # no row restricts its peers for time
    by = {s.name: s for s in registry.SHAPES}
    for name in ("mha-short", "mha-long", "mha-short-fp16", "mha-long-fp16", "gqa4-short", "gqa4-long", "g8-T4096",
                 "g8-T8192"):
        assert plan.peers_for(by[name]) == list(RECORD_PEERS), name  # the plan counts the record's peers
        assert plan.peers_for(by[name], PEERS) == list(PEERS), name
    assert plan.peers_for(by["g4-T2048-D64"], PEERS) == ["flex", "sdpa-cudnn", "sdpa-fa2", "fla", "fa4", "fa4-det"]
    for name in ("g8-T8192-W512", "g8-T16384-W256", "g8-T8192-W256", "g8-T16384-W512"):
        assert plan.peers_for(by[name], PEERS) == ["flex", "fla", "fa3", "fa4", "fa4-det"], name
    for name in ("g8-T8192-gated", "gqa4-long-gated", "varlen-gated-8192", "varlen-gated-16384"):
        assert plan.peers_for(by[name], PEERS) == ["flex", "fla"], name
    assert "fp16/bf16 only" in unsupported("sdpa-cudnn", by["ctl-fp32-g8-T2048"])
    assert "head dims" in unsupported("sdpa-fa2", by["ctl-K128-V64-g8-T2048"])
    assert "window" in unsupported("sdpa-fa2", by["g8-T8192-W512"])
    assert "gate" in unsupported("fa3", by["varlen-gated-8192"])


# ------------------------------------------------------------------ merge
def parts_of(data, split=(("g8-T8192", "mha-short"), ("g8-T8192-gated",)), commits=(COMMIT, COMMIT), fps=(FP, FP)):
    """The synthetic run cut into part JSONs as the runner writes them (part 1 ran the gate; the rest deferred)."""
    out = []
    n = len(split)
    for k, names in enumerate(split, 1):
        d = copy.deepcopy(data)
        d["results"] = [r for r in d["results"] if r["shape"]["name"] in names]
        d["part"] = {"index": k, "of": n, "shapes": list(names), "all_shapes": [x for p in split for x in p],
                     "estimate_s": 100.0 * k}
        d["env"] = dict(d["env"], source_fingerprint=fps[k - 1], git_commit=None, bench_commit=commits[k - 1],
                        command=f"python3 -m benchmarks.ops.run --part {k}/{n}", started=f"t{k}")
        d["settings"] = {"ab": True, "repeats": 5, "iters": 10, "fa3_calls": 30, "peers": "all", "force_peers": False,
                         "modes": None}
        d["elapsed_s"] = 10.0 * k
        d["geomean"] = {"bwd": {"ab": {"all": 99.0, "n": 1, "by_group": {}}}}  # a part's own: must not survive
        if k > 1:
            d["gate"] = {"status": "deferred", "skipped": False, "file": d["gate"]["file"], "ran_in_part": 1}
        else:
            d["gate"] = dict(d["gate"], ran_in_part=1, seconds=131.5)
        out.append(d)
    return out


def test_merge_two_parts_recomputes_geomeans_and_checks():
    full = synthetic()
    p1, p2 = parts_of(full)
    merged = M.merge([p2, p1], ["b.json", "a.json"])  # any order in; part order out
    assert [r["shape"]["name"] for r in merged["results"]] == ["g8-T8192", "mha-short", "g8-T8192-gated"]
    assert merged["geomean"] == full["geomean"]  # over all three shapes, not a part's
    assert merged["geomean"]["bwd"]["ab"]["n"] == 3 and merged["geomean"]["bwd"]["vs:fa3"]["n"] == 2
    assert merged["checks"] == full["checks"] and merged["checks"]  # gated twin in part 2, plain in part 1
    assert [p["index"] for p in merged["parts"]] == [1, 2] and merged["parts"][1]["file"] == "b.json"
    assert merged["parts"][0]["env"]["command"].endswith("--part 1/2")
    assert "[part 1/2]" in merged["env"]["command"] and "[part 2/2]" in merged["env"]["command"]
    assert merged["gate"]["status"] == "green" and merged["gate"]["parts"] == {"1": "green", "2": "deferred"}
    assert not merged["partial"] and merged["part"] is None and merged["elapsed_s"] == 30.0


@pytest.mark.parametrize("spoil,needle", [
    (lambda ps: ps[1]["env"].update(bench_commit="0" * 40), "different commits"),
    (lambda ps: ps[1]["env"].update(source_fingerprint="ffffffffffffffff"), "different code"),
    (lambda ps: ps[0]["env"].pop("source_fingerprint"), "no source fingerprint"),
    (lambda ps: ps[0]["gate"].update(status="red"), "part 1"),
    (lambda ps: ps[0]["gate"].update(status="skipped", skipped=True), "skipped the gate"),
    (lambda ps: ps[0]["gate"].update(inherited=True), "not a green run"),
    (lambda ps: ps[1]["gate"].update(status="red"), "part 2"),
    (lambda ps: ps[1]["gate"].update(status="skipped", skipped=True), "--skip-gate"),
    (lambda ps: ps[1]["settings"].update(repeats=7), "different --repeats"),
    (lambda ps: ps[1]["results"].append(ps[0]["results"][0]), "measured in both"),
    (lambda ps: ps[1]["part"].update(index=1), "more than once"),
    (lambda ps: ps[1]["part"].update(of=3), "different numbers of parts"),
    (lambda ps: ps[1].pop("part"), "not a part"),
])
def test_merge_refuses(spoil, needle):
    ps = parts_of(synthetic())
    spoil(ps)
    with pytest.raises(M.MergeError, match=needle.replace("-", r"\-")):
        M.merge(ps)


def test_merge_accepts_short_commit_and_unknown_commit_and_inherited_gate():
    ps = parts_of(synthetic(), commits=(COMMIT, COMMIT[:10]))
    ps[1]["gate"] = dict(ps[0]["gate"], inherited=True)
    assert M.merge(ps)["results"]
    ps = parts_of(synthetic(), commits=(COMMIT, None))  # a copy without git: the fingerprint decides
    assert len(M.merge(ps)["results"]) == 3


def test_merge_missing_part_and_unreported_shape():
    p1, p2 = parts_of(synthetic())
    with pytest.raises(M.MergeError, match=r"part\(s\) \[2\] of 2 missing"):
        M.merge([p1])
    p2["results"] = []  # part 2 stopped before its shape
    merged = M.merge([p1, p2])
    assert merged["partial"] and "g8-T8192-gated" in merged["skipped_shapes"]


def fill_of(ps, names=("mha-short",)):
    """An unsplit run of part 1's code and settings, its own gate green, measuring `names`."""
    d = copy.deepcopy(ps[0])
    full = {r["shape"]["name"]: r for p in ps for r in p["results"]}
    d.pop("part")
    d["results"] = [copy.deepcopy(full[n]) for n in names]
    d["env"] = dict(d["env"], command="python3 -m benchmarks.ops.run --shapes " + ",".join(names), started="tf")
    d["gate"] = {"status": "green", "skipped": False, "file": ps[0]["gate"]["file"]}
    d["elapsed_s"] = 7.0
    return d


def test_merge_fill_completes_a_part_that_stopped_early():
    full = synthetic()
    ps = parts_of(full)
    fill = fill_of(ps)
    ps[0]["results"] = [r for r in ps[0]["results"] if r["shape"]["name"] != "mha-short"]  # part 1 stopped early
    assert "mha-short" in M.merge(copy.deepcopy(ps))["skipped_shapes"]
    merged = M.merge(ps, ["a.json", "b.json"], [fill], ["f.json"])
    assert [r["shape"]["name"] for r in merged["results"]] == ["g8-T8192", "mha-short", "g8-T8192-gated"]
    assert not merged["partial"] and not merged["skipped_shapes"]
    assert merged["geomean"] == full["geomean"] and merged["checks"] == full["checks"]
    assert merged["fills"][0]["file"] == "f.json" and merged["fills"][0]["shapes"] == ["mha-short"]
    assert merged["env"]["command"].endswith("[fill] python3 -m benchmarks.ops.run --shapes mha-short")
    assert merged["merged"]["files"] == ["a.json", "b.json", "f.json"] and merged["elapsed_s"] == 37.0


@pytest.mark.parametrize("spoil,needle", [
    (lambda ps, f: None, "measured in both a part and fill"),  # part 1 reported it
    (lambda ps, f: f["env"].update(source_fingerprint="ffffffffffffffff"), "different code"),
    (lambda ps, f: f["env"].update(bench_commit="0" * 40), "different commit"),
    (lambda ps, f: f["gate"].update(status="deferred"), "own green gate"),
    (lambda ps, f: f["gate"].update(status="red"), "own green gate"),
    (lambda ps, f: f["gate"].update(file="tests/ops/test_attn_sink.py"), "own green gate"),
    (lambda ps, f: f["settings"].update(repeats=3), "different --repeats"),
    (lambda ps, f: f.update(timer="perf_counter"), "differ in timer"),
    (lambda ps, f: f.update(part=dict(ps[0]["part"])), "give parts as parts"),
    (lambda ps, f: f["results"][0]["shape"].update(name="gqa4-long"), "in no part of the split"),
])
def test_merge_fill_refuses(spoil, needle):
    ps = parts_of(synthetic())
    fill = fill_of(ps)
    if needle != "measured in both a part and fill":
        ps[0]["results"] = [r for r in ps[0]["results"] if r["shape"]["name"] != "mha-short"]
    spoil(ps, fill)
    with pytest.raises(M.MergeError, match=needle.replace("-", r"\-")):
        M.merge(ps, None, [fill])


def test_merge_cli(tmp_path):
    paths = []
    for k, d in enumerate(parts_of(synthetic()), 1):
        paths.append(tmp_path / f"summary-part{k}.json")
        paths[-1].write_text(json.dumps(d))
    out = tmp_path / "merged"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "merge.py"), *map(str, paths),
                           "--out-dir", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((out / "summary.json").read_text())
    assert len(data["results"]) == 3 and len(data["parts"]) == 2
    md = (out / "summary.md").read_text()
    assert "part 1/2" in md and "part 2/2" in md and re.search(r"\| g8-T8192-gated +\|", md) and "PART 1/2" not in md
    assert (out / "peer_ratios.png").read_bytes()[:4] == b"\x89PNG"
    assert proc.stdout.rstrip().splitlines()[-1].startswith("check gated/ungated")  # bwd table printed last
    bad = json.loads(paths[1].read_text())
    bad["env"]["bench_commit"] = "f" * 40
    paths[1].write_text(json.dumps(bad))
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "merge.py"), *map(str, paths),
                           "--out-dir", str(tmp_path / "no")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not merged" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "no" / "summary.json").exists()


def test_merge_cli_fill(tmp_path):
    ps = parts_of(synthetic())
    fill = fill_of(ps)
    ps[0]["results"] = [r for r in ps[0]["results"] if r["shape"]["name"] != "mha-short"]
    paths = []
    for k, d in enumerate(ps + [fill], 1):
        paths.append(tmp_path / f"s{k}.json")
        paths[-1].write_text(json.dumps(d))
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "merge.py"), str(paths[0]), str(paths[1]),
                           "--fill", str(paths[2]), "--out-dir", str(tmp_path / "m"), "--no-plot"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "3 shapes from 2 parts and 1 fill(s)" in proc.stdout
    md = (tmp_path / "m" / "summary.md").read_text()
    assert "(mha-short not reported, measured by a fill)" in md and f"- fill {paths[2]}: mha-short" in md


# ------------------------------------------------------------------ a tiny split run through the runner
@pytest.mark.parametrize("args,needle", [
    (["--part", "3/2"], "1 <= K <= N"),
    (["--part", "two"], "K/N"),
    (["--smoke", "--defer-gate"], "needs --part"),
    (["--smoke", "--part", "1/2", "--defer-gate"], "part 1 runs the gate"),
])
def test_part_cli_errors(args, needle):
    proc = run_cli(*args)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_split_smoke_run_gate_in_part_one_only(tmp_path):
    # The gate passes only if part 1 removed the stale stamp of an earlier run before running it (a part started
    # beside it must not inherit that stale result while this gate runs).
    stamp = tmp_path / "stamp.json"
    (tmp_path / "test_green.py").write_text(
        f"import os\n\n\ndef test_green():\n    assert not os.path.exists({str(stamp)!r})\n")
    stamp.write_text(json.dumps({"gate": {"status": "red"}, "part": 1}))
    env = {"TRITON_INTERPRET": "1", "BENCH_COMMIT": COMMIT}
    common = ["--smoke", "--shapes", "smoke,smoke-varlen-gated", "--modes", "fwd", "--repeats", "1",
              "--gate-file", str(tmp_path / "test_green.py"), "--gate-stamp", str(tmp_path / "stamp.json")]
    runs = {}
    for k, extra in ((1, []), (2, ["--defer-gate"])):
        out = tmp_path / f"summary-part{k}.json"
        proc = run_cli(*common, "--part", f"{k}/2", *extra, "--json", str(out), env_extra=env, timeout=240)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        runs[k] = json.loads(out.read_text())
    assert runs[1]["gate"]["status"] == "green" and runs[1]["gate"]["ran_in_part"] == 1
    assert runs[2]["gate"]["status"] == "green" and runs[2]["gate"]["inherited"]
    assert runs[1]["env"]["source_fingerprint"] == runs[2]["env"]["source_fingerprint"]
    assert runs[2]["env"]["bench_commit"] == COMMIT
    names = runs[1]["part"]["shapes"] + runs[2]["part"]["shapes"]
    assert sorted(names) == ["smoke", "smoke-varlen-gated"]
    for d in runs.values():
        for r in d["results"]:
            assert r["elapsed_s"] is not None and "fla_bwd" in r["modes"]["fwd"]["setup_s"]
    # no stamp (a fresh machine): part 2 defers the gate to part 1, and the merge accepts it
    out = tmp_path / "p2-nostamp.json"
    nostamp = [a if a != str(tmp_path / "stamp.json") else str(tmp_path / "none.json") for a in common]
    proc = run_cli(*nostamp, "--part", "2/2", "--defer-gate", "--json", str(out), env_extra=env, timeout=240)
    assert proc.returncode == 0 and "DEFERRED" in proc.stdout
    deferred = json.loads(out.read_text())
    assert deferred["gate"]["status"] == "deferred"
    merged = M.merge([runs[1], deferred])
    assert sorted(r["shape"]["name"] for r in merged["results"]) == ["smoke", "smoke-varlen-gated"]
