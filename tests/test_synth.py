"""Synthesis, stage by stage on small inputs: crawl, compose (deterministic and by a scripted
model on loopback), filter (real isolated processes: kept, stochastic, constant, too fast,
broken), decontamination (a renamed copy of an evaluation task against a different task),
Table 3 statistics, and the resumable pipeline through `kernel-env synth`.

The filter's processes import torch and torch.compile compiles on the CPU, which takes tens of
seconds here: the screenings run in one module fixture, two at a time, and every test shares
one torch.compile cache, so only the first compile is cold.
"""

from __future__ import annotations

import json
import random
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from scripted_llm import ScriptedLLM
from typer.testing import CliRunner

from kernel_env.cli import app
from kernel_env.tasks import Task, load_tasks
from kernel_env.tasks.sources import write_records
from kernel_env.workloads.runs.synth.compose import (
    PAPER_OP_COUNT_WEIGHTS,
    ComposeError,
    DeterministicComposer,
    LLMComposer,
    chain,
    extract_code,
    seed_task,
)
from kernel_env.workloads.runs.synth.crawl import (
    LAYOUTS,
    REALISTIC,
    SMALL,
    crawl,
    crawl_zero_arg_modules,
    numel,
)
from kernel_env.workloads.runs.synth.decontam import (
    decontaminate,
    fingerprint,
    similarity,
    write_dropped,
    write_histogram,
)
from kernel_env.workloads.runs.synth.filter import (
    CPU_TIME_SCALE,
    FilterSettings,
    Screener,
    Screening,
    filter_tasks,
)
from kernel_env.workloads.runs.synth.stats import PAPER_SHARES, category, composition_stats

runner = CliRunner()


@pytest.fixture(scope="module")
def seeds():
    return crawl(transformers=False).seeds


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compile-cache")


# ----------------------------------------------------------------------------- crawl


def test_the_crawl_finds_torch_nn_seeds_and_says_why_others_are_not(seeds):
    found = crawl(transformers=False)
    names = {s.name: s for s in found.seeds}
    assert {"Linear", "Conv2d", "ConvTranspose3d", "BatchNorm2d", "LayerNorm", "GroupNorm", "ReLU", "GELU",
            "Softmax", "MaxPool2d", "AdaptiveAvgPool2d", "Flatten", "TransformerEncoderLayer"} <= set(names)
    assert names["Conv2d"].kind == "compute" and names["Conv2d"].ranks == (4,)
    assert found.skipped["torch.nn.Dropout"].startswith("stochastic")
    assert found.skipped["torch.nn.MSELoss"].startswith("a loss")
    assert found.skipped["torch.nn.LSTM"] == "returns a tuple or a state"
    assert all(s.library == "torch" for s in found.seeds)


def test_every_seed_renders_as_a_one_operator_task_in_kernelbench_format(seeds):
    rng = random.Random(0)
    for seed in seeds:
        code = seed_task(seed, SMALL, rng)
        assert code is not None, seed.name
        task = Task(id=f"seed/{seed.name}", code=code)
        task.check_source()
        assert f"nn.{seed.name}(" in code and fingerprint(code) is not None


def test_transformers_style_modules_are_crawled_when_installed(tmp_path, monkeypatch):
    package = tmp_path / "fake_transformers"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "activations.py").write_text(textwrap.dedent(
        """\
        import torch
        from torch import nn


        class QuickGELUActivation(nn.Module):
            def forward(self, x):
                return x * torch.sigmoid(1.702 * x)


        class ClippedGELUActivation(nn.Module):
            def __init__(self, min: float, max: float):
                super().__init__()
                self.min, self.max = min, max

            def forward(self, x):
                return torch.clip(nn.functional.gelu(x), self.min, self.max)


        class PairActivation(nn.Module):
            def forward(self, x):
                return x, x
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    found, skipped, note = crawl_zero_arg_modules("fake_transformers.activations")
    assert note is None
    assert [s.name for s in found] == ["QuickGELUActivation"] and found[0].library == "fake_transformers"
    assert skipped == {"fake_transformers.activations.ClippedGELUActivation": "needs constructor arguments",
                       "fake_transformers.activations.PairActivation": "does not map a tensor to one tensor of its shape"}
    code = seed_task(found[0], SMALL, random.Random(0))
    assert "from fake_transformers.activations import QuickGELUActivation" in code and "QuickGELUActivation()" in code
    sys.modules.pop("fake_transformers.activations", None)
    sys.modules.pop("fake_transformers", None)
    _, _, missing = crawl_zero_arg_modules("surely_not_installed_pkg.activations")
    assert missing.startswith("surely_not_installed_pkg is not installed")


# ----------------------------------------------------------------------------- compose


def test_the_deterministic_composer_gives_the_same_candidate_for_the_same_seed_and_index(seeds):
    first = DeterministicComposer(seeds, SMALL, seed=3)
    again = DeterministicComposer(seeds, SMALL, seed=3)
    other = DeterministicComposer(seeds, SMALL, seed=4)
    codes = [first.compose(i).code for i in range(6)]
    assert codes == [again.compose(i).code for i in range(6)]
    assert codes != [other.compose(i).code for i in range(6)]
    assert len(set(codes)) == 6


def test_deterministic_compositions_chain_the_asked_number_of_operators(seeds):
    for count in range(1, 6):
        composer = DeterministicComposer(seeds, SMALL, seed=0, op_weights={count: 1.0})
        for index in range(3):
            candidate = composer.compose(index)
            assert candidate.error is None, candidate.error
            task = candidate.task()
            task.check_source()
            assert len(candidate.ops) == count and candidate.data_source == f"torch#{count}"
            assert task.name == "_".join(candidate.ops) and task.source == "synthetic"
            assert task.code.count("        self.") == count  # one attribute per operator, applied in order
            assert task.code.count("self.") == 2 * count
            assert " -> ".join(candidate.ops) in task.code  # the chain, in the docstring
            assert candidate.provenance == {"composer": "deterministic", "seed": 0, "index": index, "size": "small"}


def test_realistic_chains_are_sized_to_about_a_gigabyte_within_the_cap(seeds):
    rng = random.Random(0)
    for _ in range(12):
        layout, dims, steps = chain(seeds, 2, REALISTIC, rng)
        shapes = [tuple(dims[d] for d in LAYOUTS[layout]), *(step.out_shape for step in steps)]
        largest = max(numel(shape) for shape in shapes)
        assert largest <= REALISTIC.max_numel
        assert largest >= REALISTIC.target_numel // 4 or dims["batch_size"] == 1, (layout, dims, shapes)
        assert {shape[0] for shape in shapes} == {dims["batch_size"]}  # only the batch dimension was scaled
        shape = shapes[0]
        for step in steps:  # the scaled shapes are what the operators give on the scaled input (meta device)
            shape = step.seed.output_shape(step.call, shape)
            assert shape == step.out_shape


def test_no_operator_of_a_chain_has_more_parameters_than_the_cap(seeds):
    by_name = {seed.name: seed for seed in seeds}
    huge = ((32768, 8), {"dim_feedforward": 65536, "dropout": 0.0, "batch_first": True})  # 8.6G parameters
    assert by_name["TransformerEncoderLayer"].output_shape(huge, (64, 32, 32768)) == (64, 32, 32768)
    assert by_name["TransformerEncoderLayer"].output_shape(huge, (64, 32, 32768), max_parameters=1 << 27) is None
    rng = random.Random(1)
    for _ in range(40):
        for step in chain(seeds, 2, REALISTIC, rng)[2]:
            args, kwargs = step.call
            with torch.device("meta"):
                module = step.seed.cls()(*args, **kwargs)
            assert sum(p.numel() for p in module.parameters()) <= REALISTIC.max_parameters, step


def test_extract_code_takes_the_last_python_block():
    text = "first\n```python\nx = 1\n```\nthen\n```python\nclass Model: ...\n```\n"
    assert extract_code(text) == "class Model: ...\n"
    assert extract_code("no code here") is None


_LLM_ANSWER = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(64, 32)
            self.act = nn.GELU()

        def forward(self, x):
            return self.act(self.linear(x))


    def get_inputs():
        return [torch.randn(16, 64)]


    def get_init_inputs():
        return []
    """
)


def test_the_llm_composer_asks_for_the_sampled_classes_and_keeps_the_answers_code(seeds):
    with ScriptedLLM.sequence([f"Here it is:\n```python\n{_LLM_ANSWER}```", "I cannot do that."]) as llm:
        composer = LLMComposer(seeds, SMALL, base_url=llm.base_url, seed=5, op_weights={2: 1.0})
        good = composer.compose(0)
        bad = composer.compose(1)
        request = llm.requests[0]
    assert good.error is None and good.code == _LLM_ANSWER
    assert good.composer == "llm" and good.data_source == "torch#2" and len(good.ops) == 2
    assert good.provenance["model"] == "scripted-model" and good.provenance["index"] == 0
    assert request["model"] == "scripted-model" and request["messages"][0]["role"] == "system"
    prompt = request["messages"][1]["content"]
    assert all(f"nn.{op}" in prompt for op in good.ops)  # each sampled class, shown as a task of its own
    assert prompt.count("class Model(nn.Module)") == 2
    assert bad.code is None and bad.error == "the answer has no ```python block"
    assert bad.ops == [s.name for s in composer.pick(1)[1]]


def test_the_llm_composer_reports_an_unreachable_server(seeds):
    composer = LLMComposer(seeds, SMALL, base_url="http://127.0.0.1:9/v1", model="m", timeout=5)
    with pytest.raises(ComposeError, match="the model call for candidate 0 failed"):
        composer.compose(0)


# ----------------------------------------------------------------------------- filter

_HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"


def _task(forward: str, inputs: str, features: int = 512) -> str:
    return _HEAD + textwrap.dedent(
        f"""\
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = nn.Linear({features}, {features})

            def forward(self, x):
                {forward}


        def get_inputs():
            return [{inputs}]


        def get_init_inputs():
            return []
        """
    )


SCREENED = {
    # a matrix product: milliseconds on any CPU, deterministic, input-dependent; and torch.compile
    # turns it into a library call, with no C++ to build (a cold CPU compile of C++ takes half a minute)
    "good": _task("return self.linear(x)", "torch.randn(512, 512)"),
    "dropout_in_train_mode": _task("return F.dropout(self.linear(x), p=0.5, training=True)", "torch.randn(512, 512)"),
    "constant_output": _task("return self.linear(x) * 0.0 + 1.0", "torch.randn(512, 512)"),
    "too_fast": _task("return torch.relu(x)", "torch.randn(4)", features=4),
    "forward_raises": _task("raise RuntimeError('no kernel for you')", "torch.randn(4)", features=4),
    "kills_its_process": _task("import os; os._exit(3)", "torch.randn(4)", features=4),
}
FILTER = FilterSettings(device="cpu", min_ms=1.0, max_ms=60_000.0, timed_calls=5, jobs_per_device=2)


@pytest.fixture(scope="module")
def screened(compile_cache) -> dict[str, Screening]:
    results = filter_tasks([(name, code) for name, code in SCREENED.items()], FILTER, cache_dir=compile_cache)
    return dict(zip(SCREENED, results))


def test_the_filter_keeps_a_deterministic_input_dependent_task_within_the_bounds(screened):
    good = screened["good"]
    assert good.kept and good.reasons == [], good.reasons
    assert 1.0 <= good.eager_ms <= 60_000.0
    assert good.outputs == [{"shape": [512, 512], "dtype": "float32"}] and good.device_name == "cpu"


def test_the_filter_rejects_a_stochastic_operator(screened):
    result = screened["dropout_in_train_mode"]
    assert not result.kept and result.eager_ms is None
    assert len(result.reasons) == 1 and result.reasons[0].startswith("not deterministic: the same inputs twice gave outputs")


def test_the_filter_rejects_a_constant_output(screened):
    result = screened["constant_output"]
    assert not result.kept
    assert result.reasons == ["an output is constant (all its elements are equal)",
                              "the outputs do not depend on the inputs (two different inputs gave the same outputs)"]


def test_the_filter_rejects_a_task_too_fast_for_the_bounds(screened):
    result = screened["too_fast"]
    assert not result.kept and result.eager_ms is not None and result.eager_ms < 1.0
    assert result.reasons == [f"too fast: eager time {result.eager_ms:.4g} ms is outside [1, 60000] ms"]


def test_the_filter_rejects_a_task_whose_forward_raises_with_the_error(screened):
    result = screened["forward_raises"]
    assert not result.kept
    assert result.reasons == ["running Model.forward failed: RuntimeError: no kernel for you"]


def test_a_task_that_kills_its_process_is_rejected_once_a_trivial_task_shows_the_machine_is_fine(screened):
    result = screened["kills_its_process"]
    assert not result.kept and result.crashed
    assert result.reasons == ["running Model.forward failed: the judge process died during RefScreen (exit code 3)"]


def test_the_time_bounds_are_the_papers_on_a_gpu_and_scaled_on_the_cpu():
    assert FilterSettings(device="cuda").bounds() == (1.0, 100.0)
    assert FilterSettings(device="cpu").bounds() == (CPU_TIME_SCALE, 100.0 * CPU_TIME_SCALE)
    assert FilterSettings(device="cpu", min_ms=0.5, max_ms=9.0).bounds() == (0.5, 9.0)


def test_processes_compiling_at_once_share_the_cpus(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    with Screener(FilterSettings(device="cpu", jobs_per_device=4)) as screener:
        assert screener.settings.compile_threads == 4
    with Screener(FilterSettings(device="cpu", jobs_per_device=32)) as screener:
        assert screener.settings.compile_threads == 1
    with Screener(FilterSettings(device="cpu", jobs_per_device=4, compile_threads=2)) as screener:
        assert screener.settings.compile_threads == 2


def test_a_candidate_out_of_memory_is_judged_again_with_no_other_screening_alive(monkeypatch):
    """On a GPU, twelve screenings' processes hold memory even while they wait for the timing gate:
    an out-of-memory retry must wait until none is alive, not just until none is timing."""
    from kernel_env.workloads.runs.synth import filter as filter_module

    lock, live, seen = threading.Lock(), [0], {}

    def fake_screen(code, task_id, settings, **kwargs):
        with lock:
            live[0] += 1
            attempt = seen.setdefault(task_id, [])
            attempt.append(live[0])
        try:
            time.sleep(0.1 if task_id == "big" else 0.6)
            if task_id == "big" and len(attempt) == 1:
                return Screening(task_id=task_id, kept=False, reasons=["out of memory"], out_of_memory=True)
            return Screening(task_id=task_id, kept=True)
        finally:
            with lock:
                live[0] -= 1

    monkeypatch.setattr(filter_module, "screen", fake_screen)
    with Screener(FilterSettings(device="cpu", jobs_per_device=3)) as screener:
        futures = [screener.submit("", name) for name in ("big", "a", "b", "c", "d", "e")]
        results = {f.result().task_id: f.result() for f in futures}
    assert results["big"].kept
    assert seen["big"][1] == 1  # judged again alone, not while "a" and "b" still held their memory

# ----------------------------------------------------------------------------- decontamination

EVAL_GEMM = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self, in_features, out_features, multiplier, negative_slope):
            super().__init__()
            self.gemm = nn.Linear(in_features, out_features)
            self.multiplier = multiplier
            self.leaky_relu = nn.LeakyReLU(negative_slope)

        def forward(self, x):
            x = self.gemm(x)
            x = x * self.multiplier
            x = self.leaky_relu(x)
            return x


    batch_size = 128
    in_features = 1024
    out_features = 512


    def get_inputs():
        return [torch.randn(batch_size, in_features)]


    def get_init_inputs():
        return [in_features, out_features, 2.0, 0.1]
    """
)
EVAL_CONV = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self, in_channels, out_channels, kernel_size):
            super().__init__()
            self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

        def forward(self, x):
            return torch.tanh(self.conv(x))


    def get_inputs():
        return [torch.randn(16, 3, 32, 32)]


    def get_init_inputs():
        return [3, 16, 3]
    """
)
RENAMED_GEMM = textwrap.dedent(
    '''\
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """A fresh-looking operator (it is not)."""

        def __init__(self, n_in: int, n_out: int, factor: float, slope: float):
            super().__init__()
            self.fc = nn.Linear(n_in, n_out)
            self.factor = factor
            self.act = nn.LeakyReLU(slope)

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            h = self.fc(inputs)
            h = h * self.factor
            h = self.act(h)
            return h


    def get_inputs():
        return [torch.randn(64, 4096)]


    def get_init_inputs():
        return [4096, 4096, 0.5, 0.01]
    '''
)
DIFFERENT = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.GroupNorm(4, 32)
            self.pool = nn.AdaptiveAvgPool2d(1)

        def forward(self, x):
            y = self.norm(x)
            y = torch.nn.functional.silu(y) + x
            y = self.pool(y).flatten(1)
            return torch.softmax(y, dim=-1)


    def get_inputs():
        return [torch.randn(8, 32, 64, 64)]


    def get_init_inputs():
        return []
    """
)


def _eval_set(root: Path) -> Path:
    for level, stem, code in ((1, "54_conv_tanh", EVAL_CONV), (2, "12_Gemm_Multiply_LeakyReLU", EVAL_GEMM)):
        (root / f"level{level}").mkdir(parents=True, exist_ok=True)
        (root / f"level{level}" / f"{stem}.py").write_text(code)
    return root


def test_decontamination_drops_a_renamed_copy_of_an_evaluation_task_and_keeps_a_different_one(tmp_path):
    eval_tasks = load_tasks(_eval_set(tmp_path / "KernelBench"))
    candidates = [Task(id="synthetic/0", code=RENAMED_GEMM), Task(id="synthetic/1", code=DIFFERENT)]
    report = decontaminate(candidates, eval_tasks, threshold=0.9)
    copy, different = report.matches
    assert copy.similarity == 1.0 and copy.nearest == "kernelbench/L2/12"
    assert different.similarity < 0.9
    assert [m.task_id for m in report.dropped] == ["synthetic/0"] and report.kept_ids() == {"synthetic/1"}

    dropped = write_dropped(report.dropped, tmp_path / "dropped.jsonl")
    assert [json.loads(line) for line in dropped.read_text().splitlines()] == [
        {"task_id": "synthetic/0", "similarity": 1.0, "nearest": "kernelbench/L2/12"}]
    assert write_histogram([m.similarity for m in report.matches], 0.9, tmp_path / "similarity.png") is None
    assert (tmp_path / "similarity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_similarity_sees_structure_not_names_or_numbers():
    gemm, renamed, conv = fingerprint(EVAL_GEMM), fingerprint(RENAMED_GEMM), fingerprint(EVAL_CONV)
    assert gemm == renamed
    assert similarity(gemm, conv) < 0.9
    relu, sigmoid = fingerprint(EVAL_CONV), fingerprint(EVAL_CONV.replace("torch.tanh", "torch.sigmoid"))
    assert relu != sigmoid  # the API called is structure: tanh and sigmoid differ
    assert fingerprint("not python (") is None and fingerprint("x = 1\n") is None


def test_kernel_env_synth_decontam_writes_kept_dropped_and_the_histogram(tmp_path):
    eval_root = _eval_set(tmp_path / "KernelBench")
    source = write_records([Task(id="synthetic/0", code=RENAMED_GEMM, source="synthetic"),
                            Task(id="synthetic/1", code=DIFFERENT, source="synthetic")], tmp_path / "set.jsonl")
    result = runner.invoke(app, ["synth", "decontam", str(source), "--eval-set", str(eval_root),
                                 "--out-dir", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["kept"] == 1 and [d["task_id"] for d in record["dropped"]] == ["synthetic/0"]
    assert [t.id for t in load_tasks(tmp_path / "out" / "kept.jsonl")] == ["synthetic/1"]
    assert (tmp_path / "out" / "similarity.png").stat().st_size > 0


# ----------------------------------------------------------------------------- statistics


def test_composition_statistics_count_categories_like_table_3(tmp_path):
    def task(i: int, **metadata) -> Task:
        return Task(id=f"t/{i}", code=_LLM_ANSWER, metadata=metadata)

    tasks = [task(0, data_source="torch#2"), task(1, data_source="torch#2"), task(2, data_source="torch#1"),
             task(3, data_source="transformers#1"), task(4, ops=["Conv2d", "ReLU", "Softmax"]),
             task(5, ops="['nn.Linear', 'torch.relu', 'nn.LayerNorm', 'nn.GELU', 'nn.Tanh']"), task(6)]
    assert [category(t) for t in tasks] == ["2 ops", "2 ops", "1 op", "transformers", "3 ops", "5 ops", None]
    stats = composition_stats(tasks)
    assert stats.counts == {"1 op": 1, "2 ops": 2, "3 ops": 1, "4 ops": 0, "5 ops": 1, "transformers": 1}
    assert stats.unknown == 1 and stats.known == 6
    assert stats.share("2 ops") == pytest.approx(100 * 2 / 6)
    assert [r["paper_share"] for r in stats.rows()] == [PAPER_SHARES[c] for c in PAPER_SHARES]
    assert sum(PAPER_OP_COUNT_WEIGHTS.values()) + PAPER_SHARES["transformers"] == pytest.approx(100.0)

    path = write_records(tasks[:5], tmp_path / "set.parquet")
    result = runner.invoke(app, ["synth", "stats", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"][1] == {"category": "2 ops", "count": 2, "share": 40.0, "paper_share": 83.77}
    table = runner.invoke(app, ["synth", "stats", str(path)])
    assert "transformers" in table.stdout and "83.77 %" in table.stdout


# ----------------------------------------------------------------------------- the pipeline


def _synth(out: Path, cache: Path, eval_root: Path, count: int = 1, *extra: str):
    # Linear -> Linear chains: torch.compile makes them library calls, with no C++ to build on this CPU.
    return runner.invoke(app, ["synth", "--device", "cpu", "--size", "small", "--count", str(count), "--out", str(out),
                               "--seed", "1", "--ops", "Linear", "--op-weights", "0,1", "--min-ms", "0", "--max-ms", "60000",
                               "--timed-calls", "3",
                               "--jobs", "1", "--compile-cache", str(cache), "--eval-set", str(eval_root), "--json",
                               *extra])


def _verdicts(work: Path) -> list[str]:
    return (work / "verdicts.jsonl").read_text().splitlines()


@pytest.mark.slow  # 8 s: the whole pipeline, twice
def test_kernel_env_synth_makes_a_loadable_task_set_and_resumes_where_it_stopped(tmp_path, compile_cache, screened):
    eval_root = _eval_set(tmp_path / "KernelBench")
    out, work = tmp_path / "tasks.jsonl", tmp_path / "tasks.jsonl.synth"
    first = _synth(out, compile_cache, eval_root)
    assert first.exit_code == 0, first.output
    summary = json.loads(first.stdout)
    assert summary["written"] == 1 and summary["complete"] and summary["by_stage"]["kept"] == 1
    screened_count = summary["screen_seconds"]["screened"]
    assert screened_count >= 1 and 0 < summary["screen_seconds"]["median"] <= summary["screen_seconds"]["total"]
    (task,) = load_tasks(out)
    assert task.source == "synthetic" and task.id.startswith("synthetic/")
    provenance = task.metadata["provenance"]
    assert provenance["composer"] == "deterministic" and provenance["seed"] == 1 and provenance["device"] == "cpu"
    assert provenance["eager_ms"] > 0 and provenance["similarity"] < 0.9 and provenance["eval_set"] == str(eval_root)
    assert task.metadata["data_source"] == "torch#2" and task.metadata["ops"] == ["Linear", "Linear"]
    assert [row["count"] for row in summary["stats"]["rows"]] == [0, 1, 0, 0, 0, 0]
    assert (work / "similarity.png").exists() and (work / "dropped.jsonl").exists()
    assert json.loads((work / "summary.json").read_text())["written"] == 1
    verdicts = _verdicts(work)

    again = _synth(out, compile_cache, eval_root)  # nothing left to do: nothing is redone
    assert again.exit_code == 0, again.output
    assert _verdicts(work) == verdicts and [t.hash for t in load_tasks(out)] == [task.hash]

    # An interrupted run: the kept candidate's verdict never made it to disk, and a line was torn mid-write.
    (kept_line,) = [line for line in verdicts if json.loads(line)["kept"]]
    remaining = [line for line in verdicts if line != kept_line]
    torn = '{"index": 99, "sta'
    (work / "verdicts.jsonl").write_text("".join(line + "\n" for line in remaining) + torn)
    resumed = _synth(out, compile_cache, eval_root)
    assert resumed.exit_code == 0, resumed.output
    lines = _verdicts(work)
    assert lines[:len(remaining)] == remaining and torn not in lines  # the torn line was cut
    assert [json.loads(line) for line in lines[len(remaining):]] == [json.loads(kept_line) | {
        "screening": json.loads(lines[-1])["screening"]}]  # the same candidate, judged again (its timing is new)
    assert [t.hash for t in load_tasks(out)] == [task.hash]

    more = _synth(out, compile_cache, eval_root, 2)  # a larger --count goes on from the next candidate
    assert more.exit_code == 0, more.output
    judged = {json.loads(line)["index"] for line in lines}
    new = [json.loads(line) for line in _verdicts(work)[len(lines):]]
    assert new and not judged & {v["index"] for v in new} and new[-1]["kept"]
    assert [t.hash for t in load_tasks(out)][0] == task.hash and len(load_tasks(out)) == 2

    changed = _synth(out, compile_cache, eval_root, 2, "--threshold", "0.5")
    assert changed.exit_code == 2 and "threshold differ" in changed.stderr and "--restart" in changed.stderr


def test_kernel_env_synth_with_an_llm_records_why_each_candidate_was_not_kept(tmp_path, compile_cache):
    eval_root = _eval_set(tmp_path / "KernelBench")
    answers = ["Sorry, no code today.", f"```python\n{RENAMED_GEMM}```"]
    with ScriptedLLM.sequence(answers) as llm:
        result = runner.invoke(app, ["synth", "--composer", "llm", "--base-url", llm.base_url, "--compose-jobs", "1",
                                     "--device", "cpu", "--size", "small", "--count", "1", "--max-candidates", "2",
                                     "--out", str(tmp_path / "llm.jsonl"), "--eval-set", str(eval_root),
                                     "--compile-cache", str(compile_cache), "--json"])
        asked = len(llm.requests)
    assert result.exit_code == 1, result.output  # fewer tasks than --count: the candidates ran out
    summary = json.loads(result.stdout)
    assert asked == 2 and summary["written"] == 0 and summary["by_stage"] == {"compose": 1, "decontam": 1}
    dropped = [json.loads(line) for line in Path(summary["dropped_list"]).read_text().splitlines()]
    assert dropped == [{"task_id": "synthetic/1", "similarity": 1.0, "nearest": "kernelbench/L2/12"}]
    assert load_tasks(tmp_path / "llm.jsonl") == []
