#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`context_parallel_attn` against one process's `parallel_attn`, on two processes:

    TRITON_INTERPRET=1 torchrun --nproc-per-node 2 scripts/context_parallel_demo.py   # a CPU, gloo
    torchrun --nproc-per-node 2 scripts/context_parallel_demo.py                      # two GPUs, NCCL

Prints the largest difference of o and of each gradient on rank 0.
"""

import torch
import torch.distributed as dist

from fla_bwd.ops.attn import context_parallel_attn, parallel_attn, shard, unshard


def main() -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # the same full tensors on every rank; each keeps its shard
    T = 4096 if cuda else 128
    q = torch.randn(1, T, 4, 32, device=device)
    k, v = torch.randn(1, T, 2, 32, device=device), torch.randn(1, T, 2, 32, device=device)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, 4, device=device))
    do = torch.randn(1, T, 4, 32, device=device)
    mine = [shard(x, "balanced").requires_grad_() for x in (q, k, v, g)]
    o = context_parallel_attn(*mine, window_size=T // 3, layout="balanced")
    o.backward(shard(do, "balanced"))
    full = [x.clone().requires_grad_() for x in (q, k, v, g)]
    ref = parallel_attn(*full, window_size=T // 3)
    ref.backward(do)
    for name, a, b in [("o", o.detach(), ref.detach())] + [
            ("d" + n, x.grad, y.grad) for n, x, y in zip("qkvg", mine, full)]:
        diff = (unshard(a, "balanced") - b).abs().max().item()
        if rank == 0:
            print(f"{name}: max |context parallel - one process| = {diff:.2e}")
    dist.destroy_process_group()



if __name__ == "__main__":
    main()
