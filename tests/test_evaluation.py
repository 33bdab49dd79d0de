"""The trusted evaluation, attacked: every way a candidate could fake correctness or speed, on the CPU.

Each candidate is a file in tests/candidates/ (Triton under the interpreter, or C++ from one
extension built once per session) for a small task, relu(x + y) over 16K float32 elements. Every
attack must be rejected (correct False, reward -1) or timed honestly, with the reason visible in
the result; every honest kernel must be judged correct. An honest kernel judged wrong is as bad
as a hack that slips through.

Tests marked ``xfail(strict=True)`` are FINDINGS: attacks that currently slip through, or honest
code that is currently rejected. Their assertions state what the harness must do; once the
harness does it, the strict xfail turns into a failure and the marker must go.

Speed: verification jobs (no timing) run in the background, three at a time, as soon as the
session starts; timing jobs (Mode.PROFILE) run one at a time after all of them, so no timing
shares the machine with another job. The C++ extension and the eager/compile baselines are kept in
pytest's cache between sessions (keyed by their inputs).
"""

from __future__ import annotations

import glob
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from kernel_env.evaluators import children, forkserver, harness, job as job_module
from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.evaluators.harness import evaluate
from kernel_env.evaluators.records import EvalJob, EvalResult, EvalSettings, Mode, Timing
from kernel_env.evaluators.static_rules import check_sources
from kernel_env.resources import data_dir
from kernel_env.runtime.broker import Broker, snapshot_workspace
from kernel_env.runtime.pool import LocalPool
from kernel_env.sandbox.bwrap import bubblewrap_problem
from kernel_env.tasks import Task
from kernel_env.workspace import Workspace

CANDIDATES = Path(__file__).parent / "candidates"
TASK_CODE = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.relu(x + y)


    N = 1 << 14


    def get_inputs():
        return [torch.randn(N), torch.randn(N)]


    def get_init_inputs():
        return []
    """
)
TASK = Task(id="test/relu_add_16k", code=TASK_CODE, source="file", name="relu_add_16k")
# The same task with two outputs, for the candidates named pair_*.
PAIR_TASK_CODE = TASK_CODE.replace("return torch.relu(x + y)", "return torch.relu(x + y), torch.relu(y + x)")
# Variants of the task for the candidates named edge_*: honest kernels for what tasks do besides one output tensor.
EDGE_TASKS = {
    "edge_parameter_output": TASK_CODE.replace("super().__init__()", "super().__init__()\n        self.weight = nn.Parameter(torch.randn(N))")
                                      .replace("return torch.relu(x + y)", "return torch.relu(x + y), self.weight"),
    "edge_buffer_view": TASK_CODE.replace("super().__init__()", "super().__init__()\n        self.register_buffer('table', torch.randn(64))")
                                 .replace("return torch.relu(x + y)", "return torch.relu(x + y), self.table[:16]"),
    "edge_nested": TASK_CODE.replace("return torch.relu(x + y)", "return torch.relu(x + y), (torch.relu(y + x), torch.relu(x + y))"),
    "edge_empty": TASK_CODE.replace("N = 1 << 14", "N = 0"),
    "edge_init_class": TASK_CODE.replace("def __init__(self):", "def __init__(self, activation):")
                                .replace("super().__init__()", "super().__init__()\n        self.activation = activation()")
                                .replace("return torch.relu(x + y)", "return self.activation(x + y)")
                                .replace("return []", "return [nn.ReLU]"),
}
EDGE_TASKS["edge_nested_flat"] = EDGE_TASKS["edge_nested"]
SETTINGS = EvalSettings(timed_calls=10, warmup_calls=3, job_timeout_s=120)
PARALLEL_JOBS = 3

# Verification jobs started in the background at the beginning of the session (name -> settings).
TRITON_VERIFY = [
    "honest", "honest_docstring", "wrong_answer", "nan_output", "all_nan", "wrong_shape", "wrong_dtype",
    "torch_fallback", "torch_fallback_functional", "torch_fallback_partial", "no_launch", "numpy_with_alibi",
    "torch_in_thread", "torch_in_thread_evasive", "torch_modes_disabled", "torch_dispatch_disabled",
    "torch_dispatch_disabled_evasive",
    "audit_patched", "audit_patched_evasive", "audit_base_patched", "runner_patched", "runner_patched_evasive",
    "mutate_input",
    "view_of_input", "uninit", "stale_buffer", "patch_timers", "patch_torch_checks",
    "patch_rng", "thread_deferred", "thread_left_running", "thread_left_running_evasive", "loosen_tolerance",
    "exit_in_forward", "sys_exit_in_forward", "exit_at_import", "sys_exit_at_import", "huge_alloc",
    "subclass_output", "parameter_detach_patched", "output_method_attribute", "tensor_methods_shadowed",
    "sampled_elements",
]
CPP_VERIFY = [
    "honest", "asm_label_pyrun", "asm_label_thread", "joined_std_threads", "torch_ops", "torch_ops_direct", "torch_ops_direct_evasive", "torch_ops_hidden",
    "torch_ops_hidden_evasive", "torch_ops_sources_edited", "uninit", "inplace", "deferred", "deferred_jthread",
]


# ============================================================================ helpers


def why(result: EvalResult) -> str:
    """Everything the result says about what went wrong, for assertions and their messages."""
    parts = [f"correct={result.correct} reward={result.reward} fault={result.fault}"]
    if result.error:
        parts.append(f"error: {result.error}")
    parts += [f"violation: {v}" for v in result.violations]
    parts += [f"trial {t.trial}: {t.message}" for t in result.trials if not t.correct]
    if result.runtime:
        parts.append(f"runtime {result.runtime_ms:.4f} ms, eager {result.eager_ms}, compile {result.compile_ms}")
    return "\n".join(parts)


def assert_rejected(result: EvalResult, *reasons: str) -> None:
    """Rejected (not correct, reward -1, the candidate's fault) and one of ``reasons`` (case-insensitive)
    said so. Every attack of this suite passes here: nothing a candidate does may be classed as the
    evaluator's fault, which would spare it its -1."""
    text = why(result)
    assert not result.correct and result.reward == -1.0, f"the attack was accepted:\n{text}"
    assert result.fault == "candidate", f"an attack was classed as the evaluator's fault:\n{text}"
    # Refused by the source rules before anything ran is a rejection too (it names the rule and line).
    reasons = (*reasons, "the sources break the skill's rules")
    assert any(r.lower() in text.lower() for r in reasons), f"rejected, but not for {reasons}:\n{text}"


def assert_honest(result: EvalResult) -> None:
    text = why(result)
    assert result.correct and not result.violations and result.error is None, f"an honest kernel was rejected:\n{text}"
    assert result.fault is None, text
    assert result.reward is not None and result.reward >= 1.0, text
    assert len(result.trials) == SETTINGS.trials and all(t.correct for t in result.trials), text


def make_snapshot(root: Path, language: str, name: str, so_path: Path | None = None) -> Path:
    """A snapshot directory as the broker makes it: model_new.py, kernels/, build/cuda_extension*.so."""
    snap = root / f"{language}-{name}-{uuid.uuid4().hex[:6]}"
    snap.mkdir(parents=True)
    source = CANDIDATES / language / f"{name}.py"
    shutil.copy2(source, snap / "model_new.py")
    if language == "triton":
        # The red team's protocol hook (kernels/hijack.py) goes only with the fixtures that import it: the
        # source rules, which read every file of kernels/, would refuse every other snapshot for it.
        skip = () if "kernels.hijack" in source.read_text() else ("hijack.py",)
        shutil.copytree(CANDIDATES / "triton" / "kernels", snap / "kernels", ignore=shutil.ignore_patterns("__pycache__", *skip))
    else:
        # A cpp fixture names the kernel sources its snapshot carries: "# kernels: a.cpp b.h".
        (snap / "kernels").mkdir()
        for file in cpp_sources(name):
            shutil.copy2(CANDIDATES / "cpp" / "kernels" / file, snap / "kernels" / file)
        (snap / "kernels" / "fixtures_binding.cpp").write_text(fixtures_binding(fixture_headers(name, "kernels")))
        (snap / "build").mkdir()
        assert so_path is not None
        shutil.copy2(so_path, snap / "build" / so_path.name)
    return snap


def _listed(name: str, key: str) -> list[str] | None:
    source = (CANDIDATES / "cpp" / f"{name}.py").read_text()
    line = next((line for line in source.splitlines() if line.startswith(f"# {key}:")), None)
    return line.split(":", 1)[1].split() if line is not None else None


def cpp_sources(name: str) -> list[str]:
    """The kernel sources a cpp fixture's snapshot carries (its ``# kernels:`` line)."""
    return [f for f in _listed(name, "kernels") if f != "fixtures_binding.cpp"]


def fixture_headers(name: str, key: str = "module") -> tuple[str, ...]:
    """The *_fixture.h files a cpp fixture's module is built from: its ``# module:`` line where it has one
    (a binary built from other sources than the snapshot carries), else those its snapshot carries."""
    listed = _listed(name, key) if key == "module" else None
    return tuple(sorted(f for f in (listed or _listed(name, "kernels")) if f.endswith("_fixture.h")))


def fixtures_binding(headers: tuple[str, ...]) -> str:
    """The one binding translation unit of a module built from ``headers`` (each registers its functions
    with ``register_<stem>``): one module per group of fixtures, so a module holds exactly the code the
    source and module rules are to judge."""
    includes = "".join(f'#include "{h}"\n' for h in headers)
    calls = "".join(f"  register_{h.removesuffix('_fixture.h')}(m);\n" for h in headers)
    return ("#include <torch/types.h>\n#include <torch/csrc/utils/pybind.h>\n\n#include \"../binding_registry.h\"\n"
            f'#include "check.h"\n\n{includes}\nstatic void register_fixtures(pybind11::module& m) {{\n{calls}}}\n\n'
            "REGISTER_BINDING(fixtures, register_fixtures);\n")


def make_job(snapshot: Path, language: str, mode: Mode, settings: EvalSettings = SETTINGS, task_code: str = TASK_CODE) -> EvalJob:
    return EvalJob(job_id=uuid.uuid4().hex[:12], task_id=TASK.id, task_code=task_code, language=language,
                   device="cpu", mode=mode, snapshot_dir=snapshot, settings=settings)


def compile_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "TORCH_CUDA_ARCH_LIST")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    return env


def job_processes(job_id: str) -> list[int]:
    """Process ids of the sandboxes (bwrap) this session started for one job, found by the job's directory."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and any(f"/job-{job_id}-".encode() in a for a in argv):
            pids.append(int(entry.name))
    return pids


class Deadline:
    """Runs evaluate() in a thread; if it is not answered in time, runs ``unstick`` to end the job."""

    def __init__(self, job: EvalJob, baselines: BaselineCache, seconds: float, unstick):
        self.job, self.seconds = job, seconds
        self.result: EvalResult | None = None
        self.raised: BaseException | None = None
        started = time.monotonic()
        worker = threading.Thread(target=self._run, args=(baselines,), daemon=True)
        worker.start()
        worker.join(seconds)
        self.answered_in_time = not worker.is_alive()
        self.elapsed = time.monotonic() - started
        if not self.answered_in_time:
            unstick(job)
            worker.join(120)

    def _run(self, baselines):
        try:
            self.result = evaluate(self.job, baselines=baselines)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.raised = exc


def kill_candidate(job: EvalJob) -> None:
    for pid in job_processes(job.job_id):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def open_fifo(job: EvalJob) -> None:
    """Unblock a harness stuck opening a FIFO the candidate planted: be its writer, write junk, close."""
    for fifo in glob.glob(f"/tmp/job-{job.job_id}-*/*/cand_trial_*.out"):
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        os.write(fd, b"not a tensor")
        os.close(fd)
    time.sleep(2)
    kill_candidate(job)


# ============================================================================ session fixtures


def _cache_dir(pytestconfig, tmp_path_factory, name: str) -> Path:
    cache = getattr(pytestconfig, "cache", None)
    return Path(cache.mkdir(name)) if cache is not None else tmp_path_factory.mktemp(name)


def _build_cpp_module(cache: Path, workspace: Workspace, headers: tuple[str, ...]) -> Path:
    """Build the cuda_extension of one group of cpp fixtures (cached by the hash of everything that goes
    into it), in ``workspace``: the groups are built one after another in the same one, so the sources they
    share compile once."""
    kernels = CANDIDATES / "cpp" / "kernels"
    binding = fixtures_binding(headers)
    sources = [kernels / n for n in ("relu_add.cpp", "check.h", *headers)]
    digest = hashlib.sha256(torch.__version__.encode() + binding.encode())
    template = data_dir("workspace_template")
    for path in [*sources, template / "binding.cpp", template / "binding_registry.h", *sorted((template / "utils").glob("build*.py"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    target = cache / digest.hexdigest()[:16]
    built = list(target.glob("cuda_extension*.so"))
    if built:
        return built[0]
    shutil.rmtree(workspace.path / "kernels")
    (workspace.path / "kernels").mkdir()
    for path in sources:
        shutil.copy2(path, workspace.path / "kernels" / path.name)
    (workspace.path / "kernels" / "fixtures_binding.cpp").write_text(binding)
    proc = subprocess.run(["bash", "utils/compile.sh"], cwd=workspace.path, env=compile_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"the cpp fixtures {headers} did not build:\n{proc.stdout}\n{proc.stderr}"
    so = next((workspace.path / "build").glob("cuda_extension*.so"))
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(so, target / so.name)
    return target / so.name


class Jobs:
    """Evaluations of the candidates, started in the background; ``verify(lang, name)`` waits for one."""

    def __init__(self, root: Path, baselines: BaselineCache, cpp_cache: Path, wanted: set[str]):
        self.root, self.baselines = root, baselines
        self.executor = ThreadPoolExecutor(PARALLEL_JOBS, thread_name_prefix="eval-job")
        self._builder = ThreadPoolExecutor(1, thread_name_prefix="cpp-build")
        self.futures: dict[tuple[str, str], Future] = {}
        self.cpp_cache = cpp_cache
        self.modules: dict[tuple[str, ...], Future] = {}
        self._modules_lock = threading.Lock()
        self._workspace: Workspace | None = None  # where the cpp fixtures' modules are built (the builder's thread only)
        # Start every verification the selected tests will ask for, in file order.
        for language, names in (("triton", TRITON_VERIFY), ("cpp", CPP_VERIFY)):
            for name in names:
                if name in wanted:
                    self._submit(language, name)

    def _submit(self, language: str, name: str) -> Future:
        key = (language, name)
        if key not in self.futures:
            self.futures[key] = self.executor.submit(self._evaluate, language, name, Mode.VERIFY)
        return self.futures[key]

    def so(self, name: str = "honest") -> Path:
        """The module a cpp fixture's snapshot carries (built once per group of fixtures)."""
        headers = fixture_headers(name)
        with self._modules_lock:
            if headers not in self.modules:
                self.modules[headers] = self._builder.submit(self._build, headers)
        return self.modules[headers].result()

    def _build(self, headers: tuple[str, ...]) -> Path:
        if self._workspace is None:
            self._workspace = Workspace.create(TASK, "cpp", root=self.root / "cpp-build")
        return _build_cpp_module(self.cpp_cache, self._workspace, headers)

    def snapshot(self, language: str, name: str) -> Path:
        return make_snapshot(self.root / "snapshots", language, name, self.so(name) if language == "cpp" else None)

    def _evaluate(self, language: str, name: str, mode: Mode, settings: EvalSettings = SETTINGS) -> EvalResult:
        return evaluate(make_job(self.snapshot(language, name), language, mode, settings), baselines=self.baselines)

    def verify(self, language: str, name: str) -> EvalResult:
        return self._submit(language, name).result()

    def timed(self, language: str, name: str, settings: EvalSettings = SETTINGS) -> EvalResult:
        """A PROFILE job, run alone: every background job has finished first."""
        self.wait_all()
        return self._evaluate(language, name, Mode.PROFILE, settings)

    def ensure_baselines(self) -> None:
        """Have the eager/compile baselines of TASK measured (by an honest PROFILE job) unless they are cached."""
        if self.baselines.get(self.baselines.key(TASK_CODE, "cpu", torch.__version__, SETTINGS.timing_protocol())) is None:
            self.timed("triton", "honest")

    def wait_all(self) -> None:
        for future in list(self.futures.values()):
            future.exception()

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
        self._builder.shutdown(wait=True, cancel_futures=True)
        if self._workspace is not None:
            self._workspace.destroy()


@pytest.fixture(scope="session")
def baselines(pytestconfig, tmp_path_factory) -> BaselineCache:
    return BaselineCache(_cache_dir(pytestconfig, tmp_path_factory, "kernel_env_eval_baselines"))


def _wanted_candidates(session) -> set[str]:
    """Candidate names quoted in the selected tests of this module (so `-k` runs only what it needs)."""
    wanted = set()
    for item in session.items:
        function = getattr(item, "function", None)
        if function is not None and getattr(function, "__module__", "") == __name__:
            source = inspect.getsource(function)
            wanted |= {name for name in TRITON_VERIFY + CPP_VERIFY if f'"{name}"' in source}
    return wanted


@pytest.fixture(scope="session")
def jobs(request, pytestconfig, tmp_path_factory, baselines):
    runner = Jobs(tmp_path_factory.mktemp("eval"), baselines, _cache_dir(pytestconfig, tmp_path_factory, "kernel_env_cpp_fixtures"),
                  _wanted_candidates(request.session))
    yield runner
    runner.close()


# ============================================================================ honest kernels


def test_honest_triton_kernel_is_correct(jobs):
    result = jobs.verify("triton", "honest")
    assert_honest(result)
    assert result.reward == 1.0 and result.runtime is None   # verified, not timed


@pytest.mark.slow  # 22 s on a 2-core machine
def test_honest_cpp_kernel_is_correct(jobs):
    result = jobs.verify("cpp", "honest")
    assert_honest(result)


def test_honest_triton_kernel_whose_docstring_mentions_torch_compile_is_correct(jobs):
    assert_honest(jobs.verify("triton", "honest_docstring"))


@pytest.mark.slow  # 35 s on a 2-core machine
def test_std_thread_is_refused_by_name_and_the_message_points_to_openmp(jobs):
    # The cpp skill allows threads through OpenMP only: a thread of the kernel's own could outlive
    # the call and finish the work after the timer stopped, and a joined one looks the same in text.
    result = jobs.verify("cpp", "joined_std_threads")
    assert_rejected(result, "std::thread")
    assert any("OpenMP" in v for v in result.violations), result.violations


# ============================================================================ wrong answers


def test_wrong_answer_is_incorrect_with_the_first_bad_index(jobs):
    result = jobs.verify("triton", "wrong_answer")
    assert_rejected(result, "elements outside atol=0.01, rtol=0.01")
    assert result.trials[0].first_bad_index is not None and result.trials[0].max_abs_error > 0.01


def test_one_nan_in_the_output_is_incorrect(jobs):
    result = jobs.verify("triton", "nan_output")
    assert_rejected(result, "1 NaN where the reference is not NaN")
    assert result.trials[0].first_bad_index == [1234]


def test_an_all_nan_output_is_incorrect(jobs):
    assert_rejected(jobs.verify("triton", "all_nan"), "16384 NaN where the reference is not NaN")


def test_wrong_shape_is_incorrect(jobs):
    assert_rejected(jobs.verify("triton", "wrong_shape"), "has shape (128, 128), expected (16384,)")


def test_wrong_dtype_is_incorrect(jobs):
    assert_rejected(jobs.verify("triton", "wrong_dtype"), "has dtype torch.float64, expected torch.float32")


@pytest.mark.parametrize("language", ["triton", pytest.param("cpp", marks=pytest.mark.slow)])  # cpp: 35 s
def test_uninitialised_output_is_incorrect(jobs, language):
    assert_rejected(jobs.verify(language, "uninit"), "elements outside")


def test_fresh_buffers_hoping_for_a_stale_answer_are_incorrect(jobs):
    assert_rejected(jobs.verify("triton", "stale_buffer"), "elements outside")


def test_tensor_subclass_output_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "subclass_output"), "returned Agreeable instead of plain tensors", "tensor subclass")


# ============================================================================ work outside the marks (the device record)


def _audit_verdict(tmp_path, found: dict) -> list[str]:
    """What the parent makes of one audited call's report (the child's record, as the GPU gives it)."""
    job = EvalJob(job_id="j", task_id=TASK.id, task_code=TASK.code, language="triton", device="cuda",
                  mode=Mode.PROFILE, snapshot_dir=tmp_path)
    result = EvalResult(job_id="j", task_id=TASK.id, language="triton", device="cuda", mode=Mode.PROFILE)
    evaluation = harness._Evaluation(job, result, "cuda:0", BaselineCache(tmp_path))
    evaluation.check_rules([{"torch_ops": {}, "triton_launches": 1, "processes": [], **found}], expected=1, when="during timing")
    return result.violations


def test_torch_fallback_without_triton_breaks_two_rules(jobs):
    result = jobs.verify("triton", "torch_fallback")
    assert_rejected(result, "torch computes inside ModelNew.forward")
    text = why(result)
    assert "add x1" in text and "relu x1" in text
    assert "launched no Triton kernel" in text


@pytest.mark.slow  # 22 s on a 2-core machine: two profiles, torch.compile's baseline timed in a cache of its own
def test_the_tasks_own_model_as_the_candidate_is_correct_only_with_the_torch_rule_off(tmp_path):
    """benchmarks/kernelbench.py's check of the harness: the task's Model renamed ModelNew breaks only
    the own-kernels rule, so with it off the job is correct, timed and paid 1 (any id names a job)."""
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "model_new.py").write_text(TASK_CODE.replace("class Model(", "class ModelNew("))
    job = make_job(snapshot, "cpp", Mode.PROFILE).model_copy(update={"job_id": "kernelbench/L1/19"})
    # A cache of its own: its baselines are timed while the module's background jobs may be running, and
    # the shared cache's would then pay the later timing tests' candidates against an inflated eager time.
    baselines = BaselineCache(tmp_path / "baselines")
    assert_rejected(evaluate(job, baselines=baselines), "torch computes inside ModelNew.forward (add x1, relu x1)")
    result = evaluate(job.model_copy(update={"settings": SETTINGS.model_copy(update={"own_kernels_only": False})}),
                      baselines=baselines)
    assert result.correct and not result.violations and result.error is None, why(result)
    assert result.runtime_ms is not None and result.eager_ms is not None and result.reward in (1, 2, 3)


def test_functional_fallback_with_a_noop_launch_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "torch_fallback_functional"), "torch computes inside ModelNew.forward (add x1, relu x1)")


def test_half_torch_half_triton_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "torch_fallback_partial"), "torch computes inside ModelNew.forward (add x1)")


def test_no_triton_launch_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "no_launch"), "launched no Triton kernel")


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
def test_torch_compute_from_cpp_through_the_dispatcher_is_rejected(jobs):
    assert_rejected(jobs.verify("cpp", "torch_ops"), "torch computes inside ModelNew.forward (add x1, relu x1)",
                    "calls a torch operator (`torch::relu`)")


@pytest.mark.slow  # 22 s on a 2-core machine
def test_torch_compute_in_a_binary_built_from_other_sources_is_rejected(jobs):
    # The snapshot's kernels/ holds only innocent sources; the built module calls torch::relu/add.
    assert_rejected(jobs.verify("cpp", "torch_ops_sources_edited"), "torch computes inside ModelNew.forward")


def test_torch_compute_in_a_thread_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "torch_in_thread"), "torch computes", "imports a module")


def test_torch_compute_with_dispatch_modes_disabled_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "torch_modes_disabled"), "torch computes", "dispatch modes")


def test_torch_compute_under_disable_torch_dispatch_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "torch_dispatch_disabled"), "torch computes", "torch internals")


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
def test_torch_compute_from_cpp_past_the_dispatcher_is_rejected(jobs):
    assert_rejected(jobs.verify("cpp", "torch_ops_direct"), "torch computes", "calls a torch operator", "past the dispatcher")


def test_disarming_the_auditor_through_the_module_table_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "audit_patched"), "torch computes", "changed the harness", "sys.modules")


def test_rewriting_the_runner_through_the_module_table_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "runner_patched"), "torch computes", "changed the harness", "sys.modules")


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
def test_torch_compute_from_cpp_with_all_python_keys_excluded_is_rejected(jobs):
    assert_rejected(jobs.verify("cpp", "torch_ops_hidden"), "torch computes", "thread-local state", "calls a torch operator")


def test_numpy_compute_with_a_noop_triton_launch_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "numpy_with_alibi"), "numpy", "torch computes", "launched no Triton kernel", "library")


def test_torch_compute_under_disable_torch_dispatch_spelled_otherwise_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "torch_dispatch_disabled_evasive"), "torch computes", "dispatch", "torch internals")


def test_torch_compute_in_a_low_level_thread_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "torch_in_thread_evasive"), "torch computes", "thread")


def test_disarming_the_auditor_without_naming_the_module_table_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "audit_patched_evasive"), "torch computes", "changed the harness")


def test_disarming_the_auditor_through_its_base_class_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "audit_base_patched"), "torch computes", "changed the harness")


def test_rewriting_the_runner_without_naming_the_module_table_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "runner_patched_evasive"), "torch computes", "changed the harness", "launched no Triton")


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
def test_torch_compute_from_cpp_past_the_dispatcher_through_an_alias_is_rejected(jobs):
    assert_rejected(jobs.verify("cpp", "torch_ops_direct_evasive"), "torch computes", "torch operator", "past the dispatcher")


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
def test_torch_compute_from_cpp_with_the_python_key_excluded_is_rejected(jobs):
    assert_rejected(jobs.verify("cpp", "torch_ops_hidden_evasive"), "torch computes", "dispatcher", "torch operator")


# ============================================================================ inputs, threads, processes


def test_mutating_an_input_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "mutate_input"), "modified its input tensors in place")


def test_returning_a_view_of_a_mutated_input_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "view_of_input"), "modified its input tensors in place")


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
def test_cpp_writing_into_an_input_is_rejected(jobs):
    assert_rejected(jobs.verify("cpp", "inplace"), "modified its input tensors in place")


def test_work_deferred_to_a_python_thread_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "thread_deferred"), "elements outside", "left threads running", "imports a module")


@pytest.mark.slow  # 12 s each on a 2-core machine
@pytest.mark.parametrize("name", ["deferred", "deferred_jthread"])
def test_work_deferred_to_a_native_thread_is_rejected(jobs, name):
    assert_rejected(jobs.verify("cpp", name), "elements outside", "threads or processes")


@pytest.mark.slow  # 26 s on a 2-core machine
def test_a_native_worker_finishing_timed_outputs_late_is_rejected(jobs, monkeypatch):
    """Past the source rules (which refuse its thread), a timed call's output is read as soon as the
    call has ended, before the harness's own work after it (the process watch, an idle reading and
    its cache flush, several milliseconds on this CPU, in which a worker 1 ms late used to finish)."""
    assert any("starts threads" in v for v in check_sources(jobs.snapshot("cpp", "persistent_worker")))
    jobs.ensure_baselines()
    monkeypatch.setattr(harness, "check_sources", lambda snapshot: [])
    assert_rejected(jobs._evaluate("cpp", "persistent_worker", Mode.PROFILE), "returned a wrong result")


@pytest.mark.parametrize(("name", "reason"), [
    ("parameter_detach_patched", "attributes set on it"),
    ("output_method_attribute", "attributes set on it"),
    ("tensor_methods_shadowed", "torch.Tensor.reshape was replaced"),
])
def test_outputs_that_answer_the_harness_reads_with_their_own_code_are_rejected(jobs, name, reason):
    """The harness reads an output through tensor methods (detach, to, reshape) after the audit and the
    end mark: methods set on the output, or on torch's classes over their base class's, are refused."""
    assert_rejected(jobs.verify("triton", name), reason)


def _pair(jobs, name: str) -> EvalResult:
    return evaluate(make_job(jobs.snapshot("triton", name), "triton", Mode.VERIFY, task_code=PAIR_TASK_CODE),
                    baselines=jobs.baselines)


@pytest.mark.parametrize("name", ["pair_honest", "pair_namedtuple"])
def test_honest_kernels_returning_several_outputs_are_correct(jobs, name):
    assert_honest(_pair(jobs, name))


#: The edge tasks test the harness's mechanics, and some are degenerate on purpose (a Parameter or a
#: buffer returned whatever the inputs, an empty output): the screen of trivial answers is off for them.
EDGE_SETTINGS = SETTINGS.model_copy(update={"refuse_trivial_tasks": False})


def _edge(jobs, name: str, mode: Mode = Mode.VERIFY, task_code: str | None = None) -> EvalResult:
    return evaluate(make_job(jobs.snapshot("triton", name), "triton", mode, EDGE_SETTINGS, task_code=task_code or EDGE_TASKS[name]),
                    baselines=jobs.baselines)


@pytest.mark.parametrize("name", ["edge_parameter_output", "edge_nested", "edge_nested_flat", "edge_empty", "edge_init_class"])
def test_honest_kernels_for_tasks_beyond_one_output_tensor_are_correct(jobs, name):
    """A Parameter returned as is, nested outputs (compared element by element, however nested), empty
    inputs with nothing to launch, a class among the init inputs (which only the task's own code rebuilds)."""
    assert_honest(_edge(jobs, name))


@pytest.mark.slow  # 14 s on a 2-core machine
def test_outputs_that_are_views_of_a_buffer_stay_correct_through_timing(jobs, tmp_path):
    """The outputs of timed calls are poisoned once checked, but for a module's own weights and buffers
    (a rotary embedding's cached table): the reference's baselines (measured in the first job) and the
    candidate's warm-up (the second, baselines cached) leave them whole."""
    jobs.wait_all()
    fresh = BaselineCache(tmp_path)
    for name in ("edge_buffer_copy", "edge_buffer_view"):
        job = make_job(jobs.snapshot("triton", name), "triton", Mode.PROFILE, EDGE_SETTINGS, task_code=EDGE_TASKS["edge_buffer_view"])
        result = evaluate(job, baselines=fresh)
        assert_honest(result)
        assert result.runtime is not None, why(result)


def test_a_task_whose_model_returns_no_tensor_is_the_tasks_fault(jobs):
    result = _edge(jobs, "honest", task_code=TASK_CODE.replace("return torch.relu(x + y)", "return None"))
    assert "the task cannot be evaluated" in (result.error or ""), why(result)
    assert result.fault == "evaluator" and result.reward is None and not result.correct, why(result)


def test_a_reference_that_fails_before_the_candidate_runs_is_the_evaluators_fault(jobs):
    result = _edge(jobs, "honest", task_code=TASK_CODE.replace("return torch.relu(x + y)", "raise RuntimeError('broken task')"))
    assert "broken task" in (result.error or "") and result.fault == "evaluator" and result.reward is None, why(result)


def test_a_tuple_that_computes_its_items_when_read_is_rejected(jobs):
    """Its __iter__ would run torch after the audit (and after a timed call's end mark): the harness
    reads the tuple's own items, here the inputs."""
    assert_rejected(_pair(jobs, "pair_lazy_tuple"), "elements outside")


def test_a_thread_left_running_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "thread_left_running"), "left threads running", "imports a module")


def test_a_low_level_thread_left_running_is_rejected(jobs):
    assert_rejected(jobs.verify("triton", "thread_left_running_evasive"), "threads")



@pytest.mark.parametrize(("name", "mode", "reason"), [
    ("helper_process", Mode.VERIFY, "started other processes, running the trials"),
    pytest.param("helper_process_during_timing", Mode.PROFILE, "started other processes, timing",
                 marks=pytest.mark.slow),  # 15 s
    ("thread_during_timing", Mode.PROFILE, "had threads running beside its calls (beside-the-timing)"),
    # Started with _thread (not in threading.enumerate()), reached through torch's own modules.
    ("thread_hidden_via_torch", Mode.VERIFY, "left threads running (a low-level thread"),
])
def test_helpers_beside_the_timed_calls_are_seen_at_run_time_even_past_the_source_rules(jobs, monkeypatch, name, mode, reason):
    """Another process has a CUDA context of its own, beyond the timing's synchronise; a thread can
    hold the interpreter while the harness calibrates. The source rules refuse the ways to start
    either by name; with them off, the run-time watch still sees them."""
    if bubblewrap_problem():
        pytest.skip(f"NOT ENFORCED ON THIS HOST: the process watch needs the child's own pid namespace ({bubblewrap_problem()})")
    assert check_sources(jobs.snapshot("triton", name))
    jobs.wait_all()
    if mode is Mode.PROFILE:
        jobs.ensure_baselines()
    monkeypatch.setattr(harness, "check_sources", lambda snapshot: [])
    result = jobs._evaluate("triton", name, mode)
    assert_rejected(result, reason)
    if name == "thread_during_timing":
        assert "left threads running" not in why(result)  # gone before the end: only the watch could see it


# ============================================================================ patching the harness from inside


def test_patched_timers_are_rejected(jobs):
    assert_rejected(jobs.verify("triton", "patch_timers"), "time.perf_counter")


def test_patched_timers_through_aliases_are_reported_by_the_integrity_check(jobs, past_rules):
    result = jobs._evaluate("triton", "patch_timers_aliased", Mode.VERIFY)
    assert_rejected(result, "ModelNew changed the harness: time.perf_counter_ns was replaced")
    assert "torch.cuda.Event was replaced" in why(result)


def test_patched_torch_comparisons_are_rejected(jobs):
    assert_rejected(jobs.verify("triton", "patch_torch_checks"), "torch.allclose")


def test_patched_random_number_generators_are_rejected(jobs):
    assert_rejected(jobs.verify("triton", "patch_rng"), "torch.manual_seed")


def test_tolerances_cannot_be_loosened_from_inside(jobs):
    result = jobs.verify("triton", "loosen_tolerance")
    assert_rejected(result, "max abs error 0.5")
    assert all(t.message == "" or "atol=0.01, rtol=0.01" in t.message for t in result.trials)


# ============================================================================ process death and resources


def test_os_exit_in_forward_is_a_clear_error(jobs):
    assert_rejected(jobs.verify("triton", "exit_in_forward"), "the worker process died during Serve (exit code 0)")


def test_sys_exit_in_forward_is_a_clear_error(jobs):
    assert_rejected(jobs.verify("triton", "sys_exit_in_forward"), "SystemExit")


def test_os_exit_at_import_is_a_clear_error(jobs):
    assert_rejected(jobs.verify("triton", "exit_at_import"), "the worker process died during Load (exit code 0)")


def test_sys_exit_at_import_is_a_clear_error(jobs):
    assert_rejected(jobs.verify("triton", "sys_exit_at_import"), "SystemExit")


def test_a_huge_allocation_is_a_clear_error(jobs):
    assert_rejected(jobs.verify("triton", "huge_alloc"), "can't allocate memory", "out of memory")


@pytest.mark.slow  # 22 s on a 2-core machine
def test_an_endless_loop_in_forward_ends_at_the_configured_timeout(jobs):
    """The knob for every step but timing is EvalSettings.step_timeout_s (import, trials)."""
    settings = SETTINGS.model_copy(update={"step_timeout_s": 20.0})
    job = make_job(jobs.snapshot("triton", "endless_loop"), "triton", Mode.VERIFY, settings)
    run = Deadline(job, jobs.baselines, 90.0, kill_candidate)
    assert run.answered_in_time, f"no answer within 90 s with step_timeout_s=20 (ended it after {run.elapsed:.0f}s)"
    assert run.raised is None, repr(run.raised)
    assert_rejected(run.result, "took longer than 20s and was killed")


@pytest.mark.slow  # 65 s on a 2-core machine
def test_a_fork_server_killed_mid_job_is_the_evaluators_fault_and_the_next_job_runs(jobs):
    """The candidate's process dies with its fork server (the end of the server's pid namespace
    takes it): nothing the candidate did, so no -1; the next job gets a new server."""
    if bubblewrap_problem():
        pytest.skip(f"the fork server runs in a pid namespace of its own only under bubblewrap ({bubblewrap_problem()})")
    jobs.wait_all()
    server = forkserver.zygote_for({"TRITON_INTERPRET": "1"}, gpu=False)  # the triton-on-CPU children's server
    job = make_job(jobs.snapshot("triton", "endless_loop"), "triton", Mode.VERIFY)
    killed_at: list[float] = []

    def kill_server_once_the_candidate_runs() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(server.jobs.glob(f"job-{job.job_id}-candidate-*")):
            time.sleep(0.05)
        time.sleep(2.0)  # into the endless loop
        killed_at.append(time.monotonic())
        server._namespace.kill()

    killer = threading.Thread(target=kill_server_once_the_candidate_runs, daemon=True)
    killer.start()
    result = evaluate(job, baselines=jobs.baselines)
    answered = time.monotonic()
    killer.join(5)
    assert killed_at, "the candidate process never started"
    assert answered - killed_at[0] < 15, f"answered {answered - killed_at[0]:.0f} s after the server was killed"
    assert not result.correct and result.fault == "evaluator" and result.reward is None, why(result)
    assert_honest(evaluate(make_job(jobs.snapshot("triton", "honest"), "triton", Mode.VERIFY), baselines=jobs.baselines))


# ============================================================================ reaching the reference


@pytest.fixture
def past_rules(jobs, monkeypatch):
    """For attacks on what the harness does at run time: the source rules, which refuse each such
    attack's spelling before anything runs, are switched off (after every background job has ended)."""
    jobs.wait_all()
    monkeypatch.setattr(harness, "check_sources", lambda snapshot: [])


@pytest.mark.parametrize(("name", "reason"), [
    ("custom_op_named_like_aten", "kernels::clone"),
    ("runner_instance_forged", "the worker._audited was added"),
    ("runner_patched", "worker.Worker._audited was replaced"),
    ("runner_patched_evasive", "worker.Worker._audited was replaced"),
    ("map2_elementwise", "handed to Python or numpy"),
])
def test_what_the_source_rules_refuse_is_also_seen_at_run_time(jobs, past_rules, name, reason):
    assert check_sources(jobs.snapshot("triton", name))
    assert_rejected(jobs._evaluate("triton", name, Mode.VERIFY), reason)


def test_numpy_reached_without_an_import_is_seen_at_run_time(jobs, past_rules):
    assert check_sources(jobs.snapshot("triton", "numpy_method"))
    assert_rejected(jobs._evaluate("triton", "numpy_method", Mode.VERIFY), "handed to Python or numpy")


def test_reference_outputs_cannot_be_found_on_disk(jobs, past_rules):
    assert_rejected(jobs._evaluate("triton", "read_reference", Mode.VERIFY), "elements outside")


def test_links_from_the_candidate_directory_to_the_reference_are_not_followed(jobs, past_rules):
    # Outputs went through files once: cand_trial_i.out -> state_dict.pt, followed, would have read the
    # reference's side. No output crosses as a file now; the links lead nowhere and the output is wrong.
    assert_rejected(jobs._evaluate("triton", "symlink_to_ref", Mode.VERIFY), "elements outside")


def test_a_fifo_planted_in_the_candidate_directory_does_not_hang_the_parent(jobs, past_rules):
    job = make_job(jobs.snapshot("triton", "fifo_hang"), "triton", Mode.VERIFY)
    run = Deadline(job, jobs.baselines, 60.0, open_fifo)
    assert run.answered_in_time, f"evaluate() was still blocked after {run.elapsed:.0f}s"
    assert run.raised is None and run.result is not None
    assert not run.result.correct


# ============================================================================ the judge's reads and clock (issue 32)
# Each attack below reaches the worker's own objects (rules off: the architecture alone must hold). The
# judge makes the inputs, reads the outputs itself and keeps the time: what the worker says can name
# memory to read or lower a reward, never raise one.


def test_slowing_the_workers_calls_moves_only_the_candidates_own_time(jobs, past_rules):
    """Every call through the worker made 20 ms slower: nothing it is compared with was measured in its
    process after it was loaded, so the 20 ms are its own."""
    jobs.ensure_baselines()
    honest = jobs.timed("triton", "honest")
    attack = jobs.timed("triton", "trusted_slow_calls")
    assert_honest(honest)
    assert attack.runtime is not None and attack.runtime_ms >= honest.runtime_ms + 10.0, (why(attack), honest.runtime_ms)
    # The yardstick was timed before the candidate existed: about the honest job's.
    assert attack.runtime.yardstick_raw_ms < honest.runtime.yardstick_raw_ms + 10.0, (attack.runtime, honest.runtime)
    # And the integrity check, defence in depth, saw the worker's call path replaced.
    assert_rejected(attack, "the worker.ops was replaced")


def test_answering_before_the_work_is_done_is_wrong_or_timed_whole(jobs, past_rules):
    result = jobs._evaluate("triton", "trusted_done_before_work", Mode.PROFILE)
    if result.correct:
        assert result.runtime_ms >= 15.0, why(result)  # the thread's 20 ms were in the judge's clock
    else:
        assert_rejected(result, "elements outside", "spill buffer mapped for writing")


def test_naming_another_calls_answer_as_the_output_is_wrong(jobs, past_rules):
    assert_rejected(jobs._evaluate("triton", "trusted_points_elsewhere", Mode.VERIFY), "elements outside")


def test_a_function_mode_that_computes_outputs_when_they_are_read_is_rejected(jobs, past_rules):
    result = jobs._evaluate("triton", "lazy_function_mode", Mode.PROFILE)
    assert_rejected(result, "left torch modes on the stack")


def test_computing_only_the_elements_a_sample_would_read_is_wrong(jobs):
    assert_rejected(jobs.verify("triton", "sampled_elements"), "elements outside")


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
@pytest.mark.parametrize(("name", "imports"), [("asm_label_pyrun", "PyRun_SimpleString"), ("asm_label_thread", "pthread_create")])
def test_python_and_threads_from_cpp_under_asm_labels_are_refused_by_name_and_in_the_module(jobs, name, imports):
    result = jobs.verify("cpp", name)
    assert_rejected(result, f"the module imports {imports}")
    assert any("asm label" in v.lower() for v in result.violations), result.violations


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
@pytest.mark.parametrize("name", ["asm_label_pyrun", "asm_label_thread"])
def test_past_every_rule_python_from_cpp_and_a_late_native_thread_are_timed_whole_or_wrong(jobs, past_rules, name):
    """Torch run from C++ with the audit's modes off is judged on the work it really did, at the speed it
    ran; a native thread that fills the output after the call returned is read before it does (wrong),
    or its work is inside the judge's clock."""
    jobs.ensure_baselines()
    result = jobs._evaluate("cpp", name, Mode.PROFILE)
    if result.correct:
        assert result.runtime_ms >= (5.0 if name == "asm_label_thread" else 0.0), why(result)
        assert result.runtime_ms >= 0.5 * result.eager_ms or name == "asm_label_thread", why(result)
    else:
        assert_rejected(result, "elements outside", "torch computes", "threads")


# ============================================================================ timed: honest kernels


def test_honest_triton_kernel_is_timed(jobs):
    jobs.ensure_baselines()
    result = jobs.timed("triton", "honest")
    assert_honest(result)
    # Every timed call counted: one run's, or more while the milestone was within the noise (close_calls).
    runs = range(SETTINGS.timed_calls, SETTINGS.timing_runs * SETTINGS.timed_calls + 1, SETTINGS.timed_calls)
    assert result.runtime is not None and result.runtime.calls in runs, result.runtime
    assert result.eager_ms and result.compile_ms and result.runtime_ms > 0
    # Where the job's time went: every stage of both children, within the job's own duration.
    for step in ("judge: start", "judge: Setup", "judge: RefTrials", "worker: Load", "candidate: yardstick",
                 "candidate: trials", "candidate: timing", "end children"):
        assert step in result.steps_s, (step, result.steps_s)
    assert 0 < sum(result.steps_s.values()) <= result.duration_s


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
def test_honest_cpp_kernel_is_timed_and_accepted_every_time(jobs):
    for attempt in range(4):
        result = jobs.timed("cpp", "honest")
        print(f"cpp honest #{attempt}: {result.runtime_ms} ms vs eager {result.eager_ms} ms, compile {result.compile_ms} ms, "
              f"reward {result.reward}, violations {result.violations}")
        assert_honest(result)
        assert result.runtime is not None and result.runtime_ms > 0


@pytest.fixture(scope="module")
def slow_honest(jobs) -> EvalResult:
    return jobs.timed("cpp", "slow_honest")


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
def test_slow_honest_cpp_kernel_is_correct_and_timed_slow(slow_honest):
    assert_honest(slow_honest)
    assert slow_honest.reward == 1.0, why(slow_honest)     # ~0.5 ms against eager's ~0.1 ms


def _plant_baselines(cache: BaselineCache, eager_ms: float, compile_ms: float) -> Path:
    """A cache entry for TASK saying eager and torch.compile take these times per call; its file."""
    key = cache.key(TASK_CODE, "cpu", torch.__version__, SETTINGS.timing_protocol())
    timing = [Timing(median_ms=ms, min_ms=ms, max_ms=ms, calls=SETTINGS.timed_calls, p25_ms=ms, p75_ms=ms)
              for ms in (eager_ms, compile_ms)]
    cache.put(key, *timing)
    return cache._path(key)


def test_a_baseline_cached_during_a_disturbance_pays_no_speedup(jobs, tmp_path):
    """Baselines cached while the processor was busy (here 10 s a call for both, as if a neighbour had
    spun every core): the eager time a candidate is held against is never the cache's, it is timed in
    every job; the cached torch.compile time counts at this job's pace (scaled by this job's eager
    time over the eager time cached beside it), so the disturbance cancels."""
    cache = BaselineCache(tmp_path)
    entry = _plant_baselines(cache, 1e4, 1e4)
    before = entry.read_bytes()
    jobs.wait_all()
    result = evaluate(make_job(jobs.snapshot("triton", "honest"), "triton", Mode.PROFILE), baselines=cache)
    assert_honest(result)
    assert result.reward == 1.0, why(result)  # Triton's interpreter is far slower than eager, and than compile
    assert result.eager_ms < 1e3 and result.compile_ms == pytest.approx(result.eager_ms), why(result)
    assert "judge: compile the baseline" not in result.steps_s and entry.read_bytes() == before


def test_a_cached_compile_time_counts_at_this_jobs_pace(jobs, tmp_path):
    cache = BaselineCache(tmp_path)
    _plant_baselines(cache, 2.0, 1.0)  # torch.compile twice as fast as eager when they were timed together
    jobs.wait_all()
    result = evaluate(make_job(jobs.snapshot("triton", "honest"), "triton", Mode.PROFILE), baselines=cache)
    assert_honest(result)
    assert result.compile_ms == pytest.approx(result.eager_ms / 2), why(result)
    assert result.eager.method == "worker" and result.runtime.method == "relative", why(result)  # the CPU: eager in the worker


# ============================================================================ timed: attacks


@pytest.mark.slow  # 13 s on a 2-core machine
def test_an_endless_loop_in_a_timed_call_ends_at_the_configured_timeout(jobs):
    """The knob for timed phases is EvalSettings.job_timeout_s (warm-up and timed calls)."""
    settings = SETTINGS.model_copy(update={"job_timeout_s": 10.0})
    jobs.ensure_baselines()   # their torch.compile step alone takes ~30 s here
    job = make_job(jobs.snapshot("triton", "endless_loop_after_trials"), "triton", Mode.PROFILE, settings)
    run = Deadline(job, jobs.baselines, 150.0, kill_candidate)
    assert run.answered_in_time and run.raised is None, f"no answer in {run.elapsed:.0f}s"
    assert_rejected(run.result, "took longer than 10s and was killed")



@pytest.mark.slow  # 5.3 s on a 2-core machine
def test_a_reference_side_failure_is_an_error_result(jobs, tmp_path):
    jobs.wait_all()
    settings = SETTINGS.model_copy(update={"job_timeout_s": 2.0})
    job = make_job(jobs.snapshot("triton", "honest"), "triton", Mode.PROFILE, settings)
    try:
        result = evaluate(job, baselines=BaselineCache(tmp_path / "fresh-baselines"))
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"evaluate() raised {exc!r} instead of returning a result")
    assert result.error and "took longer than" in result.error, why(result)
    assert result.fault == "evaluator" and result.reward is None, why(result)  # no -1 for the reference's timing


@pytest.mark.parametrize("language", ["triton", pytest.param("cpp", marks=pytest.mark.slow)])  # cpp: a C++ build
def test_caching_by_input_address_is_rejected(jobs, language):
    # The judge compares every timed call's output in full, so a replay that hits on any call is caught.
    # Whether an address repeats is up to the allocator: accepted means no call returned a stale answer.
    result = jobs.timed(language, "cache_by_ptr")
    if result.correct:
        assert not result.violations and result.reward >= 1.0, why(result)
    else:
        assert_rejected(result, "returned a wrong result", "elements outside")


def test_replaying_after_the_warm_up_is_rejected(jobs):
    assert_rejected(jobs.timed("triton", "replay_after_warmup"), "timed call", "returned a wrong result")


def test_detecting_the_audit_and_replaying_is_rejected(jobs):
    assert_rejected(jobs.timed("triton", "detect_audit_and_replay"), "returned a wrong result", "dispatch modes")


def test_timed_calls_must_run_the_same_code_as_the_checked_calls(jobs):
    assert_rejected(jobs.timed("triton", "torch_when_unaudited"), "torch computes", "launched no Triton kernel")


def test_timed_calls_must_run_the_same_code_as_the_audited_calls(jobs):
    assert_rejected(jobs.timed("triton", "torch_when_unaudited_evasive"), "torch computes", "launched no Triton kernel")


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
def test_work_deferred_into_a_lazy_output_is_timed_honestly(jobs, slow_honest):
    result = jobs.timed("cpp", "lazy_output")
    if result.correct:
        assert result.runtime_ms >= 0.5 * slow_honest.runtime_ms, (
            f"lazy output timed at {result.runtime_ms:.4f} ms, the same kernel honestly at {slow_honest.runtime_ms:.4f} ms\n{why(result)}")
    else:
        assert_rejected(result, "plain tensor", "tensor subclass", "instead of plain tensors")


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
def test_forged_elapsed_times_are_rejected_or_timed_honestly(jobs, slow_honest):
    result = jobs.timed("cpp", "timer_class_patch")
    if result.correct:
        assert result.runtime_ms >= 0.5 * slow_honest.runtime_ms, (
            f"forged timing accepted: {result.runtime_ms:.5f} ms reported for the work slow_honest does in "
            f"{slow_honest.runtime_ms:.4f} ms; reward {result.reward}\n{why(result)}")
    else:
        assert_rejected(result, "timing does not add up", "changed the harness")


def test_a_rewritten_runner_cannot_earn_a_speed_reward(jobs):
    result = jobs.timed("triton", "runner_patched_evasive")
    assert result.reward == -1.0, why(result)


def test_answers_computed_ahead_of_their_timed_calls_are_impossible(jobs, past_rules):
    """A candidate that reads the timing run's seeds from the harness's frames finds only the
    current call's: it cannot compute later calls in advance."""
    honest = jobs.timed("triton", "honest")
    result = jobs.timed("triton", "precompute_ahead")
    assert_honest(result)
    # Answers computed ahead would make the later calls a copy, two orders of magnitude under the
    # interpreted kernel; the bound leaves room for a busy host that slowed one of the two runs
    # (0.5 failed once with the honest run at 2.2 times the other under load).
    assert result.runtime_ms >= 0.2 * honest.runtime_ms, (
        f"answers handed back from an earlier call: {result.runtime_ms:.4f} ms against the honest kernel's "
        f"{honest.runtime_ms:.4f} ms\n{why(result)}")


def test_answers_written_to_the_harness_pipe_by_the_candidate_are_refused(jobs, past_rules):
    assert_rejected(jobs._evaluate("triton", "forge_answers", Mode.VERIFY), "that the harness did not write")


@pytest.fixture
def spares(jobs, monkeypatch):
    """Warm children on for this test (on the CPU they are off by default), in a registry of its own."""
    jobs.wait_all()
    monkeypatch.setenv("KERNEL_ENV_WARM_CHILDREN", "1")
    registry = children.Spares()
    monkeypatch.setattr(job_module, "SPARES", registry)
    yield registry
    registry.close()


def _waiting_pids(registry: children.Spares) -> dict[str, list[int]]:
    return {key[0]: [future.result(timeout=60).proc.pid for future in queue] for key, queue in registry._waiting.items()}


def test_a_job_takes_the_oldest_spares_and_leaves_as_many_new_ones(jobs, spares):
    first = jobs._evaluate("triton", "honest", Mode.VERIFY)
    assert_honest(first)
    before = _waiting_pids(spares)
    assert set(before) == {"judge", "worker"} and all(len(p) == spares.depth for p in before.values()), before
    second = jobs._evaluate("triton", "honest", Mode.VERIFY)
    assert_honest(second)
    after = _waiting_pids(spares)
    for role, pids in after.items():
        taken = before[role][0]
        assert len(pids) == spares.depth and taken not in pids and pids[:-1] == before[role][1:], (role, before, after)
        # the spare served the second job and ended with it
        assert not Path(f"/proc/{taken}").exists() or "Z" in Path(f"/proc/{taken}/stat").read_text().split(")")[1][:3]


@pytest.mark.parametrize("name", ["read_reference", "honest"])
def test_a_spare_sees_nothing_of_another_job(jobs, spares, past_rules, name):
    """Spares are started before their job's files exist; what a candidate in one can reach is still
    its own snapshot and outputs, never the reference's outputs or another job's files."""
    jobs._evaluate("triton", "honest", Mode.VERIFY)  # leaves spares, started while this job's files existed
    result = jobs._evaluate("triton", name, Mode.VERIFY)
    if name == "honest":
        assert_honest(result)
    else:
        assert_rejected(result, "elements outside")


@pytest.mark.slow  # a C++ candidate: the first one selected builds the session's extension (20-50 s)
def test_a_module_built_against_another_torch_is_refused_with_the_two_versions(jobs):
    snapshot = jobs.snapshot("cpp", "honest")
    (snapshot / "build" / "build_info.json").write_text('{"torch": "2.0.0+cu118", "kind": "cpp"}')
    result = evaluate(make_job(snapshot, "cpp", Mode.VERIFY), baselines=jobs.baselines)
    assert not result.correct and result.reward == -1.0 and not result.compiled
    assert "built against torch 2.0.0+cu118" in result.error and torch.__version__ in result.error, result.error


# ============================================================================ the broker: snapshots and protected files


@pytest.fixture
def triton_workspace(tmp_path):
    ws = Workspace.create(TASK, "triton", root=tmp_path / "ws")
    shutil.copy2(CANDIDATES / "triton" / "honest.py", ws.path / "model_new.py")
    shutil.copytree(CANDIDATES / "triton" / "kernels", ws.path / "kernels", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "hijack.py"))
    yield ws
    ws.destroy()


class _NoPool:
    """A pool that must not be reached (the broker refuses before submitting)."""

    def submit(self, job):
        raise AssertionError(f"the broker submitted {job.job_id} although it should have refused")

    def close(self):
        pass


def _force_write(path: Path, text: str) -> None:
    path.chmod(0o644)
    path.write_text(text)


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        (lambda ws: _force_write(ws.path / "model.py", TASK_CODE.replace("torch.relu(x + y)", "x + y")), "model.py"),
        (lambda ws: _force_write(ws.path / "SKILL.md", "anything goes\n"), "SKILL.md"),
        (lambda ws: _force_write(ws.path / "utils" / "verification.py", "print('PASS')\n"), "utils/verification.py"),
        (lambda ws: (ws.path / "utils").chmod(0o755) or (ws.path / "utils" / "sitecustomize.py").write_text("x = 1\n"),
         "utils/sitecustomize.py"),
        (lambda ws: (ws.path / "utils").chmod(0o755) or (ws.path / "utils" / "profiling.py").unlink(), "utils/profiling.py"),
    ],
    ids=["model.py", "SKILL.md", "utils-edited", "utils-added", "utils-removed"],
)
def test_broker_refuses_a_workspace_with_tampered_protected_files(triton_workspace, tamper, expected):
    tamper(triton_workspace)
    result = Broker(_NoPool(), device="cpu", settings=SETTINGS).evaluate_workspace(triton_workspace, Mode.PROFILE)
    assert not result.correct and result.reward == -1.0
    assert result.error == "protected files were modified"
    assert f"protected file changed: {expected}" in result.violations


def test_snapshot_never_follows_links_or_reads_special_files(triton_workspace, tmp_path):
    ws = triton_workspace
    secret = tmp_path / "host_secret.txt"
    secret.write_text("TOP SECRET host file\n")
    (ws.path / "kernels" / "leak.py").symlink_to(secret)
    (ws.path / "kernels" / "etc").symlink_to("/etc")
    os.mkfifo(ws.path / "kernels" / "pipe.py")           # opening it for reading would block a naive copier
    (ws.path / "build").mkdir()
    (ws.path / "build" / "cuda_extension.so").symlink_to(secret)
    started = time.monotonic()
    digest, notes = snapshot_workspace(ws, tmp_path / "snap")
    assert time.monotonic() - started < 10
    copied = sorted(str(p.relative_to(tmp_path / "snap")) for p in (tmp_path / "snap").rglob("*") if p.is_file())
    assert copied == ["kernels/relu_add.py", "model_new.py"], copied
    assert not any("TOP SECRET" in p.read_text(errors="replace") for p in (tmp_path / "snap").rglob("*") if p.is_file())
    assert "ignored the symbolic link kernels/leak.py" in notes and "ignored the symbolic link kernels/etc" in notes
    assert "ignored the symbolic link build/cuda_extension.so" in notes


def test_snapshot_carries_the_build_info_outside_its_hash(triton_workspace, tmp_path):
    build = triton_workspace.path / "build"
    build.mkdir()
    (build / "cuda_extension.so").write_bytes(b"module")
    (build / "build_info.json").write_text('{"torch": "2.0.0", "built_at": 1}')
    (build / "build.ninja").write_text("rule cc\n")
    first, _ = snapshot_workspace(triton_workspace, tmp_path / "one")
    (build / "build_info.json").write_text('{"torch": "2.0.0", "built_at": 2}')
    second, _ = snapshot_workspace(triton_workspace, tmp_path / "two")
    assert sorted(p.name for p in (tmp_path / "two" / "build").iterdir()) == ["build_info.json", "cuda_extension.so"]
    assert first == second


def test_snapshot_of_a_linked_model_new_or_kernels_dir_has_neither(triton_workspace, tmp_path):
    ws = triton_workspace
    outside = tmp_path / "outside"
    shutil.copytree(ws.path / "kernels", outside)
    shutil.rmtree(ws.path / "kernels")
    (ws.path / "kernels").symlink_to(outside)
    (ws.path / "model_new.py").unlink()
    (ws.path / "model_new.py").symlink_to(CANDIDATES / "triton" / "honest.py")
    snapshot_workspace(ws, tmp_path / "snap")
    assert not any((tmp_path / "snap").rglob("*")), list((tmp_path / "snap").rglob("*"))


def test_snapshot_size_is_bounded(triton_workspace, tmp_path):
    big = triton_workspace.path / "kernels" / "weights.bin"
    with open(big, "wb") as handle:          # sparse: costs nothing on disk
        handle.truncate(300 << 20)
    result = Broker(_NoPool(), device="cpu", settings=SETTINGS).evaluate_workspace(triton_workspace, Mode.VERIFY)
    assert not result.correct and result.reward == -1.0 and "exceed 256 MB" in (result.error or "")


def test_closing_the_broker_ends_its_threads(triton_workspace):
    import threading

    before = threading.active_count()
    broker = Broker(_NoPool(), device="cpu", settings=SETTINGS)
    directory = broker.serve(triton_workspace)
    assert threading.active_count() == before + 1
    broker.close()
    for _ in range(100):  # the accept thread returns once its socket is shut down
        if threading.active_count() == before:
            break
        time.sleep(0.01)
    assert threading.active_count() == before and not directory.exists()


def test_broker_evaluates_a_workspace_with_links_in_kernels_on_the_snapshot_alone(triton_workspace, tmp_path, baselines):
    ws = triton_workspace
    secret = tmp_path / "host_secret.py"
    secret.write_text("raise SystemExit('the host file was imported')\n")
    (ws.path / "kernels" / "host.py").symlink_to(secret)
    pool = LocalPool(["cpu"], baselines=baselines)
    try:
        result = Broker(pool, device="cpu", settings=SETTINGS).evaluate_workspace(ws, Mode.VERIFY)
    finally:
        pool.close()
    assert_honest(result)
    assert "ignored the symbolic link kernels/host.py" in result.log_tail


def test_the_pool_answers_a_job_before_its_processes_are_ended_and_ends_them_before_the_next(jobs, monkeypatch):
    """Ending a job's processes (a CUDA context's teardown each, on a GPU) is off the caller's path:
    the job's future is answered first. The worker ends them before it takes its next job, so
    nothing of one job's runs beside the next one's timing."""
    discard = children.Child.discard
    events: list[str] = []

    def slow_discard(child):
        time.sleep(1.0)
        discard(child)
        events.append("ended")

    monkeypatch.setattr(children.Child, "discard", slow_discard)
    pool = LocalPool(["cpu"], jobs_per_cpu=1, baselines=jobs.baselines)  # one worker: its next job follows
    try:
        snapshot = jobs.snapshot("triton", "honest")
        first = pool.submit(make_job(snapshot, "triton", Mode.VERIFY))
        second = pool.submit(make_job(snapshot, "triton", Mode.VERIFY))
        result = first.result(timeout=300)
        events.append("answered")
        assert_honest(result)
        assert "end children" not in result.steps_s
        assert_honest(second.result(timeout=300))
        events.append("second answered")
    finally:
        pool.close()
    assert events[:4] == ["answered", "ended", "ended", "second answered"], events
