# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""run51's verdict from ab.json: each candidate's per-round median over HEAD's, row by row (under 1: faster).

    python benchmarks/results/five-product/run51-kv-early-dq-hot/ratios.py ab_out/ab.json
"""
import json
import sys


def main(path: str) -> None:
    results = json.load(open(path))['results']
    for result in results:
        cands = result['modes']['bwd']['candidates']
        head = cands['fla_bwd']
        for name, cand in cands.items():
            if '@' not in name:
                continue
            ratios = [c / h for c, h in zip(cand['round_medians_us'], head['round_medians_us'])]
            graph = ''
            if cand.get('overhead') and head.get('overhead'):
                c, h = cand['overhead'].get('graph_bwd_us'), head['overhead'].get('graph_bwd_us')
                graph = f' graph bwd {c / h:.4f} ({c:.1f} vs {h:.1f})' if c and h else ''
            row, cand_name = result['shape']['name'], name.split('@')[-1]
            rounds = ' '.join(f'{r:.3f}' for r in ratios)
            print(f"{row:18s} {cand_name:13s} median {cand['median_us'] / head['median_us']:.4f} rounds {rounds} "
                  f"all<1 {all(r < 1 for r in ratios)} ({cand['median_us']:.1f} vs {head['median_us']:.1f}){graph}")


if __name__ == '__main__':
    main(sys.argv[1])
