# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Packed variable-length sequences: the offsets of `cu_seqlens`, read and validated on every call, and the
(sequence, tile) work lists of the kernels.

The kernels read `cu_seqlens` itself and a tile list built from its values on the host, so the host copy must be
the tensor's values at the call: they are read on every call (for a tensor on the GPU, one device-to-host copy of
N + 1 integers, which waits for the work queued before it; the backward reuses its forward's copy). A cache keyed
on the tensor object instead (its identity and version counter) returned stale offsets after an edit that does
not bump the version (through `.numpy()`, `.data` or DLPack; issue 19). What is cached is keyed on the values.

Under CUDA-graph capture nothing can be read from the GPU: a capture uses the offsets this tensor had at its last
call outside the capture (the warm-up calls that torch's graph recipe makes), and the captured graph keeps that
tiling, as a graph keeps every host-side decision; without such a call it raises.
"""

import collections
import functools
from typing import Callable, Dict, Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from fla_bwd.utils import cdiv


class VarlenTiles:
    """The validated offsets of one `cu_seqlens` value, with the tile lists and quantities derived from them."""

    def __init__(self, offsets: Tuple[int, ...], device: torch.device):
        self.offsets = offsets
        self.lengths = tuple(b - a for a, b in zip(offsets, offsets[1:]))
        # L > 0 where every sequence has length L, else 0: such a batch is the dense [N, L] (`call.make_call`).
        self.one_length = self.lengths[0] if self.lengths and len(set(self.lengths)) == 1 else 0
        self.device = device
        self._chunks: Dict[int, torch.Tensor] = {}
        self._bands: Dict[tuple, list] = {}
        # What a launch plan depends on (`host.call_of`): the sequence count and the tile count at every tile size
        # the configs use; not the offsets themselves, so a new batch of the same tile counts reuses its plan.
        self.key = (len(self.lengths),) + tuple(self.num_tiles(BT) for BT in (16, 32, 64, 128))

    def num_tiles(self, BT: int) -> int:
        return sum(cdiv(n, BT) for n in self.lengths)

    def chunk_indices(self, BT: int) -> torch.Tensor:
        """`[NT, 2]` int32 on the device: for every tile of BT tokens of every sequence, (sequence index, tile index
        inside the sequence). Zero-length sequences have no tile."""
        if BT not in self._chunks:
            rows = [(i_n, i_t) for i_n, n in enumerate(self.lengths) for i_t in range(cdiv(n, BT))]
            self._chunks[BT] = torch.tensor(rows, dtype=torch.int32).reshape(-1, 2).to(self.device)
        return self._chunks[BT]


    def memo(self, key: tuple, make: Callable[[], object]):
        """`make()`, made once for these offsets and cached by `key` (which must name everything `make` depends on
        besides the offsets): e.g. the Hopper dK/dV kernel's schedule (`gluon_dkv.packed_schedule`)."""
        if key not in self._bands:
            self._bands[key] = make()
        return self._bands[key]

    def band_offsets(self, key: tuple, tiles_of: Callable[[int], int], on_device: bool = True):
        """(total, `[N + 1]` int64 on the device, or None unless `on_device`): the prefix sums over the sequences of
        `tiles_of(length)`, the tiles a sequence's band holds (the five-product backward's dS bands,
        `from_ds.ds_layout`); cached by `key`, which must name everything `tiles_of` depends on."""
        entry = self._bands.get(key)
        if entry is None:
            sums = [0]
            for n in self.lengths:
                sums.append(sums[-1] + tiles_of(n))
            entry = self._bands[key] = [sums, None]
        if on_device and entry[1] is None:
            entry[1] = torch.tensor(entry[0], dtype=torch.int64).to(self.device)
        return entry[0][-1], entry[1]


class TailTiles(VarlenTiles):
    """Packed tail queries: the tiles of the keys' offsets (this object's own, as `VarlenTiles`), with `queries`, the
    tiles of q's offsets (sequence i_n's queries are the last ones of its keys, `autograd.frame_packed`)."""

    def __init__(self, keys: VarlenTiles, queries: VarlenTiles):
        super().__init__(keys.offsets, keys.device)
        self.queries = queries
        self.key = ("tail", self.key, queries.key)


_TAILS: "collections.OrderedDict[tuple, TailTiles]" = collections.OrderedDict()


def tail_tiles(keys: VarlenTiles, queries: VarlenTiles) -> TailTiles:
    """The `TailTiles` of these two offsets, built once while they keep coming (their tile lists stay on the
    device)."""
    key = (keys.offsets, queries.offsets, keys.device)
    tiles = _TAILS.get(key)
    if tiles is None:
        tiles = _TAILS[key] = TailTiles(keys, queries)
        while len(_TAILS) > _CACHE_SIZE:
            _TAILS.popitem(last=False)
    return tiles


# Offsets seen last, by value (a training step calls forward and backward, every layer, with one cu_seqlens), and
# per tensor object the entry of its last call outside a capture (for calls under capture only).
_BY_VALUE: "collections.OrderedDict[tuple, VarlenTiles]" = collections.OrderedDict()
_LAST_CALL: list = []
_CACHE_SIZE = 8


def check_offsets(offsets: Tuple[int, ...], T: int, name: str = "cu_seqlens") -> None:
    if offsets[0] != 0:
        raise ValueError(f"{name} must start at 0, got {offsets[0]}")
    if any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"{name} must be non-decreasing")
    if offsets[-1] != T:
        raise ValueError(f"{name} must end at the packed length T = {T}, got {offsets[-1]}")


_OWN = WeakIdKeyDictionary()  # by identity: the tensors are the package's own, see `own_offsets`


def own_offsets(cu_seqlens: torch.Tensor, offsets: list) -> torch.Tensor:
    """Register `cu_seqlens`, an offsets tensor the package made from `offsets` and never hands out or changes
    (`autograd.frame_packed`'s): `varlen_tiles` then knows its tiles without reading it back. Returns it."""
    _OWN[cu_seqlens] = VarlenTiles(tuple(offsets), cu_seqlens.device)
    return cu_seqlens


def varlen_tiles(cu_seqlens: torch.Tensor, T: int, name: str = "cu_seqlens") -> VarlenTiles:
    """The tiles of `cu_seqlens`' current values, after checking them (ValueError, naming the argument `name`)
    against the packed length T."""
    own = _OWN.get(cu_seqlens)
    if own is not None:  # the package's own offsets (`own_offsets`): known, not read (a device-to-host copy)
        return own
    if cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return _under_capture(cu_seqlens)
    key = (tuple(cu_seqlens.tolist()), cu_seqlens.device)
    tiles = _BY_VALUE.get(key)
    if tiles is None:
        check_offsets(key[0], T, name)
        tiles = _BY_VALUE[key] = VarlenTiles(*key)
        while len(_BY_VALUE) > _CACHE_SIZE:
            _BY_VALUE.popitem(last=False)
    elif tiles.offsets[-1] != T:
        check_offsets(key[0], T, name)
    if cu_seqlens.is_cuda:
        _remember(cu_seqlens, tiles)
    return tiles


def _remember(cu_seqlens: torch.Tensor, tiles: VarlenTiles) -> None:
    for i, (x, _, _) in enumerate(_LAST_CALL):
        if x is cu_seqlens:
            del _LAST_CALL[i]
            break
    _LAST_CALL.insert(0, (cu_seqlens, cu_seqlens._version, tiles))  # holds the tensor: its id cannot be reused
    del _LAST_CALL[_CACHE_SIZE:]


def _under_capture(cu_seqlens: torch.Tensor) -> VarlenTiles:
    for x, version, tiles in _LAST_CALL:
        if x is cu_seqlens and version == cu_seqlens._version:
            return tiles
    raise ValueError(
        "cu_seqlens on the GPU cannot be read during CUDA-graph capture, and this tensor (or its current version) "
        "was not passed to parallel_attn outside the capture first: call it once with this cu_seqlens before "
        "capturing (the warm-up that a graph capture needs anyway); the graph keeps the tiling of those values")


@functools.lru_cache(maxsize=64)
def dense_lengths(B: int, T: int) -> Tuple[int, ...]:
    return (T,) * B


def sequence_lengths(B: int, T: int, tiles: Optional[VarlenTiles]) -> Tuple[int, ...]:
    return dense_lengths(B, T) if tiles is None else tiles.lengths
