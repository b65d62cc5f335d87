# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Every `FLA_BWD_*` environment variable the package reads, and the in-process overrides that go with them.

| variable | values | read |
| --- | --- | --- |
| FLA_BWD_DKV_PATH | `DKV_PATHS` | at each backward (`forced_dkv_path`); `dkv_path(...)` overrides it for a block |
| FLA_BWD_CONTAINMENT | `CONTAINMENTS` | at each kernel launch (`forced_containment`) |
| FLA_BWD_FAST_LAUNCH | 0 or 1 | once, at import (`fast_launch`); `set_fast_launch(...)` changes it |

The first two are read per call so that tests and A/B runs can set them between calls. Values are the strings
users type; the code that acts on them turns them into data at once (`parallel.DkvKernel`, `host.Containment`).
"""

import contextlib
import os
from typing import Optional

# "legacy" is the old name of "per-query-head", still accepted.
DKV_PATHS = ("auto", "gqa", "gqa-split2", "gqa-split4", "per-query-head", "legacy")
CONTAINMENTS = ("auto", "inline", "two-launch")

_dkv_override: Optional[str] = None
_fast_launch = os.environ.get("FLA_BWD_FAST_LAUNCH", "1") != "0"


@contextlib.contextmanager
def dkv_path(name: str):
    """Force the dK/dV kernel inside a `with` block: one of `DKV_PATHS` ("auto" is the dispatch). Overrides the
    environment variable FLA_BWD_DKV_PATH, which sets the same for a whole process. Read at backward time."""
    global _dkv_override
    if name not in DKV_PATHS:
        raise ValueError(f"dkv_path must be one of {DKV_PATHS}, got {name!r}")
    previous, _dkv_override = _dkv_override, name
    try:
        yield
    finally:
        _dkv_override = previous


def forced_dkv_path() -> str:
    """The dK/dV path forced by `dkv_path(...)` or FLA_BWD_DKV_PATH, "auto" if none."""
    forced = _dkv_override or os.environ.get("FLA_BWD_DKV_PATH", "auto")
    if forced not in DKV_PATHS:
        raise ValueError(f"FLA_BWD_DKV_PATH must be one of {DKV_PATHS}, got {forced!r}")
    return forced


def forced_containment() -> str:
    """The containment forced by FLA_BWD_CONTAINMENT, "auto" if none."""
    forced = os.environ.get("FLA_BWD_CONTAINMENT", "auto")
    if forced not in CONTAINMENTS:
        raise ValueError(f"FLA_BWD_CONTAINMENT must be one of {CONTAINMENTS}, got {forced!r}")
    return forced


def fast_launch() -> bool:
    """Whether kernels launch through the cached compiled kernel (`fla_bwd.ops.utils.launch.Launch`)."""
    return _fast_launch


def set_fast_launch(enabled: bool) -> None:
    global _fast_launch
    _fast_launch = bool(enabled)
