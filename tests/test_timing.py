"""The judge's clock and the call protocol's pieces: the typed boundary, the shared memory, a
candidate's time relative to the yardstick (``clock.py``), and the baselines' cache."""

from __future__ import annotations

import json
import math
import os
import textwrap

import pytest
import torch

from kernel_env.evaluators.child import exchange, protocol
from kernel_env.evaluators.child.protocol import Buffers, BufferSpec, Done, Go, OutputRef, ProtocolError, decode


def test_a_message_crosses_the_boundary_unchanged():
    done = Done(k=3, outputs=[OutputRef(dtype="float32", shape=[2, 3], stride=[3, 1], offset=256, handle="ab" * 64)],
                sequence=True, findings=protocol.Findings(torch_ops={"add": 2}, triton_launches=1, audited=True))
    assert decode(done.encode(), Done) == done
    buffers = Buffers(layout=1, inputs=[None, BufferSpec("float16", [4], [1], 8, offset=64)], spill=[])
    assert decode(buffers.encode(), (Buffers, Go)) == buffers


@pytest.mark.parametrize(("data", "says"), [
    ({"type": "Done", "k": True}, "expected int"),                       # a bool is not a number here
    ({"type": "Done", "k": 1, "outputs": "everything"}, "expected list"),
    ({"type": "Done", "k": 1, "outputs": [{"dtype": "float32", "shape": [1], "stride": ["1"]}]}, "expected int"),
    ({"type": "Done"}, "has no k"),
    ({"type": "Stop"}, "'Stop' message where Done was expected"),
    ({"type": "Go", "k": 1, "layout": "1"}, "expected int"),
    ([1, 2], "not an object"),
])
def test_a_message_of_the_wrong_shape_is_refused_field_by_field(data, says):
    expected = Go if isinstance(data, dict) and data.get("type") == "Go" else Done
    with pytest.raises(ProtocolError, match=says):
        decode(json.dumps(data), expected)


def test_a_message_longer_than_the_protocol_allows_is_refused_unread():
    with pytest.raises(ProtocolError, match="bytes"):
        decode(b" " * (protocol.MAX_MESSAGE + 1), Done)


def test_a_view_of_shared_memory_stays_inside_its_buffer():
    raw = torch.zeros(64, dtype=torch.uint8)
    assert exchange.view(raw, torch.float32, [4, 4], [4, 1]).shape == (4, 4)
    assert exchange.view(raw, torch.float32, [2, 2], [1, 2], offset=16).stride() == (1, 2)
    for shape, stride, offset in (([4, 5], [5, 1], 0), ([4, 4], [4, 1], 4), ([2], [-1], 0), ([1], [1], 2), ([3], [1, 1], 0)):
        with pytest.raises(ValueError):
            exchange.view(raw, torch.float32, shape, stride, offset)


def test_inputs_keep_their_layout_where_it_is_dense_and_are_made_contiguous_where_not():
    transposed = torch.randn(3, 5).t()
    assert exchange.layout_of(transposed) == ([5, 3], [1, 5], 60) and exchange.dense(transposed)
    expanded = torch.randn(3, 1).expand(3, 4)
    assert not exchange.dense(expanded)
    assert exchange.layout_of(expanded) == ([3, 4], [4, 1], 48)
    assert not exchange.dense(torch.randn(4, 4)[:, :2])


def test_host_memory_shared_with_another_process_carries_values_both_ways():
    fd = exchange.memfd(16, exchange.INPUTS)
    tensor = exchange.view(exchange.mapped(fd, 16), torch.float32, [4], [1])
    tensor.copy_(torch.arange(4.0))
    pid = os.fork()
    if pid == 0:
        theirs = exchange.view(exchange.mapped(fd, 16), torch.float32, [4], [1])
        ok = theirs.tolist() == [0.0, 1.0, 2.0, 3.0]
        theirs.mul_(2)
        os._exit(0 if ok else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert tensor.tolist() == [0.0, 2.0, 4.0, 6.0]
    with pytest.raises(ValueError, match="smaller"):
        exchange.mapped(fd, 1 << 20)
    os.close(fd)


def test_a_sealed_spill_buffer_is_final_and_cannot_be_sealed_while_a_writable_mapping_lives():
    """What the judge reads of a call's outputs (``judge._call_cpu``): the seal fails while anyone still
    maps the memfd for writing, and once it holds, no write of anyone's reaches it, whether through a
    mapping made before or after, or a write to the descriptor."""
    fd = exchange.memfd(4096, exchange.OUTPUTS)
    writer = exchange.mapped(fd, 4096)
    writer[:4] = 7
    assert not exchange.seal_writes(fd)  # a writable mapping lives
    del writer  # its mapping with it
    assert exchange.seal_writes(fd)
    with pytest.raises(PermissionError):
        exchange.mapped(fd, 4096)  # a shared writable mapping is refused
    with pytest.raises(PermissionError):
        os.pwrite(fd, b"\0" * 4, 0)
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 0)
    private = exchange.mapped(fd, 4096, private=True)
    assert private[:4].tolist() == [7] * 4
    private[:4] = 0  # copy-on-write: the memfd keeps what it held
    assert exchange.mapped(fd, 4096, private=True)[:4].tolist() == [7] * 4
    os.close(fd)


def _sleeping_task(ms: float) -> str:
    return textwrap.dedent(f"""\
        import time
        import torch


        class Model(torch.nn.Module):
            def forward(self, x):
                time.sleep({ms / 1000})
                return torch.relu(x)


        def get_inputs():
            return [torch.randn(1024)]


        def get_init_inputs():
            return []
        """)


def test_a_baseline_is_timed_in_the_judges_own_process(tmp_path):
    """A Model that sleeps 20 ms in forward, timed as a baseline: about 20 ms, in the judge's process
    (no worker, no round trip to take out)."""
    from kernel_env.evaluators.baselines import BaselineCache
    from kernel_env.evaluators.harness import measure_baselines
    from kernel_env.evaluators.records import EvalSettings

    result = measure_baselines("sleeps", _sleeping_task(20), device="cpu", baselines=BaselineCache(tmp_path),
                               settings=EvalSettings.short())
    assert result.error is None, result.error
    assert 19.5 <= result.eager.median_ms <= 30, result.eager
    assert result.eager.method == "local" and result.eager.sem_ms is not None, result.eager
    assert result.compiled_baseline is None and not list(tmp_path.glob("*.json"))  # no compile asked for: nothing cached


def _noisy(center: float, spread: float, n: int, seed: int) -> list[float]:
    import random

    rng = random.Random(seed)
    return [center + rng.uniform(-spread, spread) for _ in range(n)]


@pytest.mark.parametrize("round_trip", [0.3, 0.58, 0.9])
def test_a_candidates_time_is_the_same_whatever_its_process_round_trip(round_trip):
    """The round trip through a worker (~0.5 ms on an H200, a few microseconds different in every
    process) is in the yardstick's calls and the candidate's alike: it cancels, whatever its size."""
    from kernel_env.evaluators import clock

    eager = clock.local(_noisy(0.0265, 0.0005, 30, 1))        # eager's own time, in the judge's process
    yardstick = _noisy(0.0265 + round_trip, 0.001, 30, 2)    # the Model through the worker
    calls = _noisy(0.0173 + round_trip, 0.001, 30, 3)        # the candidate through the same worker
    beside = _noisy(0.0265, 0.0005, 30, 4)
    timing = clock.relative(eager, yardstick, beside, calls, beside)
    assert timing.method == "relative" and timing.median_ms == pytest.approx(0.0173, abs=0.0006)
    assert timing.yardstick_raw_ms == pytest.approx(0.0265 + round_trip, abs=0.001)
    assert timing.sem_ms < 0.0006 and timing.drift == 0.0


def test_the_machines_pace_moving_between_the_yardstick_and_the_candidate_widens_the_error():
    from kernel_env.evaluators import clock

    eager = clock.local(_noisy(1.0, 0.01, 30, 1))
    same = clock.relative(eager, _noisy(1.5, 0.01, 30, 2), _noisy(1.0, 0.01, 30, 3), _noisy(1.2, 0.01, 30, 4),
                          _noisy(1.0, 0.01, 30, 5))
    moved = clock.relative(eager, _noisy(1.5, 0.01, 30, 2), _noisy(1.0, 0.01, 30, 3), _noisy(1.2, 0.01, 30, 4),
                           _noisy(1.1, 0.01, 30, 5))
    assert moved.drift == pytest.approx(0.1, abs=0.01) and abs(same.drift) < 0.01
    assert moved.sem_ms > 0.09 and same.sem_ms < 0.01


def test_without_the_judges_own_calls_no_drift_is_claimed():
    """On the CPU the judge makes no calls of its own beside the runs (its pace is not the worker's)."""
    from kernel_env.evaluators import clock

    eager = clock.through_worker(_noisy(3.0, 0.1, 30, 1), _noisy(1.0, 0.05, 30, 2))
    timing = clock.relative(eager, _noisy(3.0, 0.1, 30, 1), [], _noisy(2.0, 0.1, 30, 3), [])
    assert eager.method == "worker" and eager.median_ms == pytest.approx(2.0, abs=0.05)
    assert timing.drift is None and timing.median_ms == pytest.approx(1.0, abs=0.05)
    assert timing.sem_ms == pytest.approx(math.sqrt(clock.trimmed_sem(_noisy(2.0, 0.1, 30, 3)) ** 2
                                                    + clock.trimmed_sem(_noisy(3.0, 0.1, 30, 1)) ** 2 + eager.sem_ms ** 2))


def test_a_cached_compile_time_follows_this_jobs_eager_pace():
    from kernel_env.evaluators import clock
    from kernel_env.evaluators.records import Timing

    compiled = Timing(median_ms=2.0, min_ms=1.8, max_ms=2.4, calls=30, p25_ms=1.9, p75_ms=2.1, sem_ms=0.02)
    at_half = clock.scaled(compiled, 0.5)
    assert (at_half.median_ms, at_half.min_ms, at_half.p75_ms, at_half.sem_ms, at_half.calls) == (1.0, 0.9, 1.05, 0.01, 30)


@pytest.mark.slow  # 13 s: measures torch.compile
def test_the_compile_baseline_is_timed_once_and_cached_with_eager_beside_it(tmp_path):
    from kernel_env.evaluators.baselines import BaselineCache
    from kernel_env.evaluators.harness import measure_baselines
    from kernel_env.evaluators.records import EvalSettings

    code = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
            "def get_inputs():\n    return [torch.randn(1024)]\ndef get_init_inputs():\n    return []\n")
    cache = BaselineCache(tmp_path)
    first = measure_baselines("t", code, device="cpu", baselines=cache, settings=EvalSettings(timed_calls=5))
    assert first.error is None and first.compile_ms and first.compile_ms > 0, first
    assert "judge: compile the baseline" in first.steps_s, first.steps_s
    (entry,) = tmp_path.glob("*.json")
    cached = json.loads(entry.read_text())
    assert cached["eager"]["method"] == cached["compile"]["method"] == "local"
    second = measure_baselines("t", code, device="cpu", baselines=cache, settings=EvalSettings(timed_calls=5))
    assert second.error is None and "judge: compile the baseline" not in second.steps_s, second.steps_s
    # The compiled time at the second job's pace: scaled by its eager time over the cached eager time.
    factor = second.eager_ms / cached["eager"]["median_ms"]
    assert second.compile_ms == pytest.approx(cached["compile"]["median_ms"] * factor)
