# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""run51's verdict from ab.json, row by row: the runner's per-round ratios of each candidate to HEAD (`vs`, under 1:
faster) and, where measured, the ratio of their graph backwards.

    python benchmarks/results/five-product/run51-kv-early-dq-hot/ratios.py ab_out/ab.json
"""
import json
import sys


def main(path: str) -> None:
    for result in json.load(open(path))["results"]:
        bwd = result["modes"]["bwd"]
        head_graph = bwd["candidates"]["fla_bwd"].get("overhead", {}).get("graph_bwd_us")
        for name, vs in bwd.get("vs", {}).items():
            if "@" not in name:
                continue  # a peer
            graph = bwd["candidates"][name].get("overhead", {}).get("graph_bwd_us")
            graph_note = f" graph bwd {graph / head_graph:.4f}" if graph and head_graph else ""
            rounds = " ".join(f"{r:.3f}" for r in vs["ratios"])
            print(f"{result['shape']['name']:18s} {name.split('@')[-1]:13s} median {vs['median']:.4f} "
                  f"rounds {rounds} all<1 {vs['max'] < 1}{graph_note}")


if __name__ == "__main__":
    main(sys.argv[1])
