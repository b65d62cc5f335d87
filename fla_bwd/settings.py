# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Every `FLA_BWD_*` environment variable the package reads, and the in-process overrides that go with them.

| variable | values | read |
| --- | --- | --- |
| FLA_BWD_DKV_PATH | `DKV_PATHS` | at each backward (`forced_dkv_path`); `dkv_path(...)` overrides it for a block |
| FLA_BWD_CONTAINMENT | `CONTAINMENTS` | at each kernel launch (`forced_containment`) |
| FLA_BWD_FAST_LAUNCH | 0 or 1 | once, at import (`fast_launch`); `set_fast_launch(...)` changes it |
| FLA_BWD_DQ_PATH | `DQ_PATHS` | at each backward (`forced_dq_path`); `dq_path(...)` overrides it for a block |
| FLA_BWD_DS_BUDGET_MIB | a number >= 0 | at each backward (`ds_budget_bytes`): the five-product backward's scratch |
| FLA_BWD_DS_KERNEL | `DS_KERNELS` | at each backward (`forced_ds_kernel`); `ds_kernel(...)` overrides it for a block |
| FLA_BWD_FWD_KERNEL | `FWD_KERNELS` | at each forward (`forced_fwd_kernel`); `fwd_kernel(...)` overrides it: a block |

The per-backward ones are read per call so that tests and A/B runs can set them between calls. Values are the strings
users type; the code that acts on them turns them into data at once (`dispatch.Knobs`, `dispatch.Route`).
"""

import contextlib
import os
from typing import Optional

# "legacy" is the old name of "per-query-head", still accepted.
DKV_PATHS = ("auto", "gqa", "gqa-split2", "gqa-split4", "per-query-head", "legacy")
CONTAINMENTS = ("auto", "inline", "two-launch")
# How dq is computed: "recompute" (the seven-product backward: the dQ kernel recomputes S and dP), "from-ds" (the
# five-product backward: from the dS tiles the dK/dV kernel stores, `fla_bwd.ops.attn.from_ds`).
DQ_PATHS = ("auto", "recompute", "from-ds")
# The five-product backward's dS scratch: at most this many MiB per backward (chunks of query heads beyond it; the
# seven-product backward when one head of every KV head does not fit). README, "Memory".
DEFAULT_DS_BUDGET_MIB = 1024
# The five-product backward's dK/dV + dS kernel: "triton" (`kernels.parallel_attn_bwd_kernel_dkv_per_kv_head`) or
# "hopper" (the warp-specialized Gluon kernel for sm_90, `fla_bwd.ops.attn.gluon_dkv`); "auto": hopper where it runs.
DS_KERNELS = ("auto", "triton", "hopper")
# The forward's kernel: "triton" (`kernels.parallel_attn_fwd_kernel`) or "hopper" (the warp-specialized Gluon kernel
# for sm_90, `fla_bwd.ops.attn.gluon_fwd`); "auto": hopper where it runs.
FWD_KERNELS = ("auto", "triton", "hopper")

_fast_launch = os.environ.get("FLA_BWD_FAST_LAUNCH", "1") != "0"


def _getenv(name: str, default: Optional[str] = None) -> Optional[str]:
    """`os.environ.get(name, default)` without its KeyError path for an absent name (0.73 us against 0.21 a read on
    the CPU machine; a backward reads five): a lookup in os.environ's own mapping, which every change through
    os.environ (monkeypatch.setenv, `del`, `update`) updates. A stand-in os.environ (a plain dict) through its own
    `get`."""
    environ = os.environ
    if type(environ) is not _ENVIRON_TYPE:
        return environ.get(name, default)
    key = _ENV_KEYS.get(name)
    if key is None:
        key = _ENV_KEYS[name] = environ.encodekey(name)
    raw = environ._data.get(key)
    return default if raw is None else environ.decodevalue(raw)


_ENVIRON_TYPE = type(os.environ)
_ENV_KEYS: dict = {}  # name -> os.environ's key for it


class _PathSetting:
    """A path chosen per backward: the environment variable `variable`, overridden inside `with` blocks
    (`block`); "auto" when neither says."""

    def __init__(self, function: str, variable: str, allowed: tuple):
        self.function, self.variable, self.allowed = function, variable, allowed
        self.override: Optional[str] = None

    @contextlib.contextmanager
    def block(self, name: str):
        if name not in self.allowed:
            raise ValueError(f"{self.function} must be one of {self.allowed}, got {name!r}")
        previous, self.override = self.override, name
        try:
            yield
        finally:
            self.override = previous

    def read(self) -> str:
        forced = self.override or _getenv(self.variable, "auto")
        if forced not in self.allowed:
            raise ValueError(f"{self.variable} must be one of {self.allowed}, got {forced!r}")
        return forced


_DKV = _PathSetting("dkv_path", "FLA_BWD_DKV_PATH", DKV_PATHS)
_DQ = _PathSetting("dq_path", "FLA_BWD_DQ_PATH", DQ_PATHS)
_DS_KERNEL = _PathSetting("ds_kernel", "FLA_BWD_DS_KERNEL", DS_KERNELS)
_FWD_KERNEL = _PathSetting("fwd_kernel", "FLA_BWD_FWD_KERNEL", FWD_KERNELS)


def dkv_path(name: str):
    """Force the dK/dV kernel inside a `with` block: one of `DKV_PATHS` ("auto" is the dispatch). Overrides the
    environment variable FLA_BWD_DKV_PATH, which sets the same for a whole process. Read at backward time."""
    return _DKV.block(name)


def forced_dkv_path() -> str:
    """The dK/dV path forced by `dkv_path(...)` or FLA_BWD_DKV_PATH, "auto" if none."""
    return _DKV.read()


def dq_path(name: str):
    """Force how dq is computed inside a `with` block: one of `DQ_PATHS` ("auto" is the dispatch, see
    `fla_bwd.ops.attn.dispatch.route`). Overrides FLA_BWD_DQ_PATH. Read at backward time."""
    return _DQ.block(name)


def forced_dq_path() -> str:
    """The dq path forced by `dq_path(...)` or FLA_BWD_DQ_PATH, "auto" if none."""
    return _DQ.read()


def ds_kernel(name: str):
    """Force the five-product backward's dK/dV kernel inside a `with` block: one of `DS_KERNELS` ("auto": the
    Hopper kernel wherever it can run, see `fla_bwd.ops.attn.dispatch.hopper_why_not`). Overrides FLA_BWD_DS_KERNEL. A
    forced "hopper" that cannot run a five-product backward raises ValueError. Read at backward time."""
    return _DS_KERNEL.block(name)


def forced_ds_kernel() -> str:
    """The five-product dK/dV kernel forced by `ds_kernel(...)` or FLA_BWD_DS_KERNEL, "auto" if none."""
    return _DS_KERNEL.read()


def fwd_kernel(name: str):
    """Force the forward's kernel inside a `with` block: one of `FWD_KERNELS` ("auto": the Hopper kernel wherever it
    can run, see `fla_bwd.ops.attn.dispatch.hopper_fwd_why_not`). Overrides FLA_BWD_FWD_KERNEL. A forced "hopper"
    that cannot run a forward raises ValueError. Read at forward time."""
    return _FWD_KERNEL.block(name)


def forced_fwd_kernel() -> str:
    """The forward's kernel forced by `fwd_kernel(...)` or FLA_BWD_FWD_KERNEL, "auto" if none."""
    return _FWD_KERNEL.read()


def ds_budget_bytes() -> int:
    """The five-product backward's dS scratch budget in bytes: FLA_BWD_DS_BUDGET_MIB (default
    `DEFAULT_DS_BUDGET_MIB`) MiB."""
    text = _getenv("FLA_BWD_DS_BUDGET_MIB")
    if text is None:
        return DEFAULT_DS_BUDGET_MIB << 20
    try:
        mib = float(text)
    except ValueError:
        mib = -1.0
    if not 0 <= mib < float("inf"):
        raise ValueError(f"FLA_BWD_DS_BUDGET_MIB must be a number of MiB >= 0 and finite, got {text!r}")
    return int(mib * 2**20)


def forced_containment() -> str:
    """The containment forced by FLA_BWD_CONTAINMENT, "auto" if none."""
    forced = _getenv("FLA_BWD_CONTAINMENT", "auto")
    if forced not in CONTAINMENTS:
        raise ValueError(f"FLA_BWD_CONTAINMENT must be one of {CONTAINMENTS}, got {forced!r}")
    return forced


def fast_launch() -> bool:
    """Whether kernels launch through the cached compiled kernel (`fla_bwd.ops.utils.launch.Launch`)."""
    return _fast_launch


def set_fast_launch(enabled: bool) -> None:
    global _fast_launch
    _fast_launch = bool(enabled)
