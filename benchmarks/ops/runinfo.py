# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The correctness gate (the op's test file in a subprocess) and the environment record (torch.utils.collect_env)."""

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LOUD = "!" * 100


def pin_triton_cache_dir() -> str:
    """Set TRITON_CACHE_DIR to Triton's own default where it is unset, and return it. Inductor (the Flex peer's
    torch.compile) points an unset TRITON_CACHE_DIR at its own directory on its first compile, after which this
    package's kernels miss the cache that the gate, `tools/prewarm.py` or an earlier part filled, and compile again
    (8-63 s a row in the 2026-12-04 record). Imports triton: call it after TRITON_INTERPRET is decided."""
    import triton

    return os.environ.setdefault("TRITON_CACHE_DIR", triton.knobs.cache.dir)


def run_gate(test_files, timeout_s: float, extra_env: dict = None) -> dict:
    """`pytest -q -x <files>` in a subprocess from the repository root; green only on exit code 0."""
    paths = [f if os.path.isabs(f) else os.path.join(REPO, f) for f in test_files]
    shown = " ".join(test_files)
    rec = {"file": shown, "skipped": False, "command": f"{sys.executable} -m pytest -q -x {shown}"}
    missing = [f for f, p in zip(test_files, paths) if not os.path.exists(p)]
    if missing:
        rec.update(status="red", returncode=None, seconds=0.0, tail=f"gate file(s) {missing} do not exist")
        return rec
    env = dict(os.environ, **(extra_env or {}))
    # On a fresh GPU machine the gate is dominated by Triton compiling each test's kernel specialisations, one
    # at a time; pytest-xdist (when present) spreads that over the host's cores. GATE_WORKERS=0 turns it off.
    workers = int(os.environ.get("GATE_WORKERS", min(12, os.cpu_count() or 1)))
    parallel = ["-n", str(workers)] if workers > 1 and _has_xdist() else []
    rec["command"] = f"{sys.executable} -m pytest -q -x {' '.join(parallel)} {shown}".replace("  ", " ")
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *parallel,
                               *paths],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        rec.update(status="green" if proc.returncode == 0 else "red", returncode=proc.returncode, tail="\n".join(tail))
    except subprocess.TimeoutExpired:
        rec.update(status="red", returncode=None, tail=f"gate timed out after {timeout_s:.0f} s")
    rec["seconds"] = round(time.time() - t0, 1)
    return rec


def _has_xdist() -> bool:
    try:
        import xdist  # noqa: F401
    except ImportError:
        return False
    return True


def skipped_gate(test_files) -> dict:
    return {"file": " ".join(test_files), "skipped": True, "status": "skipped", "returncode": None, "seconds": 0.0,
            "tail": "gate skipped with --skip-gate: speedups below are NOT gated on correctness"}


def print_gate(rec: dict) -> None:
    if rec["status"] == "green":
        where = f" (ran in part {rec['ran_in_part']}, same code)" if rec.get("inherited") else f" ({rec['seconds']} s)"
        print(f"gate: GREEN  {rec['file']}{where}", flush=True)
        return
    if rec["status"] == "deferred":
        print(f"gate: DEFERRED to part {rec['ran_in_part']}: {rec['tail']}", flush=True)
        return
    print(LOUD, flush=True)
    if rec["skipped"]:
        print("!!! WARNING: CORRECTNESS GATE SKIPPED (--skip-gate). Speedups below are NOT gated on a green test run.")
    else:
        print(f"!!! GATE RED: {rec['file']} failed (returncode {rec['returncode']}). NO SPEEDUP WILL BE REPORTED.")
        for line in rec["tail"].splitlines():
            print(f"!!!   {line}")
    print(LOUD, flush=True)


def _cmd(args) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=20, cwd=REPO).stdout.strip()
    except Exception:
        return ""


def environment() -> dict:
    import torch

    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": platform.node(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "git_commit": git_commit(),
        "bench_commit": os.environ.get("BENCH_COMMIT") or None,  # what the caller says it ran (no git needed)
        "source_fingerprint": source_fingerprint(),
        "git_dirty": bool(_cmd(["git", "status", "--porcelain", "--untracked-files=no"])),
        "command": " ".join([os.path.basename(sys.executable), "-m", "benchmarks.ops.run"] + sys.argv[1:]),
        "argv": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "env": {k: os.environ[k] for k in ("TRITON_INTERPRET", "FLA_BWD_DKV_PATH", "FLA_DISABLE_BACKEND_DISPATCH",
                                           "XLA_PYTHON_CLIENT_PREALLOCATE", "CUDA_VISIBLE_DEVICES")
                if k in os.environ},
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_sms"] = p.multi_processor_count
        env["gpu_mem_GiB"] = round(p.total_memory / 2**30, 1)
    else:
        env["gpu"] = None
    env.update(system_info())
    env.update(peer_versions())
    return env


def system_info() -> dict:
    """torch.utils.collect_env's description of the machine (driver, GPU models, CUDA/cuDNN, OS, compilers, pip
    packages, CPU), stored whole under `collect_env`; `driver` is its NVIDIA driver version."""
    try:
        from torch.utils import collect_env

        info = collect_env.get_env_info()._asdict()
    except Exception as e:  # collect_env shells out (nvidia-smi, pip, lscpu): never let it stop a run
        return {"collect_env": {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}}
    return {"collect_env": info, "driver": info.get("nvidia_driver_version")}


def peer_versions() -> dict:
    """Versions of the peer packages this process imported (call at the end of a run); FA4's from its distribution
    (flash_attn.cute's own `__version__` reads another name and says 0.0.0)."""
    out = {f"{mod}_version": getattr(sys.modules[mod], "__version__", None)
           for mod in ("fla", "jax", "flash_attn3_jax") if mod in sys.modules}
    if "flash_attn.cute" in sys.modules:
        from importlib.metadata import PackageNotFoundError, version

        try:
            out["flash_attn_4_version"] = version("flash-attn-4")
        except PackageNotFoundError:
            out["flash_attn_4_version"] = None
    return out


def git_commit():
    """HEAD as 40 hex digits, or None (a copy without usable git history answers `HEAD` or nothing)."""
    out = _cmd(["git", "rev-parse", "--verify", "-q", "HEAD"])
    return out if re.fullmatch(r"[0-9a-f]{40}", out or "") else None


FINGERPRINT_DIRS = ("fla_bwd", "benchmarks", "tests/ops")
FINGERPRINT_SUFFIXES = (".py", ".sh")


def source_fingerprint(root: str = REPO) -> str:
    """sha256 (first 16 hex digits) over the paths and bytes of the code a run depends on: every .py / .sh file
    under fla_bwd/, benchmarks/ (not benchmarks/results/) and tests/ops/. Needs no git, so a copy of the tree on
    the GPU machine and the checkout here agree exactly when the code does."""
    h = hashlib.sha256()
    for top in FINGERPRINT_DIRS:
        base = os.path.join(root, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
            if rel_dir == "benchmarks/results" or rel_dir.startswith("benchmarks/results/"):
                dirnames[:] = []
                continue
            for name in sorted(filenames):
                if name.endswith(FINGERPRINT_SUFFIXES):
                    rel = f"{rel_dir}/{name}"
                    with open(os.path.join(dirpath, name), "rb") as f:
                        body = f.read()
                    h.update(rel.encode() + b"\0" + hashlib.sha256(body).digest())
    return h.hexdigest()[:16]


def clear_gate_stamp(path: str) -> None:
    """Part 1 removes an earlier stamp before its gate runs: a later part started beside it (one part per GPU)
    must read "deferred" while this gate runs, never the result of an earlier run of the same code."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        print(f"note: could not remove the gate stamp {path}: {e}", flush=True)


def write_gate_stamp(path: str, gate: dict, part: int) -> None:
    """Part 1 leaves its gate result where a later part on the same machine finds it."""
    rec = {"gate": gate, "part": part, "source_fingerprint": source_fingerprint(), "git_commit": git_commit(),
           "bench_commit": os.environ.get("BENCH_COMMIT") or None, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(rec, f, indent=1)
    except OSError as e:
        print(f"note: could not write the gate stamp {path}: {e}", flush=True)


def deferred_gate(test_files, stamp_path=None, from_part: int = 1) -> dict:
    """The gate of a later part: inherited from part 1's stamp when it is there for this very code, else deferred
    (the merge then checks part 1's record). Never runs the tests."""
    rec = {"file": " ".join(test_files), "skipped": False, "returncode": None, "seconds": 0.0,
           "ran_in_part": from_part}
    fp = source_fingerprint()
    stamp = None
    if stamp_path and os.path.exists(stamp_path):
        try:
            with open(stamp_path) as f:
                stamp = json.load(f)
        except (OSError, ValueError) as e:
            rec["stamp_error"] = f"unreadable stamp {stamp_path}: {e}"
    if stamp and stamp.get("source_fingerprint") == fp and stamp.get("gate", {}).get("file") == rec["file"] \
            and not stamp.get("gate", {}).get("skipped"):
        g = stamp["gate"]
        rec.update(status=g.get("status"), inherited=True, returncode=g.get("returncode"),
                   seconds_in_part=g.get("seconds"), stamp=stamp_path, stamp_written=stamp.get("written"),
                   tail=f"gate ran in part {stamp.get('part', from_part)} on this machine for the same code "
                        f"(fingerprint {fp}): {g.get('status')}")
    else:
        why = "no stamp" if stamp is None else \
            f"stamp is for other code or gate files ({stamp.get('source_fingerprint')})"
        rec.update(status="deferred", inherited=False,
                   tail=f"gate not run here: it runs in part {from_part}; the merge refuses unless part {from_part} "
                        f"recorded it green for the same code ({why})")
    return rec
