# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Split the registered shapes into parts that each fit one GPU command (<= 9 minutes), balanced by estimated time.

    python -m benchmarks.ops.plan              # the plan for 2 parts, with the estimate of every shape and part
    python -m benchmarks.ops.plan --parts 3
    python -m benchmarks.ops.plan --part 2/2   # the comma-separated shape names of one part (what gpu_run.sh uses)

The estimate (seconds) is deliberately a fixed table, not read from a results file, so every part of one commit
computes the same split. It comes from the 2026-11-29 H200 run (its summary.json, in git history: gate 131.5 s,
per-mode `seconds`, 330 s for gate + 16 shapes, of which 17 s between modes, about 1.1 s a shape):

- `AB_S`: the shape's A/B alone (dispatch + legacy, bwd and fwdbwd, kernel count, peak memory, first-call compile of
  a new Triton specialisation), the measured per-mode seconds + 1.1 s. Rows measured only with peers
  (g8-T8192, g8-T4096, g4-T2048-D64) have the peer model below subtracted; rows not reached (the fp16 MHA long row,
  breadth, controls) are set from their nearest measured twin (a new specialisation: ~12-14 s, like gqa4-long).
- `PEER_ROW_S`: one peer on one new shape, both modes: compile for that shape (flex: torch.compile with
  dynamic=False recompiles per shape; fla-0.6: its Triton autotune; fa3: jax.jit) + warm-up + timing. Fitted to
  g8-T4096 (16.0 s with all five peers against ~4.5 s A/B alone) and g4-T2048-D64 (bwd-only peers).
- `ONCE_S`: first use of a peer in a process (torch.compile / inductor cold start, the gated flex wrapper's first
  compile, the FA3 subprocess probe + JAX start, the fla import). Fitted to g8-T8192 (39.5 s, first shape).
- The estimates count the peers of the record (`shapes.RECORD_PEERS`, gpu_run.sh's default `PEERS`); FA4 and its
  deterministic mode run on request (their own install) and have guessed figures only (its CuTe DSL compiles each
  kernel variant on first use: not measured here).
- `SAFETY` multiplies every shape estimate; `FIXED_S` is per command (wheel install + env log + imports before the
  runner, report and plot after it) and `GATE_S` the gate (part 1 only; 131.5 s measured with 8 xdist workers on
  2026-11-29, 235 s with 12 in the records of b0781de and 08ece6b, whose part 1 ran out of its budget).
"""

import argparse
import sys

from .registry import SHAPES
from .shapes import RECORD_PEERS, unsupported

AB_S = {
    "g8-T8192": 10.0, "g8-T4096": 4.5, "g4-T2048-D64": 13.0, "gqa4-long": 13.9, "gqa4-short": 6.4,
    "mha-long": 10.4, "mha-short": 6.0, "g8-T8192-W512": 5.0, "g8-T16384-W256": 4.8, "g8-T8192-gated": 18.4,
    "gqa4-long-gated": 14.6, "varlen-gated-8192": 15.4, "varlen-gated-16384": 8.0, "g8-T8192-W256": 4.6,
    "g8-T16384-W512": 4.4, "mha-short-fp16": 9.8,
    # not reached on 2026-11-29: from the nearest measured twin
    "mha-long-fp16": 10.4, "g2-T2048-D64": 14.0, "g2-T2048-D128": 14.0, "g8-T2048-D64": 13.0,
    "g8-T2048-D128": 6.0, "ctl-fwd-g8-T8192": 4.0, "ctl-g16-T2048": 14.0, "ctl-fp32-g8-T2048": 20.0,
    "ctl-K128-V64-g8-T2048": 14.0, "ctl-mha-T2048": 6.0,
}
UNKNOWN_AB_S = 15.0  # a shape not in the table (custom, or added later: the "variants" rows, never timed yet)
PEER_ROW_S = {"flex": 5.0, "fla": 3.0, "sdpa-cudnn": 1.0, "sdpa-fa2": 1.0, "fa3": 1.5,
              "fa4": 10.0, "fa4-det": 10.0}  # FA4: a guess (a CuTe DSL compile per new kernel variant)
GATED_FLEX_EXTRA_S = 12.0  # score_mod compiles a larger graph: Flex setup 34-38 s gated, 7-10 s ungated (b0781de);
# assumed the same for the softcap rows' score_mod (not measured)
ONCE_S = {"flex": 12.0, "flex-gated": 10.0, "fa3": 8.0, "fla": 2.0, "fa4": 30.0, "fa4-det": 30.0}  # FA4: a guess
# (its subprocess probe: import of the CuTe DSL and one forward + backward compiled)
SAFETY = 1.25
FIXED_S = 45.0
GATE_S = 235.0  # the gate with 12 workers, kernels prewarmed for part 1 only: 235.4 s (b0781de), 235.0 s (08ece6b)
COMMAND_LIMIT_S = 540.0  # 9 minutes: one device command may run 600 s, including installs and compile


def peers_for(shape, peers=RECORD_PEERS) -> list:
    """The peers this row would time (the registry's choice less those that cannot represent it), no imports."""
    if shape.peers is True:
        asked = list(peers)
    elif not shape.peers:
        asked = []
    else:
        asked = [p for p in peers if p in shape.peers]
    return [p for p in asked if unsupported(p, shape) is None]


def shape_estimate(shape, peers=RECORD_PEERS) -> float:
    """Seconds for one shape in its default modes, A/B and the peers it supports (one-time costs excluded)."""
    base = AB_S.get(shape.name, UNKNOWN_AB_S)
    frac = sum({"fwd": 0.3, "bwd": 0.6, "fwdbwd": 0.4}[m] for m in shape.modes)  # compile lands on the first mode
    frac = min(frac, 1.0)
    cost = 0.0
    for p in peers_for(shape, peers):
        cost += PEER_ROW_S[p] + (GATED_FLEX_EXTRA_S if p == "flex" and (shape.gated or shape.softcap) else 0.0)
    return round(SAFETY * (base + frac * cost), 1)


def once_estimate(shapes, peers=RECORD_PEERS) -> float:
    used = {p for s in shapes for p in peers_for(s, peers)}
    cost = sum(ONCE_S.get(p, 0.0) for p in used)
    if "flex" in used and any(s.gated for s in shapes if "flex" in peers_for(s, peers)):
        cost += ONCE_S["flex-gated"]
    return round(SAFETY * cost, 1)


def part_estimate(shapes, index: int, peers=RECORD_PEERS) -> float:
    """Seconds for one command: fixed + (gate on part 1) + one-time peer costs + every shape."""
    return round(FIXED_S + (GATE_S if index == 1 else 0.0) + once_estimate(shapes, peers)
                 + sum(shape_estimate(s, peers) for s in shapes), 1)


def split(shapes=None, parts: int = 2) -> list:
    """Partition `shapes` (default: every registered shape) into `parts` lists, balanced by estimated time.

    Greedy longest-first onto the part with the smallest load, where part 1 starts loaded with the gate; ties go to
    the lower part. Within a part the registry's order (priority) is kept. Depends only on the shapes, not on the
    run's options, so every part of one commit computes the same split."""
    shapes = list(SHAPES if shapes is None else shapes)
    if parts < 1:
        raise ValueError("parts must be >= 1")
    order = {s.name: i for i, s in enumerate(shapes)}
    load = [FIXED_S + (GATE_S if i == 0 else 0.0) for i in range(parts)]
    out = [[] for _ in range(parts)]
    for s in sorted(shapes, key=lambda s: (-shape_estimate(s), order[s.name])):
        k = min(range(parts), key=lambda i: (load[i], i))
        out[k].append(s)
        load[k] += shape_estimate(s)
    return [sorted(p, key=lambda s: order[s.name]) for p in out]


def parse_part(spec: str):
    """`K/N` -> (K, N) with 1 <= K <= N."""
    try:
        k, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--part needs K/N (e.g. 1/2), got {spec!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"--part {spec!r}: need 1 <= K <= N")
    return k, n


def describe(parts: int = 2) -> str:
    plan = split(parts=parts)
    lines = [f"{len(SHAPES)} shapes in {parts} parts (estimates in seconds, x{SAFETY} safety; limit "
             f"{COMMAND_LIMIT_S:.0f} s a command)"]
    for i, p in enumerate(plan, 1):
        est = part_estimate(p, i)
        over = f"  OVER the {COMMAND_LIMIT_S:.0f} s limit: use more parts" if est > COMMAND_LIMIT_S else ""
        lines.append(f"part {i}/{parts}: {est:.0f} s = fixed {FIXED_S:.0f}"
                     f"{f' + gate {GATE_S:.0f}' if i == 1 else ''} + peers once {once_estimate(p):.0f}"
                     f" + shapes {sum(shape_estimate(s) for s in p):.0f}{over}")
        for s in p:
            lines.append(f"    {s.name:<24} {shape_estimate(s):6.1f}  peers: {','.join(peers_for(s)) or '-'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ops.plan", description=__doc__.split("\n")[0])
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--part", default=None, help="K/N: print that part's shape names, comma-separated")
    a = ap.parse_args(argv)
    if a.part:
        try:
            k, n = parse_part(a.part)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(",".join(s.name for s in split(parts=n)[k - 1]))
        return 0
    print(describe(a.parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
