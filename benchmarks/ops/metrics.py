# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Per-call measurements besides time: CUDA kernel count, peak memory, host overhead against whole-step CUDA-graph
replay."""

import gc
import statistics
import time
from typing import Callable, Iterable, Optional

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


# The graph figure each mode's wall time is compared with (see `host_overhead`).
GRAPH_KEY = {"fwd": "graph_fwd_us", "bwd": "graph_bwd_us", "fwdbwd": "graph_step_us"}


def capture_error(e: BaseException, limit: int = 160) -> str:
    """One line for a failed capture, the root cause first. `torch.cuda.graph`'s exit runs `capture_end` while the
    body's exception is handled; its own error ("operation failed due to a previous error during capture") then
    hides the body's, which Python keeps as `__context__`."""
    chain = []
    while e is not None and len(chain) < 4:
        msg = str(e).strip().splitlines()
        chain.append(f"{type(e).__name__}: {msg[0][:limit] if msg else ''}".rstrip(": "))
        e = e.__context__
    return chain[-1] + (f" (then {chain[0]})" if len(chain) > 1 else "")


def capture(fn: Callable, stream) -> "torch.cuda.CUDAGraph":
    """fn captured in one CUDA graph on `stream` (the caller warms fn up on that stream first, as torch's docs say).
    The current stream is restored also when the capture fails: `torch.cuda.graph`'s exit skips that when
    `capture_end` raises, and a capture stream left current makes every later capture look like it works."""
    graph = torch.cuda.CUDAGraph()
    prev = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, stream=stream):
            fn()
    finally:
        torch.cuda.set_stream(prev)
    return graph


def _replay_us(graphs: dict, calls: int, flush: Optional[Callable]) -> dict:
    """Median microseconds of each graph's replay (`_replay_times`)."""
    return {k: statistics.median(t) for k, t in _replay_times(graphs, calls, flush).items()}


def _replay_times(graphs: dict, calls: int, flush: Optional[Callable]) -> dict:
    """Microseconds of each of `calls` replays of each graph (CUDA events on the current stream, after `flush` when
    given), the graphs interleaved call by call so that drift hits all of them, and the order rotated by one each
    call so that no graph always follows the same one."""
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    events = {k: [] for k in graphs}
    order = list(graphs.items())
    for i in range(calls):
        for k, g in order[i % len(order):] + order[:i % len(order)]:
            if flush is not None:
                flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            events[k].append((start, end))
    torch.cuda.synchronize()
    return {k: [s.elapsed_time(e) * 1e3 for s, e in ev] for k, ev in events.items()}


def host_overhead(build: Callable[[str], Callable], mode: str, calls: int = 20, flush: Optional[Callable] = None,
                  release: Optional[Callable] = None, graphs: Optional[dict] = None) -> dict:
    """What the host adds to one call of `mode`, against kernel time from CUDA-graph replays (issue 19's method).

    `build(m)` returns the zero-argument call of mode m (`Candidate.build`). `wall_us`: median over `calls` of the
    synchronised wall time of one call of `mode` (from an idle queue, after `flush` when given). Kernel time: a
    whole step, forward then `torch.autograd.grad` (`build("fwdbwd")`), captured in ONE graph, as a training loop
    captures it, and the forward alone (`build("fwd")`) in another, each warmed up on the capture's side stream
    first; `graph_step_us` and `graph_fwd_us` are their replay medians (CUDA events, flushed like the runner's
    timer) and `graph_bwd_us` their difference, the backward's kernel time without host. (Capturing the backward
    alone after a forward outside the capture fails for every autograd op, SDPA's too: autograd runs a backward
    node on its forward's stream.) `host_overhead_us` = `wall_us` minus the mode's graph figure (`graph_us`,
    `GRAPH_KEY`). A failed capture is reported as `graph_error`, with the current stream restored. `release()`,
    when given, drops what `build` keeps alive (a bwd call's forward output) before the captures: an autograd graph
    of the leaves kept from an eager call ties their AccumulateGrad nodes to the default stream, and the capture then
    fails ("operation would make the legacy stream depend on a capturing blocking stream"). `graphs`, when given,
    are this call's `graph_step_us` and `graph_fwd_us` from `paired_graphs_us` (measured beside other packages'):
    nothing is captured here, and `graphs_paired` marks them."""
    fn = build(mode)
    walls = []
    for _ in range(calls):
        if flush is not None:
            flush()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e6)
    out = {"wall_us": statistics.median(walls)}
    del fn
    if release is not None:
        release()
    if graphs is not None:
        out.update(graphs, graphs_paired=True)
    else:
        try:
            out.update(_replay_us(_step_graphs(build, torch.cuda.Stream()), calls, flush))
        except Exception as e:
            out["graph_error"] = capture_error(e)
            try:
                torch.cuda.synchronize()
            except Exception as e2:  # a sticky error: later CUDA work in this process fails too, say so
                out["graph_error"] += f"; synchronize after it: {capture_error(e2)}"
            return out
    out["graph_bwd_us"] = out["graph_step_us"] - out["graph_fwd_us"]
    out["graph_us"] = out[GRAPH_KEY[mode]]
    out["host_overhead_us"] = out["wall_us"] - out["graph_us"]
    return out


def _step_graphs(build: Callable[[str], Callable], side) -> dict:
    """{"graph_step_us": the whole step (`build("fwdbwd")`) in one CUDA graph, "graph_fwd_us": the forward alone},
    each warmed up on the side stream and captured there (see `host_overhead`)."""
    graphs = {}
    for key, m in (("graph_step_us", "fwdbwd"), ("graph_fwd_us", "fwd")):
        step = build(m)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graphs[key] = capture(step, side)
        del step
    return graphs


# Replays per graph of `paired_graphs_us`: its figures decide a strict bar (no slower than 12ac0d6 by kernel time)
# where the packages differ by < 1%: 100 left same-SASS kernels 0.3-1.4% apart (H100 records of 2026-12-05/06).
PAIRED_CALLS = 300
# Consecutive blocks of those calls, each with its own backward figure: the spread of a paired ratio across them is
# printed beside its check (`summary.check_lines`), so a reader sees how far the point estimate moves within a run.
PAIRED_BLOCKS = 5


def paired_graphs_us(builds: dict, calls: int = PAIRED_CALLS, flush: Optional[Callable] = None) -> dict:
    """{name: {"graph_step_us", "graph_fwd_us", "graph_bwd_blocks_us"}} of each candidate (`builds`: name ->
    `Candidate.build`), as `host_overhead` measures them, but with every candidate's graphs captured first and all
    of them replayed interleaved call by call, so that clock and power drift between candidates does not enter
    their ratio; `graph_bwd_blocks_us`: the step's median minus the forward's within each of `PAIRED_BLOCKS`
    consecutive blocks of the calls. Raises where a capture fails (the current stream restored, `capture`)."""
    side = torch.cuda.Stream()
    times = _replay_times({(name, key): g for name, build in builds.items()
                           for key, g in _step_graphs(build, side).items()}, calls, flush)
    blocks = min(PAIRED_BLOCKS, calls)
    out = {}
    for name in builds:
        step, fwd = times[(name, "graph_step_us")], times[(name, "graph_fwd_us")]
        cut = [i * len(step) // blocks for i in range(blocks + 1)]
        out[name] = {"graph_step_us": statistics.median(step), "graph_fwd_us": statistics.median(fwd),
                     "graph_bwd_blocks_us": [statistics.median(step[a:b]) - statistics.median(fwd[a:b])
                                             for a, b in zip(cut, cut[1:])]}
    return out


def compare_to_graph(overhead: dict, mode: str, median_us: float) -> dict:
    """Adds the runner's median of `mode` (CUDA events, L2 flushed; for bwd the backward alone) next to the graph's
    kernel time for the mode, and their ratio: `<mode>_median_us`, `<mode>_over_graph` (issue 19: mha-short and
    gqa4-short backward alone within 1.2x of `graph_bwd_us`)."""
    graph = overhead.get(GRAPH_KEY[mode])
    if graph is not None and median_us is not None:
        overhead[f"{mode}_median_us"] = median_us
        overhead[f"{mode}_over_graph"] = median_us / graph if graph > 0 else None
    return overhead
