"""The trial output files: the candidate's process writes them (runner.write_outputs), the
reference's process reads them (runner.read_outputs) and compares (Runner.cmd_ref_compare).
The reader trusts nothing about a file, since the candidate's code runs in the writer."""

from __future__ import annotations

import json
import os

import pytest
import torch

from kernel_env.evaluators.child import runner as runner_module
from kernel_env.evaluators.child.runner import read_outputs, write_outputs

CPU = torch.device("cpu")


def _outputs():
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(5, 7, generator=g).t(),                       # not contiguous
        torch.randn(3, generator=g).to(torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.randn(2, 2, dtype=torch.complex64, generator=g),
        torch.tensor(7, dtype=torch.int64),                      # zero-dimensional
        torch.empty(0, 4),                                       # empty
        torch.full((2, 3), float("nan")),
    ]


@pytest.mark.parametrize("sequence", [True, False])
def test_outputs_come_back_bit_for_bit_with_their_shapes_and_dtypes(tmp_path, sequence):
    outputs = _outputs() if sequence else _outputs()[:1]
    write_outputs(tmp_path / "t.out", sequence, outputs)
    got_sequence, got = read_outputs(str(tmp_path / "t.out"), CPU)
    assert got_sequence is sequence and len(got) == len(outputs)
    for want, have in zip(outputs, got):
        assert have.dtype == want.dtype and have.shape == want.shape
        assert torch.equal(have.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))


def _file(tmp_path, header, payload: bytes = b"") -> str:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path = tmp_path / "t.out"
    path.write_bytes(len(text).to_bytes(8, "little") + text + payload)
    return str(path)


@pytest.mark.parametrize(("header", "payload", "says"), [
    ({"sequence": False, "outputs": [{"dtype": "float32", "shape": [2]}]}, b"\0" * 7, "does not match"),
    ({"sequence": False, "outputs": [{"dtype": "float32", "shape": [2]}]}, b"\0" * 9, "does not match"),
    ({"sequence": False, "outputs": [{"dtype": "Tensor", "shape": [2]}]}, b"\0" * 8, "bad output"),
    ({"sequence": False, "outputs": [{"dtype": "__class__", "shape": [2]}]}, b"\0" * 8, "bad output"),
    ({"sequence": False, "outputs": [{"dtype": "float32", "shape": [-2]}]}, b"", "bad output"),
    ({"sequence": False, "outputs": [{"dtype": "float32", "shape": [True]}]}, b"\0" * 4, "bad output"),
    ({"sequence": False, "outputs": [{"dtype": "float32", "shape": [2.0]}]}, b"\0" * 8, "bad output"),
    ({"sequence": False, "outputs": [{"dtype": "float32", "shape": "2"}]}, b"\0" * 8, "bad output"),
    ({"sequence": False, "outputs": [{"dtype": "float32", "shape": [0, 1 << 60]}]}, b"", "bad output"),
    ({"sequence": False, "outputs": []}, b"", "single output"),
    ({"sequence": 1, "outputs": []}, b"", "bad header"),
    ({"sequence": True, "outputs": {"dtype": "float32"}}, b"", "bad header"),
    (["sequence", "outputs"], b"", "bad header"),
    (b"\xff{not json", b"", "bad header"),
])
def test_a_malformed_output_file_is_refused(tmp_path, header, payload, says):
    with pytest.raises(ValueError, match=says):
        read_outputs(_file(tmp_path, header, payload), CPU)


def test_a_header_longer_than_a_header_may_be_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "t.out"
    path.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="header too long"):
        read_outputs(str(path), CPU)


def test_links_fifos_and_folders_are_not_output_files(tmp_path):
    write_outputs(tmp_path / "real.out", False, [torch.ones(3)])
    os.symlink(tmp_path / "real.out", tmp_path / "link.out")
    with pytest.raises(OSError):
        read_outputs(str(tmp_path / "link.out"), CPU)
    os.mkfifo(tmp_path / "fifo.out")  # opened without blocking, then refused
    with pytest.raises(ValueError, match="not a regular file"):
        read_outputs(str(tmp_path / "fifo.out"), CPU)
    (tmp_path / "dir.out").mkdir()
    with pytest.raises((ValueError, OSError)):
        read_outputs(str(tmp_path / "dir.out"), CPU)


def _reference(expected: dict) -> runner_module.Runner:
    runner = runner_module.Runner(channel=None)
    runner.expected = expected
    return runner


def test_the_reference_compares_a_trial_once_and_removes_the_file(tmp_path):
    ref = torch.randn(64)
    runner = _reference({0: (False, [ref]), 1: (True, [ref, ref * 2])})
    write_outputs(tmp_path / "0.out", False, [ref + 1e-4])
    answer = runner.cmd_ref_compare({"trial": 0, "file": str(tmp_path / "0.out"), "atol": 1e-2, "rtol": 1e-2})
    assert answer["report"]["correct"] and answer["report"]["trial"] == 0
    assert not (tmp_path / "0.out").exists() and 0 not in runner.expected
    write_outputs(tmp_path / "1.out", True, [ref, ref * 2 + 1])
    report = runner.cmd_ref_compare({"trial": 1, "file": str(tmp_path / "1.out"), "atol": 1e-2, "rtol": 1e-2})["report"]
    assert not report["correct"] and "output 1" in report["message"]


def test_a_single_output_written_as_a_sequence_is_a_wrong_answer(tmp_path):
    ref = torch.randn(8)
    runner = _reference({0: (False, [ref])})
    write_outputs(tmp_path / "0.out", True, [ref])
    report = runner.cmd_ref_compare({"trial": 0, "file": str(tmp_path / "0.out"), "atol": 1e-2, "rtol": 1e-2})["report"]
    assert not report["correct"] and "expected a single tensor" in report["message"]


def test_an_unreadable_candidate_file_is_reported_not_raised(tmp_path):
    runner = _reference({0: (False, [torch.ones(4)]), 1: (False, [torch.ones(4)])})
    answer = runner.cmd_ref_compare({"trial": 0, "file": str(tmp_path / "missing.out"), "atol": 1e-2, "rtol": 1e-2})
    assert "FileNotFoundError" in answer["unreadable"]
    os.symlink("/dev/zero", tmp_path / "1.out")
    answer = runner.cmd_ref_compare({"trial": 1, "file": str(tmp_path / "1.out"), "atol": 1e-2, "rtol": 1e-2})
    assert "unreadable" in answer and not os.path.lexists(tmp_path / "1.out")


def test_a_comparison_that_runs_out_of_device_memory_is_done_again_on_the_host(tmp_path, monkeypatch):
    ref = torch.randn(32)
    runner = _reference({0: (False, [ref])})
    write_outputs(tmp_path / "0.out", False, [ref.clone()])
    compare_outputs = runner_module.compare.compare_outputs
    devices = []

    def short_of_memory(trial, reference, candidate, atol, rtol):
        devices.append(candidate.device)
        if len(devices) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return compare_outputs(trial, reference, candidate, atol, rtol)

    monkeypatch.setattr(runner_module.compare, "compare_outputs", short_of_memory)
    answer = runner.cmd_ref_compare({"trial": 0, "file": str(tmp_path / "0.out"), "atol": 1e-2, "rtol": 1e-2})
    assert answer["report"]["correct"] and len(devices) == 2 and devices[1].type == "cpu"
    assert not (tmp_path / "0.out").exists()
