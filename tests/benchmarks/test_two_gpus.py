# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`benchmarks/tools/two_gpus.sh` with a fake `nvidia-smi`: each job sees its own GPU and OUT, the second starts
after the first, both logs are printed, the exit status is the first nonzero one; one GPU is refused."""

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "tools", "two_gpus.sh")


def run(tmp_path, gpus: int, *jobs):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: fake'\n" for i in range(gpus)))
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(tmp_path / "out"), DELAY_S="0")
    return subprocess.run(["bash", SCRIPT, *jobs], env=env, capture_output=True, text=True, timeout=60)


def test_each_job_on_its_gpu(tmp_path):
    p = run(tmp_path, 2, 'echo "gpu=$CUDA_VISIBLE_DEVICES out=$OUT"', 'echo "gpu=$CUDA_VISIBLE_DEVICES"; exit 3')
    assert p.returncode == 3, p.stdout + p.stderr
    assert (tmp_path / "out" / "gpu0" / "job.log").read_text() == f"gpu=0 out={tmp_path / 'out' / 'gpu0'}\n"
    assert (tmp_path / "out" / "gpu1" / "job.log").read_text() == "gpu=1\n"
    assert "GPU 0 exit 0" in p.stdout and "GPU 1 exit 3" in p.stdout and "gpu=1" in p.stdout


def test_refuses_one_gpu_and_a_missing_job(tmp_path):
    p = run(tmp_path, 1, "true", "true")
    assert p.returncode == 2 and "needs two GPUs" in p.stderr
    p = run(tmp_path, 2, "true")
    assert p.returncode == 2 and "usage" in p.stderr
