"""The timing protocol's own pieces: one timing path, fingerprints, and the parent's clock check."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from kernel_env.evaluators.child.timing import (
    fingerprint,
    fingerprints_match,
    time_calls,
)
from kernel_env.evaluators.harness import _clock_mismatch, _run_delay_ms


def _inputs(seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [torch.randn(4096), torch.randn(4096)]


def test_time_calls_times_every_call_and_signals_around_it():
    events = []
    times, prints = time_calls(lambda x, y: torch.relu(x + y), _inputs, [1, 2, 3], torch.device("cpu"),
                               warmup_seeds=[9], flush_bytes=1 << 20, fp_seed=5,
                               signal=lambda kind, k: events.append((kind, k)))
    assert len(times) == 3 and all(t > 0 for t in times)
    assert events == [("start", 0), ("end", 0), ("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    assert len(prints) == 3 and prints[0] != prints[1]  # different seeds, different outputs


def test_timed_outputs_are_poisoned_after_their_fingerprint():
    kept = []

    def fn(x, y):
        out = x + y
        kept.append(out)
        return out

    time_calls(fn, _inputs, [1], torch.device("cpu"), flush_bytes=1 << 20)
    assert torch.isnan(kept[0]).all()


def test_fingerprints_match_within_tolerance_and_not_beyond():
    ref = torch.randn(1000)
    a = fingerprint(ref, 7)
    assert fingerprints_match(a, fingerprint(ref + 1e-4, 7), 1e-2, 1e-2)
    assert not fingerprints_match(a, fingerprint(ref + 1.0, 7), 1e-2, 1e-2)
    assert not fingerprints_match(a, fingerprint(torch.full_like(ref, float("nan")), 7), 1e-2, 1e-2)
    assert not fingerprints_match(a, fingerprint(ref[:999], 7), 1e-2, 1e-2)


def _marks(durations_ms: list[float]) -> list[tuple[str, int, float]]:
    marks, now = [], time.perf_counter()
    for k, duration in enumerate(durations_ms):
        marks.append(("start", k, now))
        now += duration / 1e3
        marks.append(("end", k, now))
        now += 0.01
    return marks


def test_honest_times_agree_with_the_kernels_clock():
    assert _clock_mismatch([2.0] * 10, _marks([2.1] * 10)) is None


def test_under_reported_times_are_caught_by_the_kernels_clock():
    problem = _clock_mismatch([0.1] * 10, _marks([20.0] * 10))
    assert problem and "timing does not add up" in problem


def test_missing_call_marks_are_reported():
    marks = _marks([1.0] * 10)[:-2]
    assert "did not report every timed call" in _clock_mismatch([1.0] * 10, marks)


def test_extra_marks_sent_by_the_candidate_are_reported():
    marks = _marks([20.0] * 10) + [("start", 3, 0.0), ("end", 3, 0.0)]
    assert "exactly once" in _clock_mismatch([0.1] * 10, marks)


def test_a_few_calls_preempted_on_a_busy_host_are_not_a_timing_violation():
    # An honest 0.1 ms call; the child was descheduled for 20 ms during a fifth of the calls.
    durations = [20.1 if k % 5 == 0 else 0.12 for k in range(30)]
    assert _clock_mismatch([0.1] * 30, _marks(durations)) is None


def test_gaps_in_most_calls_that_the_waits_for_a_processor_account_for_are_not_a_violation():
    # Seen on a loaded 2-core machine (CI): an honest 0.117 ms call, 4.6 ms gaps in 4 of 5 calls,
    # while the kernel counted hundreds of ms of the child's thread waiting, runnable, for a processor.
    times, marks = [0.117] * 5, _marks([0.15, 4.7, 4.72, 4.8, 4.75])
    assert _clock_mismatch(times, marks, waited_ms=0.0)  # without the waits: no way to tell
    assert _clock_mismatch(times, marks, waited_ms=334.0) is None
    # Waits that account for only part of the gaps leave the rest to be judged.
    assert "timing does not add up" in _clock_mismatch([0.1] * 10, _marks([20.0] * 10), waited_ms=50.0)


def test_the_kernel_counts_a_threads_wait_for_a_processor():
    """A process spinning for 1 s on one processor beside another spinning process waits, runnable,
    about half that time; the same spin alone waits far less."""
    if _run_delay_ms(os.getpid()) is None:
        pytest.skip("this kernel keeps no scheduler statistics (/proc/PID/schedstat)")
    cpu = min(os.sched_getaffinity(0))
    spin = "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end: pass\ntime.sleep(30)"

    def waited_while_spinning(beside: bool) -> float:
        pinned = {"preexec_fn": lambda: os.sched_setaffinity(0, {cpu})}
        rival = subprocess.Popen([sys.executable, "-c", "while True: pass"], **pinned) if beside else None
        child = subprocess.Popen([sys.executable, "-c", spin], **pinned)
        try:
            time.sleep(2.5)  # started, spun its second, asleep now
            return _run_delay_ms(child.pid)
        finally:
            for process in (child, rival):
                if process is not None:
                    process.kill()
                    process.wait()

    beside, alone = waited_while_spinning(beside=True), waited_while_spinning(beside=False)
    assert beside > 250.0 and alone < beside / 2, (beside, alone)


def test_baselines_are_measured_once_and_cached(tmp_path):
    from kernel_env.evaluators.baselines import BaselineCache
    from kernel_env.evaluators.harness import measure_baselines
    from kernel_env.evaluators.records import EvalSettings

    code = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
            "def get_inputs():\n    return [torch.randn(4096)]\ndef get_init_inputs():\n    return []\n")
    cache = BaselineCache(tmp_path)
    settings = EvalSettings(compile_baseline=False, timed_calls=5)
    first = measure_baselines("t", code, device="cpu", baselines=cache, settings=settings)
    assert first.error is None and first.eager_ms > 0 and first.compile_ms is None
    assert len(list(tmp_path.glob("*.json"))) == 1
    second = measure_baselines("t", code, device="cpu", baselines=cache, settings=settings)
    assert second.eager == first.eager  # read back from the cache, not measured again


def test_a_cached_baseline_without_compile_is_remeasured_for_a_job_that_wants_compile(tmp_path):
    from kernel_env.evaluators.baselines import BaselineCache
    from kernel_env.evaluators.harness import measure_baselines
    from kernel_env.evaluators.records import EvalSettings

    code = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
            "def get_inputs():\n    return [torch.randn(1024)]\ndef get_init_inputs():\n    return []\n")
    cache = BaselineCache(tmp_path)
    eager_only = measure_baselines("t", code, device="cpu", baselines=cache, settings=EvalSettings(compile_baseline=False, timed_calls=3))
    assert eager_only.compile_ms is None
    both = measure_baselines("t", code, device="cpu", baselines=cache, settings=EvalSettings(timed_calls=3))
    assert both.error is None and both.compile_ms and both.compile_ms > 0


def test_the_launch_cover_compiles_for_hopper_and_ends_every_block_at_one_deadline():
    """The cover kernel (CUDA only, so checked here in its PTX): one thread of each block swaps in the
    launch's deadline, the block waits for that swap, and every thread spins on the global timer."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernel_env.evaluators.child import timing

    source = ASTSource(fn=timing.kernel_env_launch_cover, signature={"deadline_ptr": "*i64", "duration_ns": "i32"}, constexprs={})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": timing._COVER_WARPS}).asm["ptx"]
    swap, barrier, read = ptx.index("atom.global.acq_rel.gpu.cas.b64"), ptx.index("bar.sync"), ptx.index("ld.volatile.global.b64")
    assert swap < barrier < read
    assert ptx.count("%globaltimer") >= 2
    end_mark = ASTSource(fn=timing.kernel_env_end_mark, signature={"deadline_ptr": "*i64"}, constexprs={})
    assert timing.END_KERNEL in triton.compile(end_mark, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


def test_time_calls_reports_what_each_timing_is_made_of():
    details: dict = {}
    times, _ = time_calls(lambda x, y: torch.relu(x + y), _inputs, [1, 2, 3], torch.device("cpu"),
                          flush_bytes=1 << 20, details=details)
    for key in ("launch_us", "charged_ms", "tail_ms", "idle_tail_ms"):
        assert len(details[key]) == len(times), key
        assert all(value >= 0 for value in details[key]), key
    assert details["allowance_ms"] >= 0
    # A time is the call's own span plus the charge: never less than the charge.
    assert all(t >= c for t, c in zip(times, details["charged_ms"]))


def test_audited_calls_get_the_bench_at_their_secret_positions_on_inputs_of_their_own():
    from kernel_env.evaluators.child.timing import Bench

    seen = []

    def audit(inputs, bench):
        assert isinstance(bench, Bench)
        bench.ready(audited=True)  # the audit readies the device itself, under whatever it watches with
        seen.append(float(inputs[0][0]))

    timed = []
    time_calls(lambda x, y: timed.append(float(x[0])) or torch.relu(x + y), _inputs, [1, 2, 3, 4], torch.device("cpu"),
               flush_bytes=1 << 20, audit=audit, audit_at=[1, 3])
    assert len(seen) == 2 and len(timed) == 4
    assert not set(seen) & set(timed)  # fresh inputs, not a repeat of a timed call's


def test_work_outside_the_call_is_read_against_the_marks_placed_by_the_harness_kernels():
    from kernel_env.evaluators.child.guards import outside_the_call_ns

    names = ("kernel_env_launch_cover", "kernel_env_end_mark")
    # (name, start, end, correlation id: the launch order); the harness launches the flush, the cover,
    # then the call runs, then the harness launches the end mark.
    flush = ("flush", -90_000, -10_000, 10)         # the harness's, before the cover: not the call's
    cover = (names[0], 0, 200_000, 11)              # the start mark is reached as it ends

    def end(at, launch=99):
        return (names[1], at, at + 500, launch)

    honest = [flush, cover, ("relu", 201_000, 209_000, 12), end(210_000)]
    assert outside_the_call_ns(honest, *names) == (-1_000, -1_000, 2)      # inside both marks
    joined = [cover, ("relu on a joined stream", 205_000, 260_000, 12), end(261_000)]
    assert outside_the_call_ns(joined, *names)[1] < 0                      # the end mark waited for the join
    unjoined = [cover, end(201_000), ("relu on a side stream", 201_000, 209_000, 12)]
    assert outside_the_call_ns(unjoined, *names) == (-1_000, 8_000, 2)     # 8 us after the end mark
    beside_the_tail = [cover, ("relu on a stream that does not wait", 195_000, 201_000, 12), end(201_000)]
    assert outside_the_call_ns(beside_the_tail, *names)[0] == 5_000        # 5 us before the start mark
    # A device busy with another process: the side stream's work ran before the cover even started.
    before_the_cover = [flush, ("relu on a side stream", -8_000, -1_000, 12), cover, end(201_000)]
    assert outside_the_call_ns(before_the_cover, *names)[0] == 208_000
    # The device shared with another process: its work ran between the cover and the start mark
    # and between the end mark and the kernel after it; the call's own work is still inside.
    time_sliced = [cover, ("relu", 1_400_000, 1_409_000, 12), end(2_600_000)]
    assert outside_the_call_ns(time_sliced, *names) == (-1_200_000, -1_191_000, 2)
    assert outside_the_call_ns([flush, cover, end(201_000)], *names) == (None, None, 2)  # nothing of the call ran
    # A record without correlation ids: the call's work is what ends after the cover starts.
    unnumbered = [(n, a, b, 0) for n, a, b, _ in [flush, cover, ("relu", 201_000, 209_000, 0), end(210_000)]]
    assert outside_the_call_ns(unnumbered, *names) == (-1_000, -1_000, 2)
    # Without either kernel, or with a second one of a name, the marks cannot be placed.
    assert outside_the_call_ns([("relu", 0, 10, 1)], *names) == (None, None, 0)
    assert outside_the_call_ns([cover, ("relu", 201_000, 209_000, 12)], *names) == (None, None, 1)
    assert outside_the_call_ns([cover, end(201_000), end(500_000)], *names) == (None, None, 3)


