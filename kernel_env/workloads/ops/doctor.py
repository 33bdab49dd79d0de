"""What this machine has for kernel_env (GPU, compilers, sandbox, tools) and what that means.

``examine()`` probes the machine and returns ``Findings``: the facts (one typed record per
thing probed), plain sentences on what they mean for kernel_env, and the essentials that are
missing. The probes take seconds. ``examine(grade=True)`` (``kernel-env doctor --grade``) adds a
real grade: the bundled example's own solution, built in a sandbox and judged by the trusted
harness as any agent's would be (``run_solution``; the cuda solution on a GPU machine, the cpp one
on the CPU elsewhere), so a machine where grading is broken (a venv the evaluation children cannot
see, say) says so instead of passing every other check; it takes minutes on a CPU, so it is asked
for, not done by default. ``interpret(facts)`` is the reading on its own, a pure function, so what
a missing tool means can be checked without the machine lacking it. ``kernel-env doctor`` renders the
findings; ``Findings.to_record()`` is its ``--json`` output.

A probe never raises for what it finds: a tool that is absent, broken or slow to answer is a
fact (None, ``works=False`` and the problem), not an error. Probing runs commands only with
fixed arguments and never changes the machine (a trial cgroup is removed again).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Python:
    version: str
    executable: str
    ok: bool  # new enough (3.12)


@dataclass(frozen=True)
class Torch:
    version: str | None  # None: torch does not import
    cuda_build: str | None = None
    gpus: list[str] = field(default_factory=list)  # the GPUs torch sees
    error: str | None = None  # why torch does not import

    def to_record(self) -> dict[str, Any]:
        if self.version is None:
            return {"version": None, "error": self.error}
        return {"version": self.version, "cuda_build": self.cuda_build, "gpus": self.gpus}


@dataclass(frozen=True)
class Version:
    version: str | None  # None: not installed or does not answer


@dataclass(frozen=True)
class NvidiaSmi:
    present: bool
    gpus: list[str]  # "name, driver, memory" lines


@dataclass(frozen=True)
class Nvcc:
    path: str | None
    version: str | None


@dataclass(frozen=True)
class Bubblewrap:
    version: str | None
    works: bool
    problem: str | None  # why the local sandbox cannot isolate with it


@dataclass(frozen=True)
class CgroupFact:
    available: bool  # this process can create a cgroup for a sandbox
    version: str | None  # "v1" or "v2"


@dataclass(frozen=True)
class EvaluationChildren:
    works: bool  # a child of the trusted harness forks and answers
    isolated: bool | None
    problem: str | None


@dataclass(frozen=True)
class Grade:
    """The bundled example's solution, graded end to end (``example/relu_add``)."""

    language: str
    device: str
    correct: bool
    fault: str | None  # whose fault a wrong grade is ("candidate", "evaluator")
    error: str | None
    seconds: float


@dataclass(frozen=True)
class Docker:
    client: str | None
    engine: str | None  # the engine's version, where one answers


@dataclass(frozen=True)
class Facts:
    """One record per thing probed. ``to_record()`` keys them as ``kernel-env doctor --json`` does."""

    python: Python
    root: bool
    torch: Torch
    triton: Version
    nvidia_smi: NvidiaSmi
    nvcc: Nvcc
    bubblewrap: Bubblewrap
    cgroup: CgroupFact
    evaluation_children: EvaluationChildren
    ninja: Version
    gxx: Version
    ripgrep: Version
    docker: Docker
    grade: Grade | None = None  # None: not graded (``examine(grade=False)``)

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            key = "g++" if item.name == "gxx" else item.name
            record[key] = value.to_record() if isinstance(value, Torch) else (
                dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value)
        return record


@dataclass(frozen=True)
class Findings:
    facts: Facts
    meaning: list[str]  # plain sentences on what the facts mean for kernel_env
    missing: list[str]  # essentials kernel_env cannot work without

    @property
    def ok(self) -> bool:
        return not self.missing

    def to_record(self) -> dict[str, Any]:
        return {"ok": self.ok, "facts": self.facts.to_record(), "meaning": self.meaning, "missing": self.missing}


def examine(*, grade: bool = False) -> Findings:
    """Probe this machine and read the facts: a few seconds (it forks an evaluation child), and
    with ``grade`` the bundled example graded end to end too (a minute or more on a CPU)."""
    facts = gather_facts()
    if grade:
        facts = dataclasses.replace(facts, grade=grade_example(facts))
    meaning, missing = interpret(facts)
    return Findings(facts=facts, meaning=meaning, missing=missing)


# ----------------------------------------------------------------------------- the probes


def gather_facts() -> Facts:
    from kernel_env.sandbox.limits import Cgroup, Limits
    from kernel_env.sandbox.local import bubblewrap_problem

    try:
        import torch

        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
        torch_fact = Torch(version=torch.__version__, cuda_build=torch.version.cuda, gpus=gpus)
    except Exception as exc:  # noqa: BLE001 (a broken torch install is a finding, not a crash)
        torch_fact = Torch(version=None, error=f"{type(exc).__name__}: {exc}")

    smi = run_quiet(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    nvcc = shutil.which("nvcc") or next((p for p in (os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "nvcc"),
                                                     "/usr/local/cuda/bin/nvcc") if os.path.isfile(p)), None)
    release = re.search(r"release ([\d.]+)", (run_quiet([nvcc, "--version"]) if nvcc else None) or "")

    bwrap_version = run_quiet(["bwrap", "--version"])
    problem = bubblewrap_problem()
    group = Cgroup.create(Limits())
    if group is not None:
        cgroup = CgroupFact(available=True, version="v1" if len(group.dirs) > 1 else "v2")  # v1: a folder per controller
        group.destroy()
    else:
        cgroup = CgroupFact(available=False, version=None)

    # The venv's own ninja (a pip dependency) counts even when the venv is not on PATH.
    search_path = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    ninja = shutil.which("ninja", path=search_path)
    gxx = run_quiet(["g++", "--version"])
    rg = run_quiet(["rg", "--version"])
    docker_client = run_quiet(["docker", "--version"])
    docker_engine = run_quiet(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=5) if docker_client else None
    return Facts(
        python=Python(version=sys.version.split()[0], executable=sys.executable, ok=sys.version_info >= (3, 12)),
        root=os.geteuid() == 0,
        torch=torch_fact,
        triton=Version(distribution_version("triton")),
        nvidia_smi=NvidiaSmi(present=shutil.which("nvidia-smi") is not None,
                             gpus=[line.strip() for line in smi.splitlines()] if smi else []),
        nvcc=Nvcc(path=nvcc, version=release.group(1) if release else None),
        bubblewrap=Bubblewrap(version=bwrap_version.split()[-1] if bwrap_version else None, works=problem is None,
                              problem=problem),
        cgroup=cgroup,
        evaluation_children=evaluation_children(),
        ninja=Version(run_quiet([ninja, "--version"]) if ninja else None),
        gxx=Version(gxx.splitlines()[0] if gxx else None),
        ripgrep=Version(rg.splitlines()[0].split()[1] if rg else None),
        docker=Docker(client=docker_client, engine=docker_engine or None),
    )


def evaluation_children() -> EvaluationChildren:
    """Whether an evaluation child can be forked and answer here (its fork server started, isolated or not)."""
    from kernel_env.evaluators.child.protocol import Setup
    from kernel_env.evaluators.children import Child, ChildError, CommandFailed

    try:
        child = Child.spawn("judge", env={"CUDA_VISIBLE_DEVICES": ""}, gpu=False, label="doctor")
        try:
            child.call(Setup(device="cpu", out_dir=child.path("/job/ref"), task_code=""), None, 120)
        except CommandFailed as exc:
            return EvaluationChildren(works=False, isolated=child.isolated, problem=str(exc))
        finally:
            child.discard()
    except (ChildError, OSError) as exc:
        return EvaluationChildren(works=False, isolated=None, problem=str(exc).splitlines()[0])
    return EvaluationChildren(works=True, isolated=child.isolated, problem=None)


def grade_example(facts: Facts) -> Grade:
    """Grade ``example/relu_add`` with its bundled solution, as ``make demo`` does: cuda where torch
    sees a GPU and nvcc is there, else cpp on the CPU. Never raises: a failure is the grade's."""
    import time

    from kernel_env.resources import example_dir
    from kernel_env.runtime.episode import run_solution
    from kernel_env.tasks import resolve_task

    language, device = ("cuda", "cuda") if facts.torch.gpus and facts.nvcc.version else ("cpp", "cpu")
    started = time.monotonic()
    try:
        build, result = run_solution(resolve_task("example/relu_add"), example_dir() / "solutions" / language,
                                     language=language, device=device)
    except Exception as exc:  # noqa: BLE001 - a machine that cannot grade is the finding
        return Grade(language, device, correct=False, fault="evaluator", error=f"{type(exc).__name__}: {exc}",
                     seconds=round(time.monotonic() - started, 1))
    error = result.error if build.ok else f"the bundled solution did not build: {build.output.strip()[-500:]}"
    return Grade(language, device, correct=result.correct, fault=result.fault, error=error,
                 seconds=round(time.monotonic() - started, 1))


def run_quiet(argv: list[str], timeout: float = 10.0) -> str | None:
    """A command's output (stripped), or None if it is missing, fails or takes longer than ``timeout``."""
    if not shutil.which(argv[0]) and not os.path.isabs(argv[0]):
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def distribution_version(distribution: str) -> str | None:
    """The installed version of a Python distribution, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------- the reading


def interpret(f: Facts) -> tuple[list[str], list[str]]:
    """Plain sentences on what the facts mean, and the essentials that are missing."""
    from kernel_env.sandbox.limits import Limits

    meaning, missing = [], []
    if not f.python.ok:
        missing.append(f"Python 3.12 or newer (this is {f.python.version})")
    if not f.torch.version:
        missing.append(f"PyTorch ({f.torch.error})")

    gpus, nvcc = f.torch.gpus, f.nvcc.version
    if gpus:
        meaning.append(f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} ({', '.join(sorted(set(gpus)))}): cuda, triton "
                       "and cpp solutions can be evaluated; timings use the GPU pool.")
        if not nvcc:
            meaning.append("no nvcc: cuda kernels cannot be compiled here (install the CUDA toolkit or set CUDA_HOME).")
    elif f.nvidia_smi.gpus:
        meaning.append(f"nvidia-smi sees {', '.join(f.nvidia_smi.gpus)} but torch does not (a CPU build of torch, "
                       f"or a driver mismatch): only CPU evaluation is possible until torch sees the GPU.")
    else:
        compile_note = f"cuda tasks can be compiled (nvcc {nvcc}) but not evaluated" if nvcc else \
            "cuda tasks can be neither compiled (no nvcc) nor evaluated"
        meaning.append(f"no GPU: {compile_note}; cpp and triton (interpreter) run on the CPU.")

    if not f.gxx.version or not f.ninja.version:
        absent = " and ".join(name for name, tool in (("g++", f.gxx), ("ninja", f.ninja)) if not tool.version)
        meaning.append(f"no {absent}: utils/compile.sh cannot build cpp or cuda kernels; triton still works.")

    if f.bubblewrap.works:
        uid = ("the agent's uid maps to this host's root (run as a user to give agents an unprivileged uid)"
               if f.root else "an unprivileged uid")
        meaning.append("the local sandbox isolates agents with bubblewrap: read-only toolchain and protected files, "
                       f"private /tmp, no network, own pid namespace, {uid}.")
    else:
        meaning.append(f"the local sandbox is NOT isolated: {f.bubblewrap.problem}. Agent commands would run on this "
                       "host with resource limits only; do not run untrusted agents here.")
    children = f.evaluation_children
    if not children.works:
        missing.append(f"evaluation children: {children.problem}")
    elif not children.isolated:
        meaning.append("evaluation children (the trusted harness's reference and candidate processes) are NOT "
                       "isolated without bubblewrap: do not evaluate untrusted solutions here.")
    limits = Limits()
    if f.cgroup.available:
        meaning.append(f"a cgroup ({f.cgroup.version}) caps each sandbox as a whole: {limits.processes} processes, "
                       f"{limits.memory_bytes >> 30} GiB of memory.")
    else:
        per_process = f"each process is capped at {limits.address_space_bytes >> 30} GiB of address space"
        if f.root:
            meaning.append(f"no cgroup can be created and this runs as root: the process-count limit does NOT hold (the "
                           f"kernel ignores RLIMIT_NPROC for root) and there is no whole-sandbox memory cap; {per_process}.")
        else:
            meaning.append(f"no cgroup: limits are per process ({per_process}; {limits.processes} processes for this user).")

    if not f.ripgrep.version:
        meaning.append("no ripgrep: the Grep tool falls back to grep -rE (slower, fewer file types).")
    if f.grade is None:
        meaning.append("grading was not checked: `kernel-env doctor --grade` grades the bundled example end to end "
                       "(a minute or more on a CPU), the one check that proves evaluations work here.")
    else:
        where = f"{f.grade.language} solution, on the {f.grade.device.upper()},"
        if f.grade.correct:
            meaning.append(f"grading works: the bundled example's {where} was built, verified and timed "
                           f"by the trusted harness in {f.grade.seconds:.0f} s.")
        else:
            missing.append(f"grading: the bundled example's {where} which is correct, was judged wrong "
                           f"({f.grade.fault or 'unknown'}'s fault): {f.grade.error}. No evaluation on this machine "
                           "can be trusted until this is fixed.")
    if f.docker.engine:
        meaning.append(f"docker engine {f.docker.engine} is reachable: the docker sandbox backend can run here "
                       "(--sandbox docker).")
    return meaning, missing
