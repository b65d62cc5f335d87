# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""CPU tests of the runner's host-overhead method (`benchmarks.ops.metrics.host_overhead`, issue 19): a whole step
(forward + `torch.autograd.grad`) and the forward alone, each warmed up on the side stream and then captured on it,
`graph_bwd_us` their difference, the current stream restored after a failed capture, and the runner's line. The CUDA
calls are replaced by fakes that keep the order of events (streams, captures, replays, a clock advanced by the
replays); the real thing runs on the GPU (`--overhead`)."""

import os
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from benchmarks.ops import bench, metrics  # noqa: E402

KERNEL_MS = {"fwdbwd": 0.30, "fwd": 0.11}  # what a replay of each captured call adds to the fake GPU clock


class FakeCuda:
    """Streams, graphs and events as `host_overhead` uses them, recording what happens in `log`. Its `graph` context
    behaves like torch's: the exit runs `capture_end` before restoring the stream, so a failed capture would leave the
    capture stream current unless the caller restores it."""

    def __init__(self, fail_capture=None):
        self.log, self.current, self.clock, self.capturing = [], "default", 0.0, None
        self.fail_capture = fail_capture
        fake = self

        class Stream:
            def __init__(self, name="side"):
                self.name = name

            def wait_stream(self, other):
                fake.log.append(("wait", self.name, other.name))

        class StreamCtx:
            def __init__(self, stream):
                self.stream = stream

            def __enter__(self):
                self.prev, fake.current = fake.current, self.stream.name

            def __exit__(self, *exc):
                fake.current = self.prev

        class CUDAGraph:
            def __init__(self):
                self.ms, self.error = 0.0, None

            def replay(self):
                fake.log.append(("replay", self.ms))
                fake.clock += self.ms

        class Graph:
            def __init__(self, graph, stream):
                self.graph, self.ctx = graph, StreamCtx(stream)

            def __enter__(self):
                self.ctx.__enter__()
                fake.capturing = self.graph
                fake.log.append(("capture_begin", fake.current))

            def __exit__(self, *exc):
                fake.capturing = None
                if exc[0] is not None:
                    raise RuntimeError("operation failed due to a previous error during capture")
                self.ctx.__exit__(*exc)

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = fake.clock

            def elapsed_time(self, end):
                return end.t - self.t

        self.Stream, self.CUDAGraph, self.Event = Stream, CUDAGraph, Event
        self.stream = StreamCtx
        self.graph = lambda g, stream=None: Graph(g, stream)
        self.default = Stream("default")

    def install(self, monkeypatch):
        for name in ("Stream", "CUDAGraph", "Event", "stream", "graph"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: self.Stream(self.current))
        monkeypatch.setattr(torch.cuda, "set_stream", lambda s: setattr(self, "current", s.name))

    def build(self, mode, factor=1.0):
        """`Candidate.build`'s contract: the zero-argument call of `mode`, whose captured kernels take `factor` times
        KERNEL_MS."""
        def call():
            self.log.append((mode, self.current, "capture" if self.capturing else "run"))
            if self.capturing is not None:
                if self.fail_capture == mode:
                    raise RuntimeError("operation would make the legacy stream depend on a capturing blocking stream")
                self.capturing.ms = KERNEL_MS[mode] * factor
        return call


@pytest.mark.parametrize("mode", ["bwd", "fwdbwd", "fwd"])
def test_whole_step_and_forward_graphs(monkeypatch, mode):
    fake = FakeCuda()
    fake.install(monkeypatch)
    flushes = []
    out = metrics.host_overhead(fake.build, mode, calls=5, flush=lambda: flushes.append(1))
    assert "graph_error" not in out, out
    assert out["graph_step_us"] == pytest.approx(300.0) and out["graph_fwd_us"] == pytest.approx(110.0)
    assert out["graph_bwd_us"] == pytest.approx(190.0)
    assert out["graph_us"] == out[metrics.GRAPH_KEY[mode]]
    assert out["host_overhead_us"] == pytest.approx(out["wall_us"] - out["graph_us"])
    calls = [e for e in fake.log if e[0] in KERNEL_MS or e[0] == "bwd"]
    # the wall-time calls of the mode on the default stream, then for each graph: 3 warm-up calls on the side
    # stream and the capture there, the whole step first
    assert calls[:5] == [(mode, "default", "run")] * 5
    assert calls[5:] == [("fwdbwd", "side", "run")] * 3 + [("fwdbwd", "side", "capture")] + \
        [("fwd", "side", "run")] * 3 + [("fwd", "side", "capture")]
    assert fake.log.index(("wait", "side", "default")) < fake.log.index(("fwdbwd", "side", "run"))
    assert fake.current == "default"
    assert len(flushes) == 5 + 2 * 5  # before every wall call and every timed replay


@pytest.mark.parametrize("fail", ["fwdbwd", "fwd"])
def test_failed_capture_restores_the_stream_and_names_the_cause(monkeypatch, fail):
    fake = FakeCuda(fail_capture=fail)
    fake.install(monkeypatch)
    out = metrics.host_overhead(fake.build, "bwd", calls=3)
    assert fake.current == "default"  # torch.cuda.graph's exit alone would leave "side" current
    assert "graph_bwd_us" not in out and "host_overhead_us" not in out and out["wall_us"] >= 0
    assert out["graph_error"].startswith("RuntimeError: operation would make the legacy stream depend"), out
    assert "(then RuntimeError: operation failed due to a previous error during capture)" in out["graph_error"]
    assert metrics.compare_to_graph(out, "bwd", 400.0) == out  # nothing to compare with


def test_compare_to_graph_and_runner_line():
    ov = {"wall_us": 450.0, "graph_step_us": 260.0, "graph_fwd_us": 114.0, "graph_bwd_us": 146.0,
          "graph_us": 146.0, "host_overhead_us": 304.0}
    metrics.compare_to_graph(ov, "bwd", 175.2)
    assert ov["bwd_median_us"] == 175.2 and ov["bwd_over_graph"] == pytest.approx(175.2 / 146.0)
    res = {"candidates": {bench.OURS: {"median_us": 175.2, "tflops": None, "overhead": ov}}, "seconds": 1.0}
    line = bench.mode_line("gqa4-short", "bwd", res)
    assert "bwd alone 175 us vs graph bwd 146 us = 1.20x (wall 450, graph step 260, fwd 114)" in line, line
    res["candidates"][bench.OURS]["overhead"] = {"wall_us": 450.0, "graph_error": "RuntimeError: boom"}
    assert "graph capture failed: RuntimeError: boom" in bench.mode_line("gqa4-short", "bwd", res)
    step = metrics.compare_to_graph(dict(ov), "fwdbwd", 520.0)
    assert step["fwdbwd_over_graph"] == pytest.approx(2.0)
    assert "fwd+bwd 520 us vs graph step 260 us = 2.00x" in bench.overhead_text("fwdbwd", step)


def test_paired_graphs_replay_every_candidate_interleaved(monkeypatch):
    """`paired_graphs_us`: each candidate's step and forward graphs captured first, then all four replayed in turn,
    call by call (flushed before each; the order rotated by one each call), so drift hits both candidates alike and
    no graph always follows the same one; `host_overhead` given a candidate's
    figures captures nothing and marks them paired; a failed capture raises with the stream restored."""
    fake = FakeCuda()
    fake.install(monkeypatch)
    flushes = []
    got = metrics.paired_graphs_us({"ours": fake.build, "base": lambda m: fake.build(m, factor=2.0)}, calls=3,
                                   flush=lambda: flushes.append(1))
    assert got == {"ours": {"graph_step_us": pytest.approx(300.0), "graph_fwd_us": pytest.approx(110.0),
                            "graph_bwd_blocks_us": [pytest.approx(190.0)] * 3},
                   "base": {"graph_step_us": pytest.approx(600.0), "graph_fwd_us": pytest.approx(220.0),
                            "graph_bwd_blocks_us": [pytest.approx(380.0)] * 3}}  # one block per call: 3 < 5
    replays = [e[1] for e in fake.log if e[0] == "replay"]
    one_round = [KERNEL_MS["fwdbwd"], KERNEL_MS["fwd"], 2 * KERNEL_MS["fwdbwd"], 2 * KERNEL_MS["fwd"]]
    rotated = [one_round[i:] + one_round[:i] for i in range(3)]
    assert replays == one_round + sum(rotated, [])  # a warm-up replay of each, then 3 timed rounds
    assert len(flushes) == 3 * 4
    before = len(fake.log)
    out = metrics.host_overhead(fake.build, "bwd", calls=2, graphs=got["base"])
    assert out["graph_bwd_blocks_us"] == got["base"]["graph_bwd_blocks_us"]  # kept beside the paired figures
    assert [e for e in fake.log[before:] if e[0] != "bwd"] == []  # its wall-time calls only: no capture, no replay
    assert out["graphs_paired"] and out["graph_bwd_us"] == pytest.approx(380.0)
    assert out["graph_us"] == out["graph_bwd_us"]
    assert out["host_overhead_us"] == pytest.approx(out["wall_us"] - 380.0)
    failing = FakeCuda(fail_capture="fwd")
    failing.install(monkeypatch)
    with pytest.raises(RuntimeError, match="previous error during capture"):
        metrics.paired_graphs_us({"ours": failing.build}, calls=2)
    assert failing.current == "default"


def test_runner_pairs_graphs_only_beside_a_baseline(monkeypatch):
    """`bench._paired_graphs`: a backward row with a baseline package gets every package's figures from one
    interleaved replay; a row without one, or another mode, gets none (each package captures its own); a failed
    capture gives none and the error, which the runner records beside each package's own figures."""
    from types import SimpleNamespace

    fake = FakeCuda()
    fake.install(monkeypatch)
    timer = SimpleNamespace(flush=None)
    released = []

    def cand(name, kind, factor=1.0):
        return SimpleNamespace(name=name, kind=kind, build=lambda m: fake.build(m, factor=factor),
                               release=lambda: released.append(name))

    ours, base = cand("fla_bwd", "ours"), cand("fla_bwd@12ac0d6", "baseline", 2.0)
    got, err = bench._paired_graphs([ours, base], "bwd", timer)
    assert err is None and set(got) == {"fla_bwd", "fla_bwd@12ac0d6"} and released == ["fla_bwd", "fla_bwd@12ac0d6"]
    assert got["fla_bwd@12ac0d6"]["graph_step_us"] == pytest.approx(2 * got["fla_bwd"]["graph_step_us"])
    assert bench._paired_graphs([ours], "bwd", timer) == ({}, None)
    assert bench._paired_graphs([ours, base], "fwdbwd", timer) == ({}, None)
    failing = FakeCuda(fail_capture="fwdbwd")
    failing.install(monkeypatch)
    got, err = bench._paired_graphs([cand("fla_bwd", "ours"), SimpleNamespace(
        name="b", kind="baseline", build=failing.build, release=lambda: None)], "bwd", timer)
    assert got == {} and err.startswith("RuntimeError"), err
