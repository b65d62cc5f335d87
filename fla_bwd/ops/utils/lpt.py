# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Static schedules for persistent kernels: work items dealt to programs in a given order, each to the least loaded
program (longest-processing-time first when the order is longest first), and the table a kernel reads them from.
Static, so a program computes the same items on every call: results stay deterministic."""

import heapq
from typing import List, Sequence, Tuple

import torch


def deal(items: Sequence[Tuple[int, float]], programs: int) -> Tuple[Tuple[Tuple[int, ...], ...], float]:
    """(the items of each program, the busiest program's load over the mean) for (item, cost) pairs dealt in their
    order, each to the least loaded program (the lower index on a tie)."""
    heap = [(0.0, p) for p in range(programs)]
    lists: List[List[int]] = [[] for _ in range(programs)]
    for item, cost in items:
        load, p = heapq.heappop(heap)
        lists[p].append(item)
        heapq.heappush(heap, (load + cost, p))
    loads = [load for load, _ in heap]
    total = sum(loads)
    return tuple(tuple(li) for li in lists), (max(loads) * programs / total if total else 1.0)


def table(lists: Sequence[Sequence[int]], device: torch.device) -> Tuple[torch.Tensor, int]:
    """([programs, 1 + L] int32 on `device`: per program its item count then its items, L: the longest list)."""
    L = max(len(li) for li in lists)
    tab = torch.zeros(len(lists), 1 + L, dtype=torch.int32)
    for p, li in enumerate(lists):
        tab[p, 0] = len(li)
        tab[p, 1:1 + len(li)] = torch.tensor(li, dtype=torch.int32)
    return tab.to(device), L
