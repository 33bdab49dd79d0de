"""The trusted evaluation on a real GPU: the seed orchestrator's four turns, side-stream work
(joined back: honest; left running: a violation the device record sees), a CUDA C++ extension,
reward 3 on diag(A) @ B, and a patched timer."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from kernel_env.evaluators.records import EvalSettings, Mode
from kernel_env.resources import example_dir
from kernel_env.runtime.episode import Episode, run_solution
from kernel_env.runtime.pool import SHORT_OF_MEMORY_STEP
from kernel_env.tasks import Task, resolve_task

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

HERE = Path(__file__).parent
SOLUTIONS = HERE / "solutions"

# The bundled example at 64M elements: large enough that a kernel's time, not Python's launch
# overhead (which the timed region includes, as in KernelBench), decides the speed-up.
RELU_ADD = Task(id="example/relu_add_64M", source="example",
                code=resolve_task("example/relu_add").code.replace("N = 1 << 24", "N = 1 << 26"))


def _triton_solution(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "model_new.py").write_text((SOLUTIONS / f"{name}.py").read_text())
    return directory


def _evaluate(pool, task: Task, solution: Path, language: str = "triton", mode: Mode = Mode.FINAL):
    build, result = run_solution(task, solution, language=language, device="cuda", pool=pool, mode=mode)
    return result


def test_seed_scenario_relu_add_in_four_turns(pool, tmp_path):
    with Episode.open(RELU_ADD, language="triton", device="cuda", pool=pool) as episode:
        turns = {}
        for turn in ("turn1_multiply", "turn2_out_of_bounds", "turn3_two_launches", "turn4_fused"):
            episode.workspace.copy_solution(_triton_solution(tmp_path, turn))
            turns[turn] = episode.evaluate(Mode.FINAL)

    first = turns["turn1_multiply"]
    assert not first.correct and first.error is None and first.reward == -1
    assert "elements outside" in first.trials[0].message

    second = turns["turn2_out_of_bounds"]
    assert not second.correct and second.reward == -1
    assert "illegal memory access" in second.error.lower() or "cuda error" in second.error.lower(), second.error

    third = turns["turn3_two_launches"]  # the job after the CUDA fault, on the same pool
    assert third.correct and third.error is None, (third.error, third.violations, third.trials)
    assert third.speedup_vs_compile < 1.0, third.summary()

    fourth = turns["turn4_fused"]
    assert fourth.correct, fourth
    assert fourth.speedup_vs_eager >= 1.0 and fourth.reward >= 2, fourth.summary()


RELU_ADD_1M = Task(id="example/relu_add_1M", source="example",
                  code=resolve_task("example/relu_add").code.replace("N = 1 << 24", "N = 1 << 20"))


@pytest.mark.parametrize("task", [RELU_ADD, RELU_ADD_1M], ids=["64M", "1M"])
@pytest.mark.parametrize("solution", ["side_stream", "side_stream_no_wait"])
def test_side_stream_work_left_running_after_forward_returns_is_a_violation(pool, tmp_path, task, solution):
    """A kernel on a stream never joined back to the current one runs on after the end mark, where
    only the host's clock saw it (and an 8.7 us kernel at 1M elements measured 1.3 us); one that does
    not wait for the current stream either starts beside the launch cover's tail, before the start
    mark. The device record of the audited calls sees both, on whatever stream: the skill's rule, enforced."""
    result = _evaluate(pool, task, _triton_solution(tmp_path, solution), mode=Mode.PROFILE)
    assert result.reward == -1, result.summary()
    assert any("on a stream not ordered with the current one" in v for v in result.violations), result.violations


def test_a_side_stream_joined_back_is_honest_and_timed_whole(pool, tmp_path):
    fused = _evaluate(pool, RELU_ADD, _triton_solution(tmp_path, "turn4_fused"))
    joined = _evaluate(pool, RELU_ADD, _triton_solution(tmp_path, "side_stream_joined"))
    assert fused.correct and joined.correct and not joined.violations, joined.summary()
    assert joined.runtime_ms >= 0.8 * fused.runtime_ms, (joined.runtime_ms, fused.runtime_ms)


def _audited_outside(bench, record, fn, events_late_us: list | None = None) -> float:
    """How far outside its marks, beyond the tolerances, one audited call of ``fn`` ran work
    (negative: within them), placed as the runner places them. ``events_late_us`` gets how far
    past the end the old placement (the cover's end plus the events' reading) put the call's work."""
    from kernel_env.evaluators.child.guards import (
        EARLY_WORK_TOLERANCE_US,
        LATE_WORK_TOLERANCE_US,
    )
    from kernel_env.evaluators.child.timing import COVER_KERNEL, END_KERNEL

    bench.marks.use_default_stream()
    with record:
        bench.ready(audited=True)
        start = bench.marks.mark()
        fn()
        end = bench.marks.mark()
        bench.audited_end()
        bench.marks.sync()
    found = record.outside()
    assert found["anchor_kernels"] == 2, found
    assert all(launch > 0 for *_, launch in record.records), record.records  # the launches' order is known
    if events_late_us is not None:
        (_, _, cover_end, cover_id), = [r for r in record.records if r[0] == COVER_KERNEL]
        work_end = max(e for name, _, e, launch in record.records if name not in (COVER_KERNEL, END_KERNEL) and launch > cover_id)
        events_late_us.append((work_end - cover_end) / 1e3 - bench.marks.elapsed_ms(start, end) * 1e3)
    return max(found["early_work_us"] - EARLY_WORK_TOLERANCE_US, found["late_work_us"] - LATE_WORK_TOLERANCE_US)


def _relu_add_calls(n: int):
    """(current, joined, left_running): the fused relu(x + y) kernel on the current stream, on a side
    stream ordered both ways, and on a side stream ordered neither way."""
    import triton

    spec = importlib.util.spec_from_file_location("fused", SOLUTIONS / "turn4_fused.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # Triton needs the kernel's source file
    kernel = module.kernel
    x, y = torch.randn(n, device="cuda:0"), torch.randn(n, device="cuda:0")
    side = torch.cuda.Stream()

    def launch(out):
        kernel[(triton.cdiv(n, 4096),)](x, y, out, n, BLOCK=4096, num_warps=8)
        return out

    def current():
        return launch(torch.empty_like(x))

    def joined():
        out = torch.empty_like(x)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            launch(out)
        torch.cuda.current_stream().wait_stream(side)
        return out

    def left_running():
        out = torch.empty_like(x)
        with torch.cuda.stream(side):
            launch(out)
        return out

    for fn in (current, joined, left_running):
        fn()
    torch.cuda.synchronize()
    return current, joined, left_running


def test_the_device_record_places_the_marks_and_sees_every_stream():
    """In-process, at 1M elements (a ~6 us kernel, the hardest case): an honest call, on the current
    stream or on a side stream ordered both ways, never reads past the tolerances; the same kernel on
    a side stream ordered neither way (it starts beside the cover's tail and outlasts the end mark)
    does in (nearly) every audited call."""
    import time

    from kernel_env.evaluators.child.guards import DeviceRecord
    from kernel_env.evaluators.child.timing import COVER_KERNEL, END_KERNEL, Bench

    current, joined, left_running = _relu_add_calls(1 << 20)
    bench = Bench(torch.device("cuda:0"), launch_cover_us=200)
    record = DeviceRecord(torch.device("cuda:0"), COVER_KERNEL, END_KERNEL)
    assert record.probe() is None

    def slow_host_then_current():  # a call that spends a second on the host first (a kernel compiling, say)
        time.sleep(1.0)
        return current()

    honest = [_audited_outside(bench, record, current) for _ in range(30)]
    honest += [_audited_outside(bench, record, joined) for _ in range(30)]
    honest += [_audited_outside(bench, record, slow_host_then_current) for _ in range(3)]
    caught = [_audited_outside(bench, record, left_running) for _ in range(30)]
    assert max(honest) <= 0, sorted(honest)[-5:]
    assert sum(value > 0 for value in caught) >= 27, sorted(caught)


_BUSY_NEIGHBOUR = """
import sys, time, torch
a = torch.randn(4096, 4096, device="cuda:0")
print("ready", flush=True)
until = time.monotonic() + float(sys.argv[1])
while time.monotonic() < until:
    for _ in range(20):
        a = torch.tanh(a @ a * 1e-3)
    torch.cuda.synchronize()
"""


def test_an_honest_audited_call_on_a_device_shared_with_another_process_is_not_a_violation():
    """Jobs share a GPU for their untimed steps, the audited trials among them: another process's
    kernels are time-sliced with the call's, and can run between the cover and the start mark or
    between the end mark and the kernel after it. An H100 pool running 128 episodes at 4 jobs per
    GPU judged 6-9 of them wrong so ("ran work on the device 187-2673 us after it returned") while
    the end was placed by the events' reading from the cover's end (on an H100 with this
    neighbour, 28 of 600 honest calls read late so). Both ends on the record's own clock hold;
    work left running on a side stream is still seen, even where it ran before the cover started."""
    import subprocess
    import sys

    from kernel_env.evaluators.child.guards import DeviceRecord
    from kernel_env.evaluators.child.timing import COVER_KERNEL, END_KERNEL, Bench

    current, joined, left_running = _relu_add_calls(1 << 20)
    bench = Bench(torch.device("cuda:0"), launch_cover_us=200)
    record = DeviceRecord(torch.device("cuda:0"), COVER_KERNEL, END_KERNEL)
    assert record.probe() is None
    neighbour = subprocess.Popen([sys.executable, "-c", _BUSY_NEIGHBOUR, "60"], stdout=subprocess.PIPE, text=True)
    try:
        assert neighbour.stdout.readline().strip() == "ready"
        events_late: list[float] = []
        honest = [_audited_outside(bench, record, fn, events_late) for _ in range(300) for fn in (current, joined)]
        caught = [_audited_outside(bench, record, left_running) for _ in range(30)]
        assert neighbour.poll() is None, "the neighbour ended before the calls did"
    finally:
        neighbour.kill()
        neighbour.wait()
    print(f"old placement: {sum(late > 2.0 for late in events_late)} of {len(events_late)} honest calls late, "
          f"max {max(events_late):.1f} us; new: max {max(honest):.1f} us beyond the tolerances")
    # The neighbour did time-slice into the calls: the old placement saw their work run late.
    assert sum(late > 2.0 for late in events_late) >= 1, sorted(events_late)[-5:]
    assert max(honest) <= 0, sorted(honest)[-5:]
    assert sum(value > 0 for value in caught) >= 27, sorted(caught)


def test_a_job_short_of_device_memory_beside_another_is_run_again_alone(pool, tmp_path):
    """Two honest candidates that each hold 55 % of the device's memory, evaluated at once on the
    shared pool: beside each other one of them runs out, and the pool runs it again with the GPU
    to itself rather than judging it wrong."""
    if pool.jobs_per_gpu < 2:
        pytest.skip("the pool runs one job per GPU (KERNEL_ENV_JOBS_PER_GPU=1)")
    solution = _triton_solution(tmp_path, "memory_hog")
    with ThreadPoolExecutor(2) as jobs:
        results = list(jobs.map(lambda _: _evaluate(pool, RELU_ADD_1M, solution, mode=Mode.PROFILE), range(2)))
    assert all(r.correct and r.error is None for r in results), [r.summary() for r in results]
    assert sum(SHORT_OF_MEMORY_STEP in r.steps_s for r in results) == 1, [r.steps_s for r in results]


def test_diag_matmul_row_scaling_reaches_reward_3(pool, tmp_path):
    task = Task(id="kernelbench/L1/12", code=(SOLUTIONS / "diag_matmul_task.py").read_text(), source="kernelbench", level=1)
    result = _evaluate(pool, task, _triton_solution(tmp_path, "diag_matmul_rowscale"))
    assert result.correct and result.reward == 3, result.summary()


def test_cuda_extension_example_builds_and_is_fast(pool):
    build, result = run_solution(resolve_task("example/relu_add"), example_dir("relu_add") / "solutions" / "cuda", language="cuda",
                                 device="cuda", pool=pool)
    assert build.ok, build.output
    assert result.correct and result.reward >= 2, result.summary()


def test_patched_cuda_event_timer_is_caught(pool, tmp_path):
    result = _evaluate(pool, RELU_ADD, _triton_solution(tmp_path, "patched_timer"), mode=Mode.PROFILE)
    assert result.reward == -1
    # Refused before it runs (the source rules see the setattr), or, if it ran, reported by the
    # integrity check; either way the forged timer never decides a number.
    assert any("setattr" in v or "torch.cuda.Event.elapsed_time was replaced" in v for v in result.violations), result.violations


def test_torch_fallback_in_cuda_forward_is_a_violation(pool, tmp_path):
    result = _evaluate(pool, RELU_ADD, _triton_solution(tmp_path, "torch_fallback"), mode=Mode.VERIFY)
    assert result.reward == -1
    assert any("torch computes" in v for v in result.violations), result.violations


def test_torch_in_calls_that_find_the_device_busy_is_caught(pool, tmp_path):
    """Audited calls of the timing run meet the device as timed calls do (the cover running), so
    a candidate that uses torch whenever the stream is busy is audited doing it."""
    result = _evaluate(pool, RELU_ADD_1M, _triton_solution(tmp_path, "busy_stream_detector"), mode=Mode.PROFILE)
    assert result.reward == -1, result.summary()
    assert any("torch computes" in v for v in result.violations), result.violations


def test_the_audit_sees_data_leave_the_gpu_but_not_a_size_read():
    from kernel_env.evaluators.child.guards import TorchComputeAudit

    x = torch.randn(1 << 16, device="cuda:0")
    audit = TorchComputeAudit()
    with audit:
        x[:4].cpu()                      # a few values for a launch configuration
        x.to("cuda:0", copy=True)        # stays on the device
    assert audit.forbidden == {}, audit.forbidden
    with audit:
        x.cpu()                          # the data, off to a host-side computation
    assert audit.forbidden == {"_to_copy from the GPU to the host": 1}, audit.forbidden


def _time_median_ms(fn, cover_us: float, calls: int = 20) -> float:
    import statistics

    from kernel_env.evaluators.child.timing import time_calls

    times, _ = time_calls(fn, lambda seed: [], range(calls), torch.device("cuda:0"), warmup_seeds=range(3),
                          launch_cover_us=cover_us)
    return statistics.median(times)


def test_launch_cover_hides_host_launch_time_up_to_its_length():
    """A call whose host side takes 300 us before its kernel launches: timed with that delay when
    nothing covers it, and as the kernel alone behind a 600 us launch cover."""
    import time

    x = torch.empty(1 << 26, device="cuda:0")  # 256 MB: one pass over it takes ~170 us on an H100

    def kernel():
        return x.mul_(0.5)

    def slow_host_then_kernel():
        deadline = time.perf_counter() + 300e-6
        while time.perf_counter() < deadline:
            pass
        return x.mul_(0.5)

    alone = _time_median_ms(kernel, 0.0)
    bare = _time_median_ms(slow_host_then_kernel, 0.0)
    covered = _time_median_ms(slow_host_then_kernel, 600.0)
    assert bare > alone + 0.2, (alone, bare)               # nothing hides the host's 300 us without a cover
    assert covered < alone * 1.1 + 0.01, (alone, covered)


def test_nothing_runs_beside_the_launch_cover():
    """Work launched on a stream of its own, that never waits for the timing stream, still starts
    only after the start mark: the cover holds every SM."""
    x = torch.empty(1 << 26, device="cuda:0")
    side = torch.cuda.Stream()

    def same_stream():
        return x.mul_(0.5)

    def side_stream():
        with torch.cuda.stream(side):
            return x.mul_(0.5)

    same = _time_median_ms(same_stream, 400.0)
    beside = _time_median_ms(side_stream, 400.0)
    assert beside >= 0.8 * same, (same, beside)


def test_the_fork_server_never_initialises_cuda_and_its_children_use_the_gpu():
    """The fork server imported torch and Triton and had its kernels compiled by a child, yet holds
    no GPU device open (CUDA's initialisation opens them, and a process forked after it cannot use
    the device); a spare forked from it makes its context, loads the harness's kernels from the
    copied cache without compiling them, and runs the task on the GPU."""
    import os
    import time

    from kernel_env.evaluators.children import Child
    from kernel_env.evaluators.forkserver import zygote_for

    env = {"CUDA_VISIBLE_DEVICES": "0"}
    server = zygote_for(env, gpu=True)
    if not server.isolated:
        pytest.skip("the fork server runs in a bubblewrap sandbox (its pid namespace found through it) only where "
                    "bwrap works: tests/gpu/device_env.sh unpacks a carried .deb")
    child = Child.spawn("reference", env=env, gpu=True, label="test-gpu", preload=True)
    try:
        started = time.monotonic()
        setup = child.call("setup", 300, device="cuda:0", out_dir=child.path("/job/ref"),
                           task_code=resolve_task("example/relu_add").code)[0]
        ready_s = time.monotonic() - started
        assert setup["ok"], setup
        cache = Path(f"/proc/{child.proc.pid}/root/tmp/home/.triton/cache")
        assert cache.is_dir() and any(cache.rglob("*.cubin")), "the child got no copy of the harness's kernels"
        assert ready_s < 20, f"a spare took {ready_s:.1f} s to be ready"
        servers = [int(pid) for pid in Path(f"/proc/{server._namespace.pid}/task/{server._namespace.pid}/children")
                   .read_text().split()]
        assert servers, "the fork server's process was not found"
        for pid in servers:
            held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            assert not any(path.startswith("/dev/nvidia") for path in held), held
    finally:
        child.discard()
