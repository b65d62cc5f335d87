# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Per-call measurements besides time: CUDA kernel count, peak memory, host overhead against graph replay."""

import gc
import statistics
import time
from typing import Callable, Iterable

import torch

MiB = 1024.0 * 1024.0


def tensor_bytes(tensors: Iterable) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def kernel_count(fn: Callable) -> dict:
    """CUDA kernels launched by one call of fn (memcpy/memset reported apart), through torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    except Exception as e:  # CUPTI may be missing in some containers
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    kernels, other, names = 0, 0, {}
    for evt in prof.events():
        if getattr(evt, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        name = evt.name
        if name.lower().startswith(("memcpy", "memset")):
            other += 1
            continue
        kernels += 1
        short = name.split("(")[0][:60]
        names[short] = names.get(short, 0) + 1
    return {"kernels": kernels, "memcpy_memset": other, "names": names}


def peak_memory(fn: Callable, held: Iterable) -> dict:
    """Peak memory of one call of fn with reset discipline: collect, empty the cache, reset the peak counters,
    then call. `held` lists the tensors the caller keeps alive (inputs, do, and for bwd the forward output):
    their bytes are reported and subtracted."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base_alloc = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    res = fn()
    torch.cuda.synchronize()
    peak_alloc = torch.cuda.max_memory_allocated()
    peak_reserved = torch.cuda.max_memory_reserved()
    del res
    inputs = tensor_bytes(held)
    return {
        "peak_alloc_MiB": peak_alloc / MiB,
        "peak_reserved_MiB": peak_reserved / MiB,
        "inputs_MiB": inputs / MiB,
        "allocated_before_MiB": base_alloc / MiB,
        "peak_alloc_minus_inputs_MiB": (peak_alloc - inputs) / MiB,
        "peak_alloc_over_before_MiB": (peak_alloc - base_alloc) / MiB,
    }


def host_overhead(build: Callable[[], Callable], calls: int = 20) -> dict:
    """Wall time of one call (synchronised each time) against the replay of the same call captured in a CUDA
    graph; the difference is what the host adds per call (launches, Python, autograd). `build()` returns the
    call; it is built a second time inside the capture stream, so a backward's forward lives on that stream."""
    fn = build()
    walls = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e6)
    out = {"wall_us": statistics.median(walls)}
    del fn
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn = build()
            for _ in range(3):
                fn()
        side.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        replays = []
        for _ in range(calls):
            t0 = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            replays.append((time.perf_counter() - t0) * 1e6)
        out["graph_replay_us"] = statistics.median(replays)
        out["host_overhead_us"] = out["wall_us"] - out["graph_replay_us"]
        del graph
    except Exception as e:
        msg = str(e).splitlines()[0][:160] if str(e) else ""
        out["graph_error"] = f"{type(e).__name__}: {msg}"
        torch.cuda.synchronize()
    return out
