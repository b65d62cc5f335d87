# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Every kernel, at every tile-config class the launchers use, compiles for sm_90 (Hopper) and fits in the shared
memory one block may use there. Runs on a CPU machine (Triton compiles for a target without a GPU), in a
subprocess because the suite itself runs under the interpreter. Catches a config that only fails on the GPU: fp32
at D = 128 once asked for 256 KB in the forward.

The full set, every run, without compiling what has not changed: the subprocess is this file run as a script, which
runs `scripts/compile_sm90.py`'s own `main` with `triton.compile` looked up first in a record of earlier results
(`sm90_record/<test>.json`, committed) keyed on Triton's own compile key, the one its cache files a kernel under: a
hash of the kernel's source and of every @triton.jit function it calls (each with the line it starts at), its
signature, constexprs (tiles, CONTAIN mode, head dim, dtype) and options (warps, stages), the Triton build, ptxas's
version and the target. A kernel whose key is in the record is not compiled again (as a warm Triton cache would not
compile it); its recorded registers, spills and shared memory are printed and checked as a fresh compile's are. Any
other kernel is compiled, into a private Triton cache removed afterwards (nothing is left in `~/.triton`), and
recorded. After a kernel change the suite compiles the kernels whose key changed (an added line also moves the start
of every kernel below it in that file) and rewrites the record: commit it with the change, and a clean clone (CI)
compiles nothing; forget it and CI compiles them, as it should. FLA_BWD_SM90_RECOMPILE=1 ignores the record and
compiles the whole set (a cold run), e.g. to check the record itself: the record it rewrites must come out unchanged.

`scripts/compile_sm90.py` prints a line as each kernel is done, in a fixed order; the test fails only when no line
has come for a while (a hang, not a slow machine: the allowance grows with the load average), says which kernel was
reported last (the next ones were compiling), and always kills the script's whole process group (its spawn workers
and their ptxas processes too), so nothing outlives the test."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

# The kernels are compiled in a subprocess; this import makes the dependency visible to
# scripts/find_dependent_tests.py, which reads imports.
import fla_bwd.ops.attn.parallel  # noqa: F401

pytest.importorskip("triton.backends.nvidia")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "compile_sm90.py")
RECORD_DIR = os.path.join(HERE, "sm90_record")
STAGE_ENV = "FLA_BWD_SM90_STAGE"  # the folder where each process of a run leaves one file per kernel it reported
RECORD_ENV = "FLA_BWD_SM90_RECORD_FILE"
RECOMPILE_ENV = "FLA_BWD_SM90_RECOMPILE"
# Seconds without a new line from the script before it counts as hung. One kernel takes ~10 s on an idle core; the
# allowance is this times max(1, load average / cores). FLA_BWD_COMPILE_STALL_S overrides it.
STALL_S = 300.0


def stall_allowance() -> float:
    if os.environ.get("FLA_BWD_COMPILE_STALL_S"):
        return float(os.environ["FLA_BWD_COMPILE_STALL_S"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return STALL_S * max(1.0, os.getloadavg()[0] / cores)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group the script leads (its own session): the script, its workers, their ptxas."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_watched(cmd: list, env: dict) -> tuple:
    """(exit status, output lines) of `cmd`, stdout and stderr merged. Fails the test, naming the last kernel
    reported, when no line comes within `stall_allowance()` seconds."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines, last = [], [time.monotonic()]

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            last[0] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            allowance = stall_allowance()
            if time.monotonic() - last[0] > allowance:
                # The script reports kernels in a fixed order (D, then fwd/dq/dkv_per_query_head/dkv_per_kv_head,
                # each [inline]/[flag]/[fixup]): the ones compiling are the next after the last reported.
                done = [ln.split("{")[0].strip() for ln in lines if ln.startswith("D=") and "smem" in ln]
                pytest.fail(f"compile_sm90.py printed nothing for {allowance:.0f} s (load {os.getloadavg()[0]:.1f}); "
                            f"killed its process group. "
                            + (f"{len(done)} kernels reported, the last {done[-1]}: the next ones in order were "
                               "compiling.\n" if done else "No kernel reported: the first ones were compiling.\n")
                            + "\n".join(lines[-20:]), pytrace=False)
            time.sleep(0.5)
        reader.join(timeout=10)
        return proc.returncode, lines
    finally:
        kill_group(proc)  # also after a normal exit: no worker may be left behind


def compile_sm90_recorded(record: str, args: list) -> tuple:
    """(exit status, output lines) of `scripts/compile_sm90.py ARGS --check-smem` run through this file as a script
    (`recorded_main`) with `sm90_record/<record>.json`, in a private Triton cache removed afterwards."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cache = tempfile.mkdtemp(prefix="fla_bwd-sm90-")
    env["TRITON_CACHE_DIR"] = cache
    try:
        return run_watched([sys.executable, os.path.abspath(__file__), os.path.join(RECORD_DIR, record + ".json"),
                            *args, "--check-smem"], env)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_kernels_fit_hopper_shared_memory(dtype):
    """Compile every kernel for sm_90 with `dtype` inputs (scripts/compile_sm90.py --check-smem, 2 processes) and
    check each fits Hopper's 227 KB of shared memory per block."""
    # Two compile processes: 36 kernels per dtype take ~2.5 min in one on CI's 2 cores.
    rc, lines = compile_sm90_recorded(dtype, ["--dims", "64,128,256", "--dtype", dtype, "--jobs", "2"])
    out = "\n".join(lines)
    assert rc == 0, out[-4000:]
    # 4 kernels x 3 CONTAIN modes (see `host.add_contained`) x 3 head dims, each reported; in 16 bits also the
    # per-KV-head dK/dV kernel at the short windows' tiles (`config.dkv_tiles`: D = 128 of these) in 3 modes
    assert out.count("smem") == 36 + (3 if dtype == "bfloat16" else 0), out


def test_five_product_kernels_fit_hopper_shared_memory():
    """The five-product backward's kernels (scripts/compile_sm90.py --five: the dK/dV kernel with its dS store,
    unsplit, packed, at four programs a key tile, gated and with a sink, in 3 CONTAIN modes each, dQ-from-dS plain,
    packed, gated and both, the gate's key-side sum (dense and packed) and its one-launch form with dg's scan,
    delta, the sink's gradient, and the gated forward and delta with o_lo) at the head dims it runs (16-bit,
    D <= 256; above 128 also its dV-alone form, plain and with a sink, and dK from dS, plain and packed)."""
    rc, lines = compile_sm90_recorded("five", ["--five", "--dims", "64,128,256", "--jobs", "2"])
    out = "\n".join(lines)
    assert rc == 0, out[-4000:]
    # (5 dK/dV forms x 3 CONTAIN modes + 4 dQ-from-dS + 2 key side + gate grad by band + delta + sink grad + forward
    # and delta with o_lo) x 3 dims, + at D = 256 2 dV-alone forms x 3 modes and dK from dS, plain and packed
    assert out.count("smem") == (5 * 3 + 4 + 2 + 1 + 1 + 1 + 2) * 3 + 2 * 3 + 2, out


def test_feature_kernels_fit_hopper_shared_memory():
    """The kernels' softcap, non-causal, packed-tail-query and return_lse forms (scripts/compile_sm90.py --features:
    the forward, dQ, the per-KV-head and the dS-storing dK/dV kernels with softcap, the forward, dQ and the
    per-KV-head dK/dV kernel not causal and with packed queries shorter than keys, in 3 CONTAIN modes each; the
    forward storing the user's lse, dQ subtracting its gradient, and the five-product delta and sink-gradient kernels
    with it) at head dims 64, 128, 256 (16-bit)."""
    rc, lines = compile_sm90_recorded("features", ["--features", "--dims", "64,128,256", "--jobs", "2"])
    out = "\n".join(lines)
    assert rc == 0, out[-4000:]
    # ((4 softcap + 3 non-causal + 3 packed-tail forms) x 3 CONTAIN modes + 4 return_lse forms) x 3 dims
    assert out.count("smem") == (10 * 3 + 4) * 3, out


def test_hopper_dkv_kernel_fits_hopper_shared_memory():
    """The five-product backward's Gluon dK/dV kernel (`gluon_dkv.py`; scripts/compile_sm90.py --hopper: its three
    launch forms, fp32 sums read and/or written, each plain, gated and with a sink; two of them with softcap, with
    and without a sink; and two packed, plain and gated with a sink) compiles for sm_90 with the Triton installed here
    and fits."""
    import fla_bwd.ops.attn.gluon_dkv  # noqa: F401 - for scripts/find_dependent_tests.py

    rc, lines = compile_sm90_recorded("hopper", ["--hopper"])
    out = "\n".join(lines)
    assert rc == 0, out[-4000:]
    assert out.count("smem") == 3 * 3 + 2 * 2 + 2 * 2, out


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_hopper_forward_fits_hopper_shared_memory(dtype):
    """The Gluon forward (`gluon_fwd.py`; scripts/compile_sm90.py --hopper-fwd: causal and not, gated with o_lo,
    with a sink and the user's lse, all of them, packed alone, packed with a sink and the user's lse, and packed
    gated; softcap causal, non-causal and gated) at head dims 64, 128 and 256 compiles for sm_90 with the Triton
    installed here and fits: three K/V stages at D = 128 leave it ~1 KB of the 227 KB a block may use (gated)."""
    import fla_bwd.ops.attn.gluon_fwd  # noqa: F401 - for scripts/find_dependent_tests.py

    rc, lines = compile_sm90_recorded(f"hopper_fwd_{dtype}", ["--hopper-fwd", "--dims", "64,128,256", "--dtype", dtype])
    out = "\n".join(lines)
    assert rc == 0, out[-4000:]
    assert out.count("smem") == (8 + 3) * 3, out


# --- The subprocess: scripts/compile_sm90.py's main with a record of earlier compiles. ---------------------------


class _Recorded:
    """`triton.compile` and `compile_sm90.resource_report` for one process: a kernel whose Triton compile key is in
    the record gives its recorded report without compiling; any other is compiled. Every kernel reported is left in
    the stage folder, for `recorded_main` to write the record from."""

    def __init__(self, record_file: str, stage: str):
        import compile_sm90
        import triton

        self.triton, self.script, self.stage = triton, compile_sm90, stage
        self.real_compile, self.real_report = triton.compile, compile_sm90.resource_report
        self.entries = {}
        if os.path.exists(record_file) and not os.environ.get(RECOMPILE_ENV):
            with open(record_file) as f:
                record = json.load(f)
            if record.get("reporter") == self.reporter():
                self.entries = record["kernels"]
        triton.compile = self.compile
        compile_sm90.resource_report = self.report

    def reporter(self) -> str:
        """A hash of what turns a compiled kernel into its report (`resource_report`) and of the limit it is checked
        against: a record made by another one is not used."""
        import inspect
        text = inspect.getsource(self.real_report) + str(self.script.HOPPER_SMEM_PER_BLOCK)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @staticmethod
    def key(src, target, options) -> str:
        """The hash `triton.compile(src, target, options)` files its result under (the first steps of
        `triton.compiler.compiler.compile`)."""
        from triton import knobs
        from triton._C.libtriton import get_cache_invalidating_env_vars
        from triton.compiler.compiler import make_backend
        from triton.runtime.cache import get_cache_key

        if knobs.runtime.add_stages_inspection_hook is not None:
            return ""  # the key would depend on the hook: never recorded
        backend = make_backend(target)
        options = backend.parse_options(dict(options or dict(), **src.parse_options()))
        key = get_cache_key(src, backend, options, env_vars=get_cache_invalidating_env_vars())
        return hashlib.sha256(key.encode("utf-8")).hexdigest()

    def compile(self, src, target=None, options=None):
        key = self.key(src, target, options)
        if key in self.entries:
            from types import SimpleNamespace
            entry = self.entries[key]
            return SimpleNamespace(hash=key, recorded=entry["report"],
                                   metadata=SimpleNamespace(shared=entry["shared"], name=entry["name"]))
        compiled = self.real_compile(src, target=target, options=options)
        assert compiled.hash == key, ("this file's copy of Triton's compile key (`_Recorded.key`) no longer matches "
                                      f"Triton {self.triton.__version__}'s: update it")
        return compiled

    def report(self, compiled) -> str:
        text = getattr(compiled, "recorded", None) or self.real_report(compiled)
        entry = dict(report=text, shared=compiled.metadata.shared, name=compiled.metadata.name)
        with open(os.path.join(self.stage, compiled.hash + ".json"), "w") as f:
            json.dump(entry, f)
        return text


def recorded_main(record_file: str, args: list) -> None:
    """Run compile_sm90.py's `main` with ARGS through `_Recorded` (here and in its spawn workers, which import this
    file as __mp_main__), then rewrite the record: the kernels this run reported when it passed (stale keys go),
    those added to the earlier ones when it did not (what compiled is kept for the next try)."""
    sys.path.insert(0, os.path.dirname(SCRIPT))
    stage = tempfile.mkdtemp(prefix="fla_bwd-sm90-stage-")
    os.environ[STAGE_ENV], os.environ[RECORD_ENV] = stage, record_file
    recorded = _Recorded(record_file, stage)
    sys.argv = [SCRIPT, *args]
    passed = False
    try:
        recorded.script.main()
        passed = True
    finally:
        kernels = {} if passed else dict(recorded.entries)
        for name in sorted(os.listdir(stage)):
            with open(os.path.join(stage, name)) as f:
                kernels[name[:-len(".json")]] = json.load(f)
        shutil.rmtree(stage, ignore_errors=True)
        record = dict(about="tests/ops/test_kernel_resources.py: sm_90 compile reports by Triton compile key; "
                      "rewritten by the test, commit it with a kernel change", reporter=recorded.reporter(),
                      kernels=kernels)
        text = json.dumps(record, indent=1, sort_keys=True) + "\n"
        old = open(record_file).read() if os.path.exists(record_file) else None
        if kernels and text != old:
            os.makedirs(os.path.dirname(record_file), exist_ok=True)
            with open(record_file + ".tmp", "w") as f:
                f.write(text)
            os.replace(record_file + ".tmp", record_file)


if __name__ == "__main__":
    recorded_main(sys.argv[1], sys.argv[2:])
elif __name__ == "__mp_main__" and os.environ.get(STAGE_ENV):  # a spawn worker of `recorded_main`
    sys.path.insert(0, os.path.dirname(SCRIPT))
    _Recorded(os.environ[RECORD_ENV], os.environ[STAGE_ENV])
