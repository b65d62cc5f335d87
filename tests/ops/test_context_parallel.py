# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`context_parallel_attn` over 2 and 4 gloo processes (CPU tensors, each under Triton's interpreter, also on a GPU
machine: gloo has no all_to_all of CUDA tensors; NCCL runs in test_attn_multigpu.py) against
single-process `parallel_attn` on the gathered sequence: o and dq bitwise (the same tiles and arithmetic), every
output and gradient within the 0.005 error-ratio rule of the fp32 oracle, for dense, gated, windowed and sink calls
in both layouts; plus the errors every rank must raise before any collective.

This file is also the worker: `python test_context_parallel.py RANK N PORT DIR` runs every case of DIR/cases.pt on
rank RANK of N and (rank 0) writes the gathered outputs to DIR/out.pt."""

import os
import socket
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
HQ, H, D = 4, 2, 32
SCALE = 0.3


# ----------------------------------------------------------------------------------------------------------------
# Worker (a separate process; imports triton only after TRITON_INTERPRET is set)
# ----------------------------------------------------------------------------------------------------------------

def _reference(case: dict):
    """(single-process parallel_attn's o and gradients, the fp32 oracle's), by name; run by rank 0's worker, under
    the interpreter like the ranks' calls."""
    from fla_bwd.ops.attn import naive_parallel_attn, parallel_attn

    names = [n for n in ("q", "k", "v", "g", "sink") if case[n] is not None]
    ours = {n: case[n].clone().requires_grad_() for n in names}
    o = parallel_attn(ours["q"], ours["k"], ours["v"], ours.get("g"), SCALE, case["W"], sink_bias=ours.get("sink"))
    got = {"o": o.detach(), **{"d" + n: gr for n, gr in zip(names, torch.autograd.grad(o, list(ours.values()),
                                                                                        case["do"]))}}
    exact = {n: (case[n].float() if n in "qkv" else case[n].clone()).requires_grad_() for n in names}
    ref = naive_parallel_attn(exact["q"], exact["k"], exact["v"], g=exact.get("g"), scale=SCALE,
                              window_size=case["W"], sink_bias=exact.get("sink"))
    oracle = {"o": ref.detach(), **{"d" + n: gr for n, gr in zip(names, torch.autograd.grad(
        ref, list(exact.values()), case["do"].float()))}}
    return got, oracle


def _worker(rank: int, N: int, port: int, folder: str) -> None:
    os.environ["TRITON_INTERPRET"] = "1"  # the cases' tensors are on the CPU
    import torch.distributed as dist

    from fla_bwd.ops.attn import context_parallel_attn, shard, unshard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=N)
    cases = torch.load(os.path.join(folder, "cases.pt"))
    results = []
    for case in cases + cases[-1:]:  # the last case twice: the backward must be bitwise the same
        layout, W = case["layout"], case["W"]
        x = {n: shard(case[n], layout) if case[n] is not None and n != "sink" else case[n]
             for n in ("q", "k", "v", "g", "do", "sink")}
        leaves = {n: t.clone().requires_grad_() for n, t in x.items() if t is not None and n != "do"}
        o = context_parallel_attn(leaves["q"], leaves["k"], leaves["v"], leaves.get("g"), SCALE, W,
                                  sink_bias=leaves.get("sink"), layout=layout)
        grads = torch.autograd.grad(o, list(leaves.values()), x["do"])
        out = {"o": unshard(o.detach(), layout)}
        for n, gr in zip(leaves, grads):
            out["d" + n] = gr if n == "sink" else unshard(gr, layout)
        results.append(out)
    again = results.pop()
    deterministic = all(torch.equal(again[n], results[-1][n]) for n in again)
    # Errors: raised on every rank, before any collective (a hang would time the test out).
    errors = []

    def expect(fn):
        try:
            fn()
        except ValueError as e:
            errors.append(str(e))
        else:
            errors.append(None)

    q = torch.randn(1, 64, HQ, D)
    k = torch.randn(1, 64, H, D)
    cu = torch.tensor([0, 64], dtype=torch.int32)
    expect(lambda: context_parallel_attn(q, k, k, cu_seqlens=cu))
    q2, k2 = (q, k) if rank else (q[:, :32], k[:, :32])  # rank 0's shard is shorter
    expect(lambda: context_parallel_attn(q2, k2, k2))
    q3, k3 = q[:, :48], k[:, :48]  # not a multiple of the tile, on every rank
    expect(lambda: context_parallel_attn(q3, k3, k3))
    expect(lambda: context_parallel_attn(q, k, k, layout="balanced" if rank else "contiguous"))
    if rank == N - 1:  # only one rank's input is bad: the others must raise too
        expect(lambda: context_parallel_attn(q, k, k.float().double()))
    else:
        expect(lambda: context_parallel_attn(q, k, k))
    expect(lambda: context_parallel_attn(q, k, k, layout="zigzag"))
    expect(lambda: context_parallel_attn(q, k, k, window_size=(8, 0)))  # parallel_attn's pairs: not here
    expect(lambda: context_parallel_attn(q[:, :32], k, k))  # parallel_attn's queries shorter than keys: not here
    if rank == 0:
        refs = {}
        for case in cases:
            if case["kind"] not in refs:
                refs[case["kind"]] = _reference(case)
        torch.save({"results": results, "errors": errors, "deterministic": deterministic, "refs": refs},
                   os.path.join(folder, "out.pt"))
    else:
        torch.save({"errors": errors}, os.path.join(folder, f"errors{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    sys.exit(0)


# ----------------------------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------------------------

import pytest  # noqa: E402
from conftest import assert_close  # noqa: E402

KINDS = {  # name -> (dtype, gate, window, sink); "sink" has all three
    "dense": (torch.float16, False, None, False),
    "gate": (torch.float32, True, None, False),
    "window": (torch.bfloat16, False, 40, False),
    "sink": (torch.bfloat16, True, 100, True),
}


def _case(T: int, kind: str, B: int = 1) -> dict:
    dtype, gate, W, sink = KINDS[kind]
    return dict(
        kind=kind, W=W,
        q=torch.randn(B, T, HQ, D).to(dtype), k=torch.randn(B, T, H, D).to(dtype),
        v=torch.randn(B, T, H, D).to(dtype), do=torch.randn(B, T, HQ, D).to(dtype),
        g=torch.nn.functional.logsigmoid(torch.randn(B, T, HQ)) if gate else None,
        sink=torch.randn(HQ) if sink else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(N: int, cases: list, folder: str, timeout: float = 600) -> dict:
    torch.save(cases, os.path.join(folder, "cases.pt"))
    port = _free_port()
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(HERE)), env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), str(r), str(N), str(port), folder],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(N)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{logs[r][-4000:]}"
    out = torch.load(os.path.join(folder, "out.pt"))
    out["rank_errors"] = [out["errors"]] + [torch.load(os.path.join(folder, f"errors{r}.pt"))["errors"]
                                            for r in range(1, N)]
    return out


# Sizes for a 2-core machine under the interpreter (the file in ~2.5 min): T = 128 at two ranks (balanced: 4 chunks
# of 32, the interpreter's tile); at four, T = 256 (8 chunks of 32) and only the gated and the gate+window+sink
# calls. The windows reach back past a chunk start, so some calls read a key slice that starts after 0 (`_calls`).
@pytest.mark.parametrize("N,T,kinds", [(2, 128, ["dense", "gate", "window", "sink"]), (4, 256, ["gate", "sink"])])
def test_context_parallel_matches_one_process(N, T, kinds, tmp_path):
    # One input set per kind, sharded in both layouts (one single-process reference for both).
    cases = [dict(base, layout=layout) for base in (_case(T, kind, B=2 if kind == "gate" else 1) for kind in kinds)
             for layout in ("contiguous", "balanced")]
    out = _spawn(N, cases, str(tmp_path))
    for case, res in zip(cases, out["results"]):
        got, oracle = out["refs"][case["kind"]]
        tag = f"[N{N} {case['kind']} {case['layout']}]"
        assert res.keys() == got.keys(), tag
        # The same tiles and arithmetic: o and dq bitwise; dk, dv, dg, dsink are summed over ranks in fp32.
        assert torch.equal(res["o"], got["o"]), tag
        assert torch.equal(res["dq"], got["dq"]), tag
        for name in res:
            assert res[name].dtype == got[name].dtype, (tag, name)
            assert_close(name, oracle[name], res[name])
            assert_close(name + " vs parallel_attn", got[name].float(), res[name].float())
    assert out["deterministic"], "a second identical call gave different bits"
    for r, errors in enumerate(out["rank_errors"]):
        assert all(e is not None for e in errors), (r, errors)
        assert "packed sequences" in errors[0]
        assert "rejected" in errors[1] or "different" in errors[1] or "multiple" in errors[1], errors[1]
        assert "multiple of" in errors[2]
        assert "different" in errors[3] or "rejected" in errors[3], errors[3]
        assert ("rejected" in errors[4]) if r != N - 1 else ("dtype" in errors[4] or "v" in errors[4]), errors[4]
        assert "layout" in errors[5]
        assert "window_size as an int or None" in errors[6] and "window_size=left + 1" in errors[6], errors[6]
        assert "same local length" in errors[7], errors[7]


def test_chunk_plan():
    """Which keys each local chunk reads, and which chunks a rank receives (`_calls`, `_needed`)."""
    from fla_bwd.ops.attn.context_parallel import _calls, _needed

    # Contiguous, 4 ranks of 64: rank 2's queries [128, 192) read keys [0, 192), chunks 0-2 (none after).
    assert _calls(2, 4, "contiguous", 64, 0, 32) == [(0, 64, 0, 128, 192)]
    assert _needed(_calls(2, 4, "contiguous", 64, 0, 32), 64) == [0, 1, 2]
    # A window of 40: rank 3's queries [192, 256) read keys from (192 - 39) rounded down to 32 = 128 on.
    assert _calls(3, 4, "contiguous", 64, 40, 32) == [(0, 64, 128, 192, 256)]
    assert _needed(_calls(3, 4, "contiguous", 64, 40, 32), 64) == [2, 3]
    # Balanced, 2 ranks of 64 (chunks of 32): rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
    assert _calls(0, 2, "balanced", 64, 0, 32) == [(0, 32, 0, 0, 32), (32, 64, 0, 96, 128)]
    assert _calls(0, 2, "balanced", 64, 40, 32)[1] == (32, 64, 32, 96, 128)
    assert _needed(_calls(1, 2, "balanced", 64, 40, 32), 32) == [0, 1, 2]


def test_needs_torch_distributed():
    from fla_bwd.ops.attn import context_parallel_attn, shard

    x = torch.randn(1, 64, 2, 32)
    with pytest.raises(ValueError, match="torch.distributed"):
        context_parallel_attn(x, x, x)
    with pytest.raises(ValueError, match="torch.distributed"):
        shard(x)
