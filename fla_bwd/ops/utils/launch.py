# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Launch plans: the host work of one call, decided once per kind of call and replayed at the cost of its launches.

`kernel[grid](**kwargs)` re-derives a kernel's specialisation from all its arguments on every call (the heuristics
wrapper rebuilds a dict of every argument once per flag, the binder specialises each argument, the cache key is a
tuple of all of them plus `str(options)`): on the GPU machine's host more time than a short row's backward takes on
the GPU. The rest of a call's host code (tile configs, containment, dispatch, buffers) is a pure
function of the call's shapes, dtypes and flags, and was redone on every call too (issue 19).

A `Plan` is that work done once: an ordered list of steps (allocate a buffer, launch a kernel, apply a small torch
function), in which the call's tensors appear as `Ref(name)`s. The caller keys plans on everything the steps were
built from and on everything Triton specialises a kernel on that a `Ref` can vary in: dtype (fixed by the key),
None-ness (fixed by the key), and 16-byte alignment of the tensors it does not allocate itself (`aligned`; torch's
allocators align what a plan allocates). A `Launch` compiles through Triton's normal path the first time, then
calls the compiled kernel's C launcher directly (`run`, on the current stream, with every parameter in signature
order, tensors as their addresses), skipping the runner's per-call launch-metadata dict, which only launch hooks
read. With a launch hook installed (a profiler), under the CPU interpreter, or with
FLA_BWD_FAST_LAUNCH=0 (`fla_bwd.settings.set_fast_launch(False)`), every launch takes Triton's normal path instead;
so does every launch on a Triton whose internals are not those the direct path was written for: every reading of
them is in `fla_bwd.ops.utils.triton_private`, each behind a check, and this module uses only what it returns.
"""

import contextlib
import warnings
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import torch

from fla_bwd import settings
from fla_bwd.ops.utils import triton_private
from fla_bwd.ops.utils.triton_private import (  # noqa: F401 - re-exported: gluon_dkv and tests import them from here
    DescriptorLauncher,
    descriptor_launcher,
    interpreter_bf16_fix,
    interpreter_index_fix,
    jit_function,
    knobs,
)
from fla_bwd.utils import is_interpreter


class Ref(NamedTuple):
    """A tensor of the call, by name: bound when the plan runs."""
    name: str


def aligned(x: Optional[torch.Tensor]) -> bool:
    """What Triton specialises a pointer on besides its dtype: 16-byte alignment (None counts as aligned)."""
    return x is None or x.data_ptr() % 16 == 0


@contextlib.contextmanager
def _interpreted():
    """Around this package's interpreted launches only: the interpreter's bf16 and index fixes (`fla_bwd.utils`), and
    numpy's floating-point warnings off. Lanes past a sequence's end compute 0 / 0 and log2(0) as they do on the
    GPU, silently there; no such lane is ever stored (every store is masked), and the tests compare every stored
    element. The interpreter's max/min reductions are numpy's nanmax/nanmin, which warn on a row that is all NaN:
    a NaN input does that by design (containment, tests/ops/test_attn_nan.py), silently on the GPU too."""
    import numpy as np

    with interpreter_bf16_fix(), interpreter_index_fix(), np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="All-NaN (slice|axis) encountered", category=RuntimeWarning)
        yield


class Empty(NamedTuple):
    """Step: `env[name] = torch.empty(shape, dtype)` on the plan's device."""
    name: str
    shape: Tuple[int, ...]
    dtype: torch.dtype
    uses = ()  # the env names a step reads (`Plan.allocate_late`)

    def __call__(self, env: dict, device: torch.device, stream: Optional[int]) -> None:
        env[self.name] = torch.empty(self.shape, dtype=self.dtype, device=device)


class Apply(NamedTuple):
    """Step: `env[name] = fn(*(env[r] for r in refs))`, for the few torch ops of a call (casts, a small sum)."""
    name: str
    fn: Callable
    refs: Tuple[str, ...]

    @property
    def uses(self) -> Tuple[str, ...]:
        return self.refs

    def __call__(self, env: dict, device: torch.device, stream: Optional[int]) -> None:
        env[self.name] = self.fn(*[env[r] for r in self.refs])


class Launch:
    """Step: one launch of `kernel` over `grid` with `args` (every parameter by keyword; `Ref`s bound at run
    time). Parameters the heuristics wrapper computes are left out: they are constexprs, which the C launcher
    skips."""

    def __init__(self, kernel, grid: Sequence[int], args: Dict[str, Any]):
        self.kernel = kernel
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.args = args
        self.refs = tuple((k, v.name) for k, v in args.items() if isinstance(v, Ref))
        self.uses = frozenset(name for _, name in self.refs)
        # (run, function, packed metadata, values template, (index, name) tensor slots, (index, name) other slots)
        self.direct = None
        self.probed = False  # whether `triton_private.direct_launcher` was asked (once: its answer cannot change)

    def kwargs(self, env: dict) -> dict:
        kwargs = dict(self.args)
        for key, name in self.refs:
            kwargs[key] = env[name]
        return kwargs

    def __call__(self, env: dict, device: torch.device, stream: Optional[int]) -> None:
        direct = self.direct
        if direct is not None and stream is not None:
            run, function, packed, template, pointers, others = direct
            run(*self.grid, stream, function, packed, None, None, None, *bind(template, pointers, others, env))
            return
        if is_interpreter():
            with _interpreted():
                self.kernel[self.grid](**self.kwargs(env))
            return
        kwargs = self.kwargs(env)
        compiled = self.kernel[self.grid](**kwargs)
        if self.probed:
            return
        self.probed = True
        found = triton_private.direct_launcher(self.kernel, compiled)
        if found is not None:
            names = found.names
            template = [self.args.get(n) for n in names]
            slots = [(i, self.args[n].name) for i, n in enumerate(names) if isinstance(self.args.get(n), Ref)]
            for i, _ in slots:
                template[i] = None
            # The plan's own tensors (e.g. a schedule) by address too: `self.args` keeps them alive.
            template = [x.data_ptr() if isinstance(x, torch.Tensor) else x for x in template]
            # A slot bound to a tensor now is one on every call of this plan (its key fixes which inputs are None).
            pointers = tuple((i, name) for i, name in slots if isinstance(kwargs[names[i]], torch.Tensor))
            others = tuple(slot for slot in slots if slot not in pointers)
            self.direct = (found.run, found.function, found.packed, template, pointers, others)


def bind(template: list, pointers: tuple, others: tuple, env: dict) -> list:
    """One call's parameter values for a compiled kernel's C launcher: `template` (every parameter in signature
    order) with each `(index, name)` of `pointers` set to the address of `env[name]` (the C launcher then skips a
    data_ptr() call and a driver query) and each of `others` to `env[name]`."""
    values = template.copy()
    for i, name in pointers:
        values[i] = env[name].data_ptr()
    for i, name in others:
        values[i] = env[name]
    return values


def _torch_scratch(size: int, alignment: int, stream: Optional[int]) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")  # the caching allocator aligns to 512 bytes


class ScratchLaunch(Launch):
    """A `Launch` of a kernel that makes device-side tensor descriptors: Triton asks its allocator for their
    global scratch at every launch, so torch's caching allocator is set around the launch (in the launching thread:
    autograd runs a backward in its own) and the previous one restored, leaving a user's allocator as it was
    (`triton_private.call_with_allocator`)."""

    def __call__(self, env: dict, device: torch.device, stream: Optional[int]) -> None:
        triton_private.call_with_allocator(_torch_scratch, super().__call__, env, device, stream)


class Plan:
    """An ordered list of steps built once for a kind of call (see the module docstring); `run` binds the call's
    tensors and executes them."""

    def __init__(self, device: torch.device):
        self.device = device
        self.steps: list = []

    def empty(self, name: Optional[str], shape: Sequence[int], dtype: torch.dtype) -> Ref:
        """A buffer of the call, named `name` (None: a name of its own, for scratch nobody reads back)."""
        name = f"_{len(self.steps)}" if name is None else name
        self.steps.append(Empty(name, tuple(shape), dtype))
        return Ref(name)

    def apply(self, name: str, fn: Callable, *refs: Ref) -> Ref:
        self.steps.append(Apply(name, fn, tuple(r.name for r in refs)))
        return Ref(name)

    def add(self, step: Callable[[dict, torch.device, Optional[int]], None]) -> None:
        """Add a step of another kind: called as `step(env, device, stream)` (e.g. `gluon_dkv.HopperDkvLaunch`);
        its `uses`, if it has one, names every env entry it reads (else it counts as reading them all)."""
        self.steps.append(step)

    def launch(self, kernel, grid: Sequence[int], scratch: bool = False, **args) -> None:
        """Add a launch; `scratch`: the kernel makes tensor descriptors (`ScratchLaunch`)."""
        self.steps.append((ScratchLaunch if scratch else Launch)(kernel, grid, args))

    def allocate_late(self) -> None:
        """Move each allocation to just before the first step that reads it (its `uses`), keeping their order: the
        GPU waits for a call's first launches, so a launch is not held back by buffers only later ones need. A step
        without `uses` keeps every allocation before it; one that no step reads goes last."""
        steps, pending = [], []
        for step in self.steps:
            if isinstance(step, Empty):
                pending.append(step)
                continue
            uses = getattr(step, "uses", None)
            if uses is None:
                steps += pending + [step]
                pending = []
                continue
            steps += [e for e in pending if e.name in uses] + [step]
            pending = [e for e in pending if e.name not in uses]
        self.steps = steps + pending

    def run(self, env: dict) -> dict:
        """Execute the steps with `env` (name -> tensor) holding the call's inputs; returns env, now also holding
        every buffer the plan made."""
        device = self.device
        stream = _direct_stream(device)
        for step in self.steps:
            step(env, device, stream)
        return env


_hooks_empty = triton_private.launch_hooks_empty


def _direct_stream(device: torch.device) -> Optional[int]:
    """The current raw stream of `device` when launches may go to the compiled kernels directly, else None."""
    if device.type == "cuda" and settings.fast_launch() and not is_interpreter() and _hooks_empty():
        return torch._C._cuda_getCurrentRawStream(device.index)
    return None


def run_once(build: Callable[[Plan], None], device: torch.device, env: dict) -> dict:
    """Build a plan with `build` and run it once (for helpers called outside a cached plan, e.g. by tests)."""
    plan = Plan(device)
    build(plan)
    return plan.run(env)
