# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""A plan step that launches a Gluon kernel taking TMA descriptors (`gluon_fwd`, `gluon_dkv`), at the cost of a
plain launch after the first call.

Gluon's `kernel[grid]` binding took 519 us of host time a launch on the H200's host; the step goes through the
package's `launch.Launch` (its direct C-launcher path after the first call). The TMA descriptors are made once a call
for every launch of the call that shares them (steps with the same prefix: each chunk's dK/dV launch reads the same
q, k, v, dO, lse, delta, dS): validated on the first call, then the first call's fields over each later call's
tensors (`triton_private.rebased_descriptor`). Where Triton's launcher is 3.6's (`launch.descriptor_launcher`),
later calls skip both: each descriptor's expansion for the C launcher (its `cuTensorMapEncodeTiled`) is kept by the
input's address, which is all that differs between calls of a plan, and made again only for an address not seen
before."""

from typing import Optional

import torch

from fla_bwd.ops.utils.launch import Launch, Ref, bind, descriptor_launcher, jit_function
from fla_bwd.ops.utils.triton_private import launch_head, rebased_descriptor

_SEEN_ADDRESSES = 64  # a training loop's allocator hands a plan's buffers a few addresses in turn


class DescriptorLaunch:
    """Plan step (`launch.Plan.add`): one launch of Gluon `kernel` over `grid` with `args`, in which each
    `Ref(prefix + name)` is the TMA descriptor of a view of the call's tensor: `table` holds (name, the env name of
    its tensor, the view's shape, block, shared-memory layout) for each."""

    def __init__(self, kernel, grid: tuple, args: dict, table: tuple, prefix: str):
        self.views = tuple((prefix + name, tensor, view, block, layout) for name, tensor, view, block, layout in table)
        self.first = self.views[0][0]  # made with the others: a step of the call has made them all already
        self.launch = Launch(kernel, grid, dict(args, **{f"{name}_desc": Ref(prefix + name) for name, *_ in table}))
        self.uses = self.launch.uses | {name for _, name, *_ in self.views}  # `launch.Plan.allocate_late`
        self.templates = None  # the first call's descriptors without their tensors (`_descriptors`)
        self.memo = None  # after the first launch: `_memoized`'s tuple, or False where Triton does not allow it

    def _descriptors(self, env: dict) -> None:
        if self.templates is None:  # first call: Gluon's validating constructor (TMA alignment, strides, block)
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

            made = [(desc, name, TensorDescriptor.from_tensor(env[name].view(view), block, layout))
                    for desc, name, view, block, layout in self.views]
            # The templates hold no tensor.
            self.templates = tuple((desc, name, rebased_descriptor(d, None)) for desc, name, d in made)
            env.update((desc, d) for desc, _, d in made)
            return
        for desc, name, template in self.templates:  # the plan's key fixes all but the base
            env[desc] = rebased_descriptor(template, env[name])

    def __call__(self, env: dict, device: torch.device, stream: Optional[int]) -> None:
        memo = self.memo
        if memo and stream is not None:
            self._launch_memoized(memo, env, stream)
            return
        if self.first not in env:
            self._descriptors(env)
        self.launch(env, device, stream)
        if memo is None and self.launch.direct is not None:
            self.memo = self._memoized(env) or False

    def _memoized(self, env: dict) -> Optional[tuple]:
        """(C launcher, descriptor expansion, grid, the launcher's arguments between stream and parameters, the
        parameters' template, tensor slots, other slots, and per descriptor its position, input name, template,
        metadata and expansions by address), or None where `descriptor_launcher` finds no 3.6 launcher. `env`: the
        call just launched, whose descriptors are the templates (this step's own, or those an earlier chunk's step
        of the call made: then this step made none, `__call__`)."""
        run, function, packed, template, pointers, others = self.launch.direct
        found = descriptor_launcher(run)
        if found is None:
            return None
        names = jit_function(self.launch.kernel).arg_names
        inputs = {desc: (name, rebased_descriptor(env[desc], None)) for desc, name, *_ in self.views}
        descs = []
        for meta, i in zip(found.metas, sorted(found.positions)):
            ref = self.launch.args.get(names[i])
            if not isinstance(ref, Ref) or ref.name not in inputs:
                return None
            descs.append((i, *inputs[ref.name], meta, {}))
        others = tuple((i, name) for i, name in others if i not in found.positions)
        head = launch_head(found, function, packed)
        return found.launch, found.expand, self.launch.grid, head, template, pointers, others, tuple(descs)

    def _launch_memoized(self, memo: tuple, env: dict, stream: int) -> None:
        """One launch as Triton 3.6's wrapper makes it (`descriptor_launcher`), each descriptor's expansion looked
        up by its input's address (kept for the last `_SEEN_ADDRESSES` addresses a descriptor)."""
        launch, expand, grid, head, template, pointers, others, descs = memo
        values = bind(template, pointers, others, env)
        args = [*grid, stream, *head]
        start = 0
        for i, name, template_desc, meta, seen in descs:
            args += values[start:i]
            start = i + 1
            x = env[name]
            address = x.data_ptr()
            expanded = seen.get(address)
            if expanded is None:
                if len(seen) >= _SEEN_ADDRESSES:
                    seen.clear()
                expanded = seen[address] = expand(rebased_descriptor(template_desc, x), meta)
            args += expanded
        args += values[start:]
        launch(*args)

