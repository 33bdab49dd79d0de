"""kernel_env.workloads.ops.doctor: typed findings on this machine, and what a missing piece means."""

from __future__ import annotations

import dataclasses
import sys

from kernel_env.workloads.ops.doctor import (
    Bubblewrap,
    CgroupFact,
    Docker,
    EvaluationChildren,
    Facts,
    Findings,
    Grade,
    Nvcc,
    NvidiaSmi,
    Python,
    Torch,
    Version,
    examine,
    interpret,
    run_quiet,
)

DOCTOR_JSON_FACTS = ["python", "root", "torch", "triton", "nvidia_smi", "nvcc", "bubblewrap", "cgroup",
                     "evaluation_children", "ninja", "g++", "ripgrep", "docker", "grade"]


def _healthy_cpu_machine(**changes) -> Facts:
    """The facts of a CPU machine with everything kernel_env wants, ``changes`` applied."""
    facts = Facts(
        python=Python(version="3.12.3", executable="/usr/bin/python3", ok=True), root=False,
        torch=Torch(version="2.11.0", cuda_build=None, gpus=[]), triton=Version("3.5.0"),
        nvidia_smi=NvidiaSmi(present=False, gpus=[]), nvcc=Nvcc(path=None, version=None),
        bubblewrap=Bubblewrap(version="0.9.0", works=True, problem=None),
        cgroup=CgroupFact(available=True, version="v2"),
        evaluation_children=EvaluationChildren(works=True, isolated=True, problem=None),
        ninja=Version("1.11.1"), gxx=Version("g++ (Ubuntu 13.2.0) 13.2.0"), ripgrep=Version("14.1.0"),
        docker=Docker(client=None, engine=None),
    )
    return dataclasses.replace(facts, **changes)


def test_findings_on_this_machine_come_back_typed():
    findings = examine()  # no grade by default (seconds); the grade itself: test_cli's doctor --grade --json
    assert isinstance(findings, Findings) and isinstance(findings.facts, Facts)
    assert findings.facts.grade is None and findings.to_record()["facts"]["grade"] is None
    assert findings.facts.python == Python(version=sys.version.split()[0], executable=sys.executable,
                                           ok=sys.version_info >= (3, 12))
    assert isinstance(findings.facts.evaluation_children, EvaluationChildren)
    assert findings.ok == (findings.missing == []) and all(isinstance(line, str) for line in findings.meaning)


def test_the_record_keeps_the_doctor_json_keys():
    record = Findings(facts=_healthy_cpu_machine(), meaning=["a"], missing=[]).to_record()
    assert list(record) == ["ok", "facts", "meaning", "missing"] and record["ok"] is True
    assert list(record["facts"]) == DOCTOR_JSON_FACTS
    assert record["facts"]["g++"] == {"version": "g++ (Ubuntu 13.2.0) 13.2.0"}
    assert record["facts"]["torch"] == {"version": "2.11.0", "cuda_build": None, "gpus": []}
    broken = _healthy_cpu_machine(torch=Torch(version=None, error="ImportError: libcuda"))
    assert broken.to_record()["torch"] == {"version": None, "error": "ImportError: libcuda"}


def test_a_healthy_machine_misses_nothing():
    meaning, missing = interpret(_healthy_cpu_machine())
    assert missing == []
    assert meaning[0].startswith("no GPU:") and "cpp and triton (interpreter) run on the CPU" in meaning[0]


def test_an_ungraded_machine_says_how_to_grade_it():
    meaning, missing = interpret(_healthy_cpu_machine())  # grade=None: examine()'s default
    assert missing == []
    [note] = [line for line in meaning if "grad" in line]
    assert note.startswith("grading was not checked: `kernel-env doctor --grade` grades the bundled example")
    graded = _healthy_cpu_machine(grade=Grade("cpp", "cpu", correct=True, fault=None, error=None, seconds=40.0))
    assert not any(line.startswith("grading was not checked") for line in interpret(graded)[0])


def test_a_missing_compiler_is_reported_with_what_it_costs():
    meaning, missing = interpret(_healthy_cpu_machine(gxx=Version(None), ninja=Version(None)))
    assert "no g++ and ninja: utils/compile.sh cannot build cpp or cuda kernels; triton still works." in meaning
    assert missing == []  # triton still works: not an essential


def test_essentials_that_are_missing_make_the_findings_not_ok():
    facts = _healthy_cpu_machine(
        python=Python(version="3.11.9", executable="/usr/bin/python3.11", ok=False),
        torch=Torch(version=None, error="ModuleNotFoundError: No module named 'torch'"),
        evaluation_children=EvaluationChildren(works=False, isolated=None, problem="fork server did not start"))
    meaning, missing = interpret(facts)
    assert missing == ["Python 3.12 or newer (this is 3.11.9)",
                       "PyTorch (ModuleNotFoundError: No module named 'torch')",
                       "evaluation children: fork server did not start"]
    assert not Findings(facts=facts, meaning=meaning, missing=missing).ok


def test_a_machine_where_grading_is_broken_says_so_and_is_not_ok():
    # What a venv under /tmp did before the children saw it: every check passed, every grade failed.
    error = "building the reference Model failed: ref_init raised ModuleNotFoundError: No module named 'x'"
    facts = _healthy_cpu_machine(grade=Grade("cpp", "cpu", correct=False, fault="evaluator", error=error, seconds=40.0))
    meaning, missing = interpret(facts)
    assert len(missing) == 1 and missing[0].startswith("grading: the bundled example's cpp solution, on the CPU, "
                                                       "which is correct, was judged wrong (evaluator's fault)")
    assert error in missing[0]
    good = _healthy_cpu_machine(grade=Grade("cpp", "cpu", correct=True, fault=None, error=None, seconds=40.0))
    assert interpret(good)[1] == [] and any(line.startswith("grading works") for line in interpret(good)[0])


def test_an_unisolated_sandbox_is_said_loudly():
    meaning, _ = interpret(_healthy_cpu_machine(
        bubblewrap=Bubblewrap(version=None, works=False, problem="bwrap is not installed"),
        evaluation_children=EvaluationChildren(works=True, isolated=False, problem=None)))
    assert any(line.startswith("the local sandbox is NOT isolated: bwrap is not installed.") for line in meaning)
    assert any("are NOT isolated without bubblewrap" in line for line in meaning)


def test_a_tool_that_is_not_installed_is_a_fact_not_an_error():
    assert run_quiet(["kernel-env-no-such-tool", "--version"]) is None
    assert run_quiet(["false"]) is None
