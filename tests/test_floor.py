"""The physical floor (``evaluators/floor.py``): a time under what the device can do for a call is
never paid; surely under it, refused with both figures; no floor where the task's own eager code
runs under it. The rules on numbers first, then the whole harness on the CPU."""

from __future__ import annotations

import socket
import textwrap
import uuid

import pytest
from test_evaluation import make_job, why

from kernel_env.evaluators import floor, harness
from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.evaluators.harness import evaluate
from kernel_env.evaluators.records import EvalResult, EvalSettings, Mode, Timing
from kernel_env.evaluators.reward import close_calls, established_milestone


def _timing(ms: float, sem: float | None = 0.001) -> Timing:
    return Timing(median_ms=ms, min_ms=ms, max_ms=ms, calls=30, sem_ms=sem)


def test_the_floor_is_the_bytes_over_the_bandwidth_with_its_slack():
    assert floor.floor_ms(3_000_000, 1_000_000.0, _timing(5.0)) == pytest.approx(3.0 / floor.SLACK)


@pytest.mark.parametrize(("call_bytes", "bytes_per_ms", "eager"), [
    (0, 1e6, _timing(5.0)),           # no tensor to move
    (3_000_000, None, _timing(5.0)),  # no bandwidth known
    (3_000_000, 1e6, None),           # not timed
    (3_000_000, 1e3, _timing(5.0)),   # the task's own eager code ran under it: the count is not what the answer needs
])
def test_there_is_no_floor_without_its_figures_or_where_eager_runs_under_it(call_bytes, bytes_per_ms, eager):
    assert floor.floor_ms(call_bytes, bytes_per_ms, eager) is None


def test_surely_under_means_under_by_more_than_two_standard_errors():
    assert floor.surely_below(_timing(0.001, sem=0.01), 1.0)
    assert not floor.surely_below(_timing(0.8, sem=0.15), 1.0)  # under, within the noise
    assert not floor.surely_below(_timing(1.2), 1.0)
    assert not floor.surely_below(_timing(0.001), None)


def _result(runtime: Timing, eager_ms: float, floor_ms: float | None) -> EvalResult:
    return EvalResult(job_id="j", task_id="t", language="triton", device="cpu", mode=Mode.PROFILE, correct=True,
                      runtime=runtime, eager=_timing(eager_ms), physical_floor_ms=floor_ms)


def test_a_time_under_the_floor_within_its_noise_is_timed_further_and_paid_no_speed_up():
    under = _result(_timing(0.8, sem=0.15), eager_ms=10.0, floor_ms=1.0)
    assert "floor" in close_calls(under)
    assert established_milestone(under) == 1  # 12x faster than eager by its median, but no faster than the device can go
    above = _result(_timing(2.0, sem=0.01), eager_ms=10.0, floor_ms=1.0)
    assert close_calls(above) == [] and established_milestone(above) == 2


def test_the_cached_bandwidth_only_rises(tmp_path):
    cache = floor.BandwidthCache(tmp_path)
    assert cache.get("gpu") is None
    assert cache.put("gpu", 2e9) == 2e9
    assert cache.put("gpu", 1e9) == 2e9 and cache.get("gpu") == 2e9  # a slowed measurement lowers nothing
    assert cache.put("gpu", 3e9) == 3e9 and cache.get("other") is None


# ============================================================================ through the harness (the CPU)

#: A task whose Model sleeps in forward: eager takes 40 ms, while relu(x) itself takes well under one.
_SLEEPING = textwrap.dedent("""\
    import time
    import torch


    class Model(torch.nn.Module):
        def forward(self, x):
            time.sleep(0.04)
            return torch.relu(x)


    def get_inputs():
        return [torch.randn(1 << 20)]


    def get_init_inputs():
        return []
    """)
_CANDIDATE = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
#: A call reads 4 MiB and writes 4 MiB.
_CALL_BYTES = 2 * (1 << 20) * 4
_SETTINGS = EvalSettings.short(timed_calls=10, own_kernels_only=False)


def _evaluate(tmp_path, monkeypatch, *, floor_ms: float | None) -> tuple[EvalResult, BaselineCache]:
    """The candidate (relu without the sleep) profiled against the sleeping task; ``floor_ms``: the floor
    made that by a bandwidth planted in the cache (None: the device's, measured by the job)."""
    monkeypatch.setattr(harness, "check_sources", lambda snapshot: [])  # torch in forward, on purpose
    cache = BaselineCache(tmp_path / "baselines")
    if floor_ms is not None:
        floor.BandwidthCache(cache.directory).put(f"cpu on {socket.gethostname()}", _CALL_BYTES / (floor_ms * floor.SLACK))
    snapshot = tmp_path / f"snap-{uuid.uuid4().hex[:6]}"
    (snapshot / "kernels").mkdir(parents=True)
    (snapshot / "model_new.py").write_text(_CANDIDATE)
    result = evaluate(make_job(snapshot, "triton", Mode.PROFILE, _SETTINGS, task_code=_SLEEPING), baselines=cache)
    print(why(result), result.steps_s, sep="\n")
    return result, cache


def test_a_time_surely_under_the_floor_is_refused_with_both_figures(tmp_path, monkeypatch):
    """The candidate really is that fast; the planted bandwidth says the device cannot be: the floor
    holds whatever made the time, and the message names the time, the floor and the bytes."""
    result, _ = _evaluate(tmp_path, monkeypatch, floor_ms=30.0)  # eager: 40 ms and more; the candidate ~10 (its worker's path)
    assert not result.correct and result.reward == -1.0 and result.fault == "candidate", why(result)
    assert result.physical_floor_ms == pytest.approx(30.0)
    (violation,) = result.violations
    assert "physical floor of 30 ms" in violation and "8.389 MB" in violation, violation


def test_the_device_bandwidth_is_measured_once_and_an_honest_time_stays_above_its_floor(tmp_path, monkeypatch):
    result, cache = _evaluate(tmp_path, monkeypatch, floor_ms=None)
    assert result.correct and result.reward == 2.0, why(result)
    assert "judge: bandwidth" in result.steps_s
    measured = floor.BandwidthCache(cache.directory).get(f"cpu on {socket.gethostname()}")
    assert measured and result.physical_floor_ms == pytest.approx(_CALL_BYTES / (measured * floor.SLACK))
    assert result.runtime_ms > result.physical_floor_ms, why(result)


def test_no_floor_where_the_tasks_own_eager_code_runs_under_it(tmp_path, monkeypatch):
    """A floor above eager's own time counts bytes the task's answer does not need: none is applied."""
    result, _ = _evaluate(tmp_path, monkeypatch, floor_ms=1000.0)
    assert result.correct and result.reward == 2.0 and result.physical_floor_ms is None, why(result)
    assert "judge: bandwidth" not in result.steps_s  # the cache had the device's figure
