"""The trusted evaluation on a real GPU: the seed orchestrator's four turns, side-stream work (joined
back: honest; left running: timed or judged wrong by the judge, whatever the worker says), an attack
on the judge's clock, a forward that waits on the host, a CUDA C++ extension, reward 3 on
diag(A) @ B, a patched timer, and the judge's time of a kernel against Triton's do_bench."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from kernel_env.evaluators import floor, harness
from kernel_env.evaluators.child.compare import compare_outputs
from kernel_env.evaluators.records import Mode
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


@pytest.mark.parametrize(("task", "solution"), [(RELU_ADD, "side_stream"), (RELU_ADD, "side_stream_no_wait"),
                                                (RELU_ADD_1M, "side_stream_no_wait")],
                         ids=["side_stream-64M", "side_stream_no_wait-64M", "side_stream_no_wait-1M"])
def test_side_stream_work_left_running_after_forward_returns_is_timed_or_wrong(pool, tmp_path, task, solution):
    """A kernel on a stream never joined back runs on after the worker says its call is done; one that
    does not wait for the current stream starts before the call's inputs are there. The judge reads the
    outputs once the worker's default stream is through: what it reads is either all there, and the
    work before it is in the time, or it is not, and the output is wrong. Never correct and fast.
    (Not the unjoined stream at 1M: its ~3 us kernel is within the noise of the judge's round trip,
    docs/performance.md, so "timed whole" cannot be told from "fast" there.)"""
    fused = _evaluate(pool, task, _triton_solution(tmp_path, "turn4_fused"), mode=Mode.PROFILE)
    result = _evaluate(pool, task, _triton_solution(tmp_path, solution), mode=Mode.PROFILE)
    assert fused.correct, fused.summary()
    if result.correct:
        assert result.runtime_ms >= 0.8 * fused.runtime_ms, (result.runtime_ms, fused.runtime_ms)
    else:
        assert result.reward == -1 and result.fault == "candidate", result.summary()


def test_a_side_stream_joined_back_is_honest_and_timed_whole(pool, tmp_path):
    fused = _evaluate(pool, RELU_ADD, _triton_solution(tmp_path, "turn4_fused"))
    joined = _evaluate(pool, RELU_ADD, _triton_solution(tmp_path, "side_stream_joined"))
    assert fused.correct and joined.correct and not joined.violations, joined.summary()
    assert joined.runtime_ms >= 0.8 * fused.runtime_ms, (joined.runtime_ms, fused.runtime_ms)


@pytest.mark.parametrize("solution", ["early_done", "early_done_before_start"])
def test_saying_done_before_the_work_buys_no_time(pool, tmp_path, monkeypatch, solution):
    """The worker's own done word written before any work (after the call's start, or before it), the
    output computed on a side stream after a millisecond's spin: wrong, or timed with the spin in it
    (the source rules are off: the clock alone)."""
    monkeypatch.setattr(harness, "check_sources", lambda snapshot: [])
    result = _evaluate(pool, RELU_ADD_1M, _triton_solution(tmp_path, solution), mode=Mode.PROFILE)
    if result.correct:
        assert result.runtime_ms >= 0.5, result.summary()  # the ~1 ms spin was timed
    else:
        assert result.reward == -1 and result.fault == "candidate", result.summary()


def test_a_forward_that_waits_on_the_host_is_correct_and_timed(pool, tmp_path):
    """A forward that reads an input back on the host cannot queue its call before the call starts: the
    judge opens the gate without it (after ``judge._HOST_WAIT_S``) and times the host's share too."""
    fused = _evaluate(pool, RELU_ADD_1M, _triton_solution(tmp_path, "turn4_fused"), mode=Mode.PROFILE)
    synced = _evaluate(pool, RELU_ADD_1M, _triton_solution(tmp_path, "host_sync"), mode=Mode.PROFILE)
    assert synced.correct and not synced.violations, synced.summary()
    assert synced.runtime_ms >= fused.runtime_ms, (synced.runtime_ms, fused.runtime_ms)


def test_a_slow_first_forward_runs_in_the_load_and_no_call_holds_it(pool, tmp_path):
    """A first forward that takes seconds (a Triton autotuner, a large kernel's compile: here a 2 s
    sleep) is made in the worker's load, on inputs of its own (``worker.Worker._first_forward``):
    each of the judge's calls holds its calls lock, which every other job's timing run waits for, so
    no call may carry it. The candidate is judged as ever, on the judge's trials."""
    spec = importlib.util.spec_from_file_location("slow_first_forward", SOLUTIONS / "slow_first_forward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    first_forward_s = module.FIRST_FORWARD_S
    result = _evaluate(pool, RELU_ADD_1M, _triton_solution(tmp_path, "slow_first_forward"), mode=Mode.VERIFY)
    assert result.correct and not result.violations, result.summary()
    assert result.steps_s["worker: Load"] >= first_forward_s, result.steps_s
    assert result.steps_s["candidate: trials"] < first_forward_s, result.steps_s


def test_the_judges_time_of_a_kernel_is_near_do_bench(pool, tmp_path):
    """The fused relu(x + y) at 64M elements (~0.2 ms, bound by memory): eager's own time plus the
    candidate's calls less the yardstick's through the same worker, within 15 % of Triton's do_bench
    of the same kernel in one process."""
    import triton

    result = _evaluate(pool, RELU_ADD, _triton_solution(tmp_path, "turn4_fused"), mode=Mode.PROFILE)
    assert result.correct and result.runtime.method == "relative" and result.runtime.yardstick_raw_ms, result.summary()
    spec = importlib.util.spec_from_file_location("fused", SOLUTIONS / "turn4_fused.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x, y = torch.randn(1 << 26, device="cuda:0"), torch.randn(1 << 26, device="cuda:0")
    model = module.ModelNew()
    bench_ms = triton.testing.do_bench(lambda: model(x, y), return_mode="median")
    assert 0.85 * bench_ms <= result.runtime_ms <= 1.15 * bench_ms, (result.runtime_ms, bench_ms, result.runtime)
    # A kernel at the device's memory speed, and above its physical floor (768 MiB a call, at the most
    # the device was measured to move, times 1.5): the floor is real, and holds no honest kernel back.
    measured = floor.BandwidthCache(pool.baselines.directory).get(result.device_name)
    assert measured and measured > 2e8, measured  # bytes per millisecond: 0.2 TB/s at least, on any data-centre GPU
    assert result.physical_floor_ms == pytest.approx(3 * (1 << 26) * 4 / (measured * floor.SLACK)), result.summary()
    assert result.physical_floor_ms < result.runtime_ms, (result.physical_floor_ms, result.runtime)
    print(f"bandwidth {measured / 1e6:.0f} GB/s; floor {result.physical_floor_ms:.4f} ms; runtime {result.runtime_ms:.4f} ms")


def test_a_judge_holds_its_calls_lock_through_each_call_so_no_timing_run_freezes_it_inside_one(pool, tmp_path):
    """The judge holds its calls lock from a call's ``Go`` to its worker's ``Settled`` (judge.py): a
    process frozen inside a call would leave its stream waiting on the device, which slows every call
    of the timing run beside it (docs/design.md, Jobs sharing a device). Polled as another job's timing
    run would pause it while a profile runs, the lock is found held and free by turns, and the job is
    judged as ever."""
    lease = pool.leases.get("cuda:0")
    if lease is None:
        pytest.skip("the pool runs one job per GPU (KERNEL_ENV_JOBS_PER_GPU=1)")
    held = free = 0
    with ThreadPoolExecutor(1) as jobs:
        future = jobs.submit(_evaluate, pool, RELU_ADD_1M, _triton_solution(tmp_path, "turn4_fused"), mode=Mode.PROFILE)
        while not future.done():
            for child in [c for c in list(lease._children) if c.role == "judge"]:
                if child.pause_calls():
                    free += 1
                    child.resume_calls()
                else:
                    held += 1
            time.sleep(0.0005)
        result = future.result()
    assert result.correct and not result.violations and result.runtime_ms, result.summary()
    assert held > 0 and free > 0, (held, free)


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


def test_an_honest_kernel_is_correct_when_the_judge_keeps_the_reference_in_host_memory(pool, tmp_path):
    """With the device short of memory when the trials run (another process holds all but 20 % of
    it), the judge keeps the trials' reference outputs in host memory; the candidate's stay on the
    device. Under load on KernelBench the comparison across the two raised in the judge, and honest
    candidates were paid -1."""
    hog = subprocess.Popen([sys.executable, "-c", HOLD_ALL_BUT_A_FIFTH], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout.readline().strip() == "holding", "the memory holder did not start"
        result = _evaluate(pool, RELU_ADD, _triton_solution(tmp_path, "turn4_fused"), mode=Mode.PROFILE)
    finally:
        hog.communicate("", timeout=60)
    assert result.correct and result.error is None and result.runtime_ms, result.summary()


def test_a_task_whose_calls_take_a_fifth_of_the_device_is_judged_alone_and_correct(pool, tmp_path):
    """KernelBench's level-1 elementwise problems, sized for an 80 GB H100, take 6.4 GB a tensor. The
    judge kept their trials' outputs on the device while a quarter of it stayed free, and torch kept
    what the trials had used: run alone on an H100, the candidate's call found no memory left (an
    honest ReLU paid -1; five more problems evaluator faults). Here each tensor is 6 % of this
    device, whichever it is."""
    element_count = torch.cuda.mem_get_info()[1] * 6 // 100 // 4
    task = Task(id="example/relu_add_6pct", source="example",
                code=resolve_task("example/relu_add").code.replace("N = 1 << 24", f"N = {element_count}"))
    result = _evaluate(pool, task, _triton_solution(tmp_path, "relu_add_int64"), mode=Mode.PROFILE)
    assert result.correct and result.error is None and result.runtime_ms, result.summary()


def test_the_compare_brings_a_host_reference_to_the_candidates_device():
    ref = torch.randn(3, 1000)
    cand = ref.cuda()
    assert compare_outputs(0, ref, cand, 1e-2, 1e-2).correct
    cand[2, 7] += 1
    report = compare_outputs(0, ref, cand, 1e-2, 1e-2)
    assert not report.correct and report.first_bad_index == [2, 7]


HOLD_ALL_BUT_A_FIFTH = """
import sys, torch
free, total = torch.cuda.mem_get_info()
held = torch.empty(max(free - total // 5, 0), dtype=torch.uint8, device="cuda")
print("holding", flush=True)
sys.stdin.read()
"""


def test_diag_matmul_row_scaling_reaches_reward_3(pool, tmp_path):
    task = Task(id="kernelbench/L1/12", code=(SOLUTIONS / "diag_matmul_task.py").read_text(), source="kernelbench", level=1)
    result = _evaluate(pool, task, _triton_solution(tmp_path, "diag_matmul_rowscale"))
    assert result.correct and result.reward == 3, result.summary()
    # Established, not a close call: the speed-up clears the margin by more than the measurement's error.
    assert not result.close_calls, result.summary()


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
    """Audited calls of the timing run meet the device as timed calls do (each queued behind the wait for
    its start), so a candidate that uses torch whenever the stream is busy is audited doing it."""
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


def test_the_fork_server_never_initialises_cuda_and_its_children_use_the_gpu():
    """The fork server imported torch and Triton, yet holds no GPU device open (CUDA's initialisation
    opens them, and a process forked after it cannot use the device); a spare forked from it makes its
    context and runs the task on the GPU."""
    import os
    import time

    from kernel_env.evaluators.child.protocol import Setup, SetupAnswer
    from kernel_env.evaluators.children import Child
    from kernel_env.evaluators.forkserver import zygote_for

    env = {"CUDA_VISIBLE_DEVICES": "0"}
    server = zygote_for(env, gpu=True)
    if not server.isolated:
        pytest.skip("the fork server runs in a bubblewrap sandbox (its pid namespace found through it) only where "
                    "bwrap works: tests/gpu/device_env.sh unpacks a carried .deb")
    child = Child.spawn("judge", env=env, gpu=True, label="test-gpu", preload=True)
    try:
        started = time.monotonic()
        setup = child.call(Setup(device="cuda:0", out_dir=child.path("/job/ref"), task_code=resolve_task("example/relu_add").code),
                           SetupAnswer, 300)
        ready_s = time.monotonic() - started
        assert "H100" in setup.device_name or "H200" in setup.device_name or setup.device_name, setup
        assert ready_s < 20, f"a spare took {ready_s:.1f} s to be ready"
        servers = [int(pid) for pid in Path(f"/proc/{server._namespace.pid}/task/{server._namespace.pid}/children")
                   .read_text().split()]
        assert servers, "the fork server's process was not found"
        for pid in servers:
            held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            assert not any(path.startswith("/dev/nvidia") for path in held), held
    finally:
        child.discard()


_SLOW_HOST_TIMING = r"""
import sys, time, torch
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import reference

class Model(torch.nn.Module):
    def forward(self, x):
        y = x + 1
        time.sleep(0.002)  # a slow host between two launches (a compiled model's guards, a loaded machine)
        return torch.relu(y)

task = {"Model": Model, "get_init_inputs": lambda: [], "get_inputs": lambda: [torch.randn(1 << 16, device="cuda")]}
ref = reference.Reference(torch.device("cuda:0"), task, Path(sys.argv[2]))
ref.init(0)
ref._measure_clock()
ref._cycles_per_s /= 8  # as if measured while the device idled at a low clock: every spin an eighth as long
times = ref.time(calls=20, warmup=3, flush_bytes=1 << 20)["eager"]
print(sorted(times)[len(times) // 2], id(ref.model) in ref._host_bound)
"""


def test_the_judges_own_timing_is_the_devices_however_slow_the_host_or_wrong_its_clock(tmp_path):
    """The judge times the baselines in its own process with the device spun ahead of each forward
    until the host has launched all of it (``reference.Reference.timed_call``). A spin measured short
    (a clock measured at an idle device's low speed) let a slow host's launch gaps into the time: the
    torch.compile baseline was timed 3.2x and 3.8x slow on two fresh H100 machines, and a kernel worth
    2 was paid 3 in every episode. Each call is checked to have been queued ahead of its start, and made
    again (the clock measured anew) where it was not: 2 ms of host sleep between two tiny kernels stays
    out of the time."""
    child = Path(harness.__file__).parent / "child"
    run = subprocess.run([sys.executable, "-c", _SLOW_HOST_TIMING, str(child), str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    median_ms, host_bound = run.stdout.split()
    assert float(median_ms) < 0.5 and host_bound == "False", run.stdout
