# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Shared test setup: Triton's CPU interpreter when there is no GPU, NaN-poisoned buffers, per-test seeds, and the
error-ratio check `assert_close` with a per-output summary of the largest ratio seen in the session."""

import os

import torch

# Must happen before anything imports triton (fla_bwd does): the interpreter is chosen when triton is imported.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402
import zlib  # noqa: E402

import pytest  # noqa: E402
from poison import poisoned  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Output name -> (largest ratio seen, test id). Filled by `assert_close`, printed by `pytest_terminal_summary`
# (with the largest among tests that passed next to it).
MAX_RATIOS: dict = {}
_TEST_RATIOS: dict = {}  # test id -> {output name: largest ratio in that test}
_PASSED: set = set()
_CURRENT_TEST = {"id": "?"}
_RESERVED_KEEP = 4 << 30  # bytes of cached GPU memory a worker may keep between tests


def error_ratio(ref: torch.Tensor, out: torch.Tensor) -> float:
    """rms(ref - out) / rms(ref), in fp64. A zero reference makes it the absolute rms of out (0 when both are 0)."""
    ref, out = ref.detach().double(), out.detach().double()
    err = (ref - out).pow(2).mean().sqrt().item() if ref.numel() else 0.0
    base = ref.pow(2).mean().sqrt().item() if ref.numel() else 0.0
    if base == 0.0:
        return err
    return err / base


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float = 0.005) -> float:
    """Fail unless `out` is finite, has `ref`'s shape and rms(ref - out) / rms(ref) < ratio. Records the ratio."""
    assert out is not None, f"{name}: no gradient/output was returned"
    assert ref.shape == out.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    finite = torch.isfinite(out)
    if not finite.all():
        bad = (~finite).nonzero()
        raise AssertionError(f"{name}: {bad.shape[0]} of {out.numel()} elements are NaN/Inf "
                             f"(first at index {bad[0].tolist()}); an unwritten poisoned element shows up as NaN")
    assert torch.isfinite(ref).all(), f"{name}: the reference itself is not finite"
    r = error_ratio(ref, out)
    print(f"{name}: error ratio {r:.3e}")
    best = MAX_RATIOS.get(name)
    if best is None or r > best[0]:
        MAX_RATIOS[name] = (r, _CURRENT_TEST["id"])
    per_test = _TEST_RATIOS.setdefault(_CURRENT_TEST["id"], {})
    per_test[name] = max(r, per_test.get(name, 0.0))
    assert r < ratio, f"{name}: error ratio {r:.3e} >= {ratio}"
    return r


@pytest.fixture(autouse=True)
def _poison_and_seed(request):
    """Every buffer the package allocates is NaN-filled (`poison.py`); every test gets its own reproducible seed."""
    _CURRENT_TEST["id"] = request.node.nodeid
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    with poisoned():
        yield
    # A test past 2**31 elements leaves ~35 GB in this worker's caching allocator, where the other pytest workers
    # on the GPU cannot get it: on 2026-11-30 a T = 15 sink test in another worker failed to launch with
    # "Triton Error [CUDA]: out of memory" (8 workers on one H200). Hand large reservations back after each test.
    if DEVICE == "cuda" and torch.cuda.memory_reserved() > _RESERVED_KEEP:
        torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _fresh_plans():
    """Every test starts without cached launch plans: a backward's plan is keyed on the call and the settings but
    not on `config`'s tables (`host._backward_plan`), which tests monkeypatch, so a plan built by an earlier test
    under other tables would stand in for the dispatch under this test's."""
    host = sys.modules.get("fla_bwd.ops.attn.host")
    if host is not None:
        host.clear_plans()
    yield


def pytest_configure(config):
    # A numpy warning from Triton's interpreter means a kernel computed an invalid value: an error in this suite.
    # (The launcher turns numpy's flags off around this package's launches, whose masked lanes compute 0 / 0 as on
    # the GPU; a warning here comes from elsewhere, e.g. a test's own kernel.)
    config.addinivalue_line("filterwarnings", "error::RuntimeWarning:triton.runtime.interpreter")


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        _PASSED.add(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """With FLA_BWD_RATIOS_DIR set, each process (pytest-xdist workers included, whose ratios the controller's
    summary cannot see) writes its largest ratio per output there; `scripts/merge_ratios.py` merges them."""
    out = os.environ.get("FLA_BWD_RATIOS_DIR")
    if out and MAX_RATIOS:
        import json
        os.makedirs(out, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(out, f"ratios-{worker}.json"), "w") as f:
            json.dump({n: list(v) for n, v in MAX_RATIOS.items()}, f)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not MAX_RATIOS:
        return
    terminalreporter.section(f"largest error ratio per output ({DEVICE})")
    order = {n: i for i, n in enumerate(("o", "dq", "dk", "dv", "dg", "dsink"))}
    for name in sorted(MAX_RATIOS, key=lambda n: (order.get(n, len(order)), n)):
        r, test = MAX_RATIOS[name]
        line = f"{name:>18}: {r:.3e}  ({test})"
        passed = [(ratios[name], t) for t, ratios in _TEST_RATIOS.items() if t in _PASSED and name in ratios]
        if test not in _PASSED and passed:
            r_ok, test_ok = max(passed)
            line += f"; among passed tests {r_ok:.3e} ({test_ok})"
        terminalreporter.write_line(line)
