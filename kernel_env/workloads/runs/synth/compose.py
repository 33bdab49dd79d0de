"""Compose: stack 1–5 seed operator classes into one KernelBench-format ``Model``.

Two composers make the same kind of ``Candidate``:

- ``DeterministicComposer`` needs no model: it draws an input layout and realistic sizes, then
  chains operators whose recipes fit the current shape, checking every link on the meta device
  (shape-checked chaining), and renders the chain as a task. Candidate ``i`` of seed ``s`` is
  always the same code, so a run can stop and resume anywhere.
- ``LLMComposer`` asks a model behind any OpenAI-compatible endpoint to compose sampled seed
  classes (each shown as a one-operator task) sequentially into one task. Its answer is
  untrusted text: only parsed here; the filter runs it, in isolated processes.

Transformers seeds are kept standalone (a one-operator task), as in the paper.
Nothing here executes generated code.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel_env.tasks import Task, TaskError
from kernel_env.workloads.runs.synth.crawl import (
    KINDS,
    LAYOUTS,
    Call,
    Seed,
    Shape,
    SizePreset,
    numel,
)

#: The paper's final mix of 1- … 5-operator compositions (CUDA-Agent-Ops-6K, Table 3), the default
#: weights of the number of operators a deterministic composition gets.
PAPER_OP_COUNT_WEIGHTS: dict[int, float] = {1: 3.40, 2: 83.77, 3: 7.62, 4: 2.80, 5: 1.23}
#: The paper's share of standalone transformers tasks.
PAPER_TRANSFORMERS_SHARE = 0.0118
#: Which kind of operator the next link of a chain is, before the class is drawn; the first link
#: of a multi-operator chain is a compute operator with probability FIRST_COMPUTE.
KIND_WEIGHTS: dict[str, float] = {"compute": 0.30, "activation": 0.35, "norm": 0.15, "pool": 0.10, "reshape": 0.10}
FIRST_COMPUTE = 0.7
MAX_OPS = 5


@dataclass(frozen=True)
class Step:
    """One link of a chain: a seed class, its constructor call, and the shape it outputs."""

    seed: Seed
    call: Call
    out_shape: Shape


@dataclass
class Candidate:
    """A composed task (or why composing failed): what the filter and decontamination judge.

    ``ops`` are the class names in order; ``data_source`` follows Ops-6K (``torch#2``,
    ``transformers#1``); ``provenance`` says how it was made (composer, seed, index, model)."""

    index: int
    code: str | None
    ops: list[str]
    data_source: str
    composer: str
    provenance: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def id(self) -> str:
        return f"synthetic/{self.index}"

    @property
    def name(self) -> str:
        return "_".join(self.ops) or f"candidate_{self.index}"

    def task(self) -> Task:
        """The candidate as a Task (raises TaskError if it has no code)."""
        if self.code is None:
            raise TaskError(f"task {self.id}: composing failed: {self.error}")
        return Task(id=self.id, code=self.code, source="synthetic", name=self.name,
                    metadata={"ops": list(self.ops), "data_source": self.data_source, "provenance": dict(self.provenance)})

    def to_record(self) -> dict[str, Any]:
        return {"index": self.index, "code": self.code, "ops": self.ops, "data_source": self.data_source,
                "composer": self.composer, "provenance": self.provenance, "error": self.error}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Candidate:
        return cls(index=int(record["index"]), code=record.get("code"), ops=list(record.get("ops") or []),
                   data_source=str(record.get("data_source") or ""), composer=str(record.get("composer") or ""),
                   provenance=dict(record.get("provenance") or {}), error=record.get("error"))


# --------------------------------------------------------------------------- rendering


def _attribute_names(steps: Sequence[Step]) -> list[str]:
    names, used = [], {}
    for step in steps:
        base = re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", step.seed.name).lower()
        used[base] = used.get(base, 0) + 1
        names.append(base if used[base] == 1 else f"{base}_{used[base]}")
    return names


def _call_source(step: Step) -> str:
    args, kwargs = step.call
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{step.seed.expression}({', '.join(parts)})"


def render_task(steps: Sequence[Step], layout: str, dims: dict[str, int]) -> str:
    """KernelBench-format source for a chain: ``Model`` builds the steps in ``__init__`` and applies
    them in order in ``forward``; the input's sizes are module-level constants; ``get_init_inputs``
    is empty (the constructor arguments are literals)."""
    names = _attribute_names(steps)
    imports = ["import torch", "import torch.nn as nn"]
    imports += sorted({f"from {s.seed.module} import {s.seed.name}" for s in steps if s.seed.module != "torch.nn"})
    chain = " -> ".join(step.seed.name for step in steps)
    out_shape = ", ".join(map(str, steps[-1].out_shape))
    lines = [*imports, "", "", "class Model(nn.Module):",
             f'    """{chain}: ({", ".join(LAYOUTS[layout])}) -> ({out_shape})."""', "",
             "    def __init__(self):", "        super().__init__()"]
    lines += [f"        self.{name} = {_call_source(step)}" for name, step in zip(names, steps)]
    lines += ["", "    def forward(self, x: torch.Tensor) -> torch.Tensor:"]
    lines += [f"        x = self.{name}(x)" for name in names[:-1]]
    lines += [f"        return self.{names[-1]}(x)", "", ""]
    lines += [f"{dim} = {dims[dim]}" for dim in LAYOUTS[layout]]
    lines += ["", "", "def get_inputs():", f"    return [torch.randn({', '.join(LAYOUTS[layout])})]", "", "",
              "def get_init_inputs():", "    return []", ""]
    return "\n".join(lines)


def _shape(layout: str, dims: dict[str, int]) -> Shape:
    return tuple(dims[dim] for dim in LAYOUTS[layout])


def chain(seeds: Sequence[Seed], count: int, preset: SizePreset, rng: random.Random, *,
          first: Seed | None = None, attempts: int = 40) -> tuple[str, dict[str, int], list[Step]] | None:
    """Draw a layout and sizes, then ``count`` shape-checked links (``first`` as the first, if given).
    Returns (layout, sizes, steps), or None if no chain of that length fits after ``attempts`` tries."""
    for _ in range(attempts):
        ranks = {len(LAYOUTS[layout]): layout for layout in LAYOUTS}
        start_seeds = [first] if first else [s for s in seeds if s.kind == "compute"] or list(seeds)
        layouts = sorted({ranks[r] for s in start_seeds for r in s.ranks if r in ranks})
        if not layouts:
            return None
        layout = rng.choice(layouts)
        dims = preset.start(layout, rng)
        shape = _shape(layout, dims)
        steps: list[Step] = []
        for _ in range(count * 12):
            if len(steps) == count:
                break
            if first is not None and not steps:
                options = [first]
            else:
                kind = "compute" if (not steps and count > 1 and rng.random() < FIRST_COMPUTE) else \
                    rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
                # No operator twice in a row (ReLU -> ReLU), except compute ones (Linear -> Linear is an MLP).
                previous = steps[-1].seed.name if steps and steps[-1].seed.kind != "compute" else None
                options = [s for s in seeds if s.kind == kind and len(shape) in s.ranks and s.name != previous]
            if not options:
                continue
            seed = rng.choice(options)
            call = seed.recipe(shape, rng, preset) if len(shape) in seed.ranks else None
            if call is None:
                continue
            out = seed.output_shape(call, shape, max_parameters=preset.max_parameters)
            if out is None or not 0 < numel(out) <= preset.max_numel:
                continue
            steps.append(Step(seed=seed, call=call, out_shape=out))
            shape = out
        if len(steps) == count and numel(_shape(layout, dims)) <= preset.max_numel:
            return _sized(layout, dims, steps, preset, rng)
    return None


def _sized(layout: str, dims: dict[str, int], steps: list[Step], preset: SizePreset,
           rng: random.Random) -> tuple[str, dict[str, int], list[Step]]:
    """The chain with its batch size set so that its largest tensor holds about the preset's target
    (a power of two; every operator keeps dimension 0, so only that dimension of each shape changes)."""
    shapes = [_shape(layout, dims), *(step.out_shape for step in steps)]
    per_sample = max(numel(shape) // shape[0] for shape in shapes)
    wanted = min(preset.target_numel * rng.choice((0.5, 1.0, 2.0)), preset.max_numel)
    batch = 1 << max(0, int(wanted // per_sample).bit_length() - 1)
    while batch > 1 and batch * per_sample > preset.max_numel:
        batch //= 2
    sized = [Step(seed=step.seed, call=step.call, out_shape=(batch, *step.out_shape[1:])) for step in steps]
    return layout, {**dims, "batch_size": batch}, sized


def _rng(seed: int, index: int) -> random.Random:
    return random.Random(f"kernel_env.workloads.synth:{seed}:{index}")  # the seed string as first written (str seeds hash with SHA-512): tasks stay the same across versions


def _op_count(rng: random.Random, weights: dict[int, float]) -> int:
    counts = sorted(weights)
    return rng.choices(counts, weights=[weights[c] for c in counts])[0]


def check_weights(weights: dict[int, float]) -> dict[int, float]:
    """Op-count weights: keys 1..5, non-negative, not all zero. Raises ValueError saying what is wrong."""
    if not weights or any(k not in range(1, MAX_OPS + 1) for k in weights):
        raise ValueError(f"op-count weights are for 1 to {MAX_OPS} operators, got {sorted(weights)}")
    if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError("op-count weights must be non-negative and not all zero")
    return dict(weights)


def seed_task(seed: Seed, preset: SizePreset, rng: random.Random) -> str | None:
    """The seed as a one-operator KernelBench-format task, or None if no layout fits it."""
    found = chain([seed], 1, preset, rng, first=seed)
    return render_task(found[2], found[0], found[1]) if found else None


# --------------------------------------------------------------------------- composers


class DeterministicComposer:
    """Shape-checked chains of seeds; candidate ``index`` depends only on (seed, index, seeds, preset, weights)."""

    name = "deterministic"

    def __init__(self, seeds: Sequence[Seed], preset: SizePreset, *, seed: int = 0,
                 op_weights: dict[int, float] | None = None, transformers_share: float = PAPER_TRANSFORMERS_SHARE):
        self.torch_seeds = [s for s in seeds if s.library == "torch"]
        self.transformers_seeds = [s for s in seeds if s.library != "torch"]
        if not self.torch_seeds:
            raise ValueError("no torch seeds to compose")
        self.preset, self.seed = preset, seed
        self.op_weights = check_weights(op_weights or PAPER_OP_COUNT_WEIGHTS)
        self.transformers_share = transformers_share

    def compose(self, index: int) -> Candidate:
        """Candidate ``index``: a chain of 1–5 operators (or a standalone transformers operator)."""
        rng = _rng(self.seed, index)
        provenance = {"composer": self.name, "seed": self.seed, "index": index, "size": self.preset.name}
        if self.transformers_seeds and rng.random() < self.transformers_share:
            first = rng.choice(self.transformers_seeds)
            found = chain([first], 1, self.preset, rng, first=first)
            library, count = "transformers", 1
        else:
            count = _op_count(rng, self.op_weights)
            found = chain(self.torch_seeds, count, self.preset, rng)
            library = "torch"
        if found is None:
            return Candidate(index=index, code=None, ops=[], data_source=f"{library}#{count}", composer=self.name,
                             provenance=provenance, error=f"no shape-compatible chain of {count} operators was found")
        layout, dims, steps = found
        return Candidate(index=index, code=render_task(steps, layout, dims), ops=[s.seed.name for s in steps],
                         data_source=f"{library}#{count}", composer=self.name, provenance=provenance)


SYSTEM_PROMPT = """\
You write PyTorch reference operators in the KernelBench format, for GPU kernel engineers to optimise.
A task is one self-contained Python file that defines:
- class Model(nn.Module) with __init__ and forward;
- get_inputs(): a list of input tensors (created with torch.randn / torch.rand on the default device);
- get_init_inputs(): a list of the constructor's arguments.
Rules: import only torch (and the modules the given operators come from); no randomness inside
forward (no dropout, no sampling), no file, network or process access; realistic input sizes so that
one forward pass takes between 1 and 100 milliseconds on a modern GPU; the output must depend on the
input. Answer with the whole file in one ```python block and nothing else."""


def extract_code(text: str | None) -> str | None:
    """The last fenced Python block of an answer (```python … ``` or ``` … ```), or None."""
    blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", text or "", re.S)
    return blocks[-1].strip() + "\n" if blocks else None


class LLMComposer:
    """Compositions written by a model behind an OpenAI-compatible endpoint (vLLM, SGLang, ...).

    Which seeds a candidate gets depends only on (seed, index); what the model writes does not.
    A failed model call raises ``ComposeError`` (the pipeline retries it, later or on resume); an
    answer without usable code becomes a Candidate with ``error`` set."""

    name = "llm"

    def __init__(self, seeds: Sequence[Seed], preset: SizePreset, *, base_url: str, model: str | None = None,
                 api_key: str = "EMPTY", seed: int = 0, op_weights: dict[int, float] | None = None,
                 transformers_share: float = PAPER_TRANSFORMERS_SHARE, temperature: float = 0.7,
                 max_tokens: int | None = None, timeout: float = 600.0):
        import openai

        self.torch_seeds = [s for s in seeds if s.library == "torch"]
        self.transformers_seeds = [s for s in seeds if s.library != "torch"]
        self.preset, self.seed = preset, seed
        self.op_weights = check_weights(op_weights or PAPER_OP_COUNT_WEIGHTS)
        self.transformers_share = transformers_share
        self.temperature, self.max_tokens = temperature, max_tokens
        self.base_url = base_url
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=1)
        self.model = model

    def resolve_model(self) -> str:
        """The model to ask: the one given, else the server's first. Raises ComposeError if the server is unreachable."""
        if self.model is None:
            import openai

            try:
                models = [m.id for m in self.client.models.list()]
            except openai.OpenAIError as exc:
                raise ComposeError(f"cannot list the models of {self.base_url}: {exc}") from None
            if not models:
                raise ComposeError(f"{self.base_url} serves no model; pass --model")
            self.model = models[0]
        return self.model

    def pick(self, index: int) -> tuple[str, list[Seed]]:
        """The library and seed classes candidate ``index`` composes, in order."""
        rng = _rng(self.seed, index)
        if self.transformers_seeds and rng.random() < self.transformers_share:
            return "transformers", [rng.choice(self.transformers_seeds)]
        count = _op_count(rng, self.op_weights)
        picked: list[Seed] = []
        while len(picked) < count:
            kind = "compute" if (not picked and count > 1 and rng.random() < FIRST_COMPUTE) else \
                rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
            options = [s for s in self.torch_seeds if s.kind == kind and s not in picked] or \
                [s for s in self.torch_seeds if s not in picked]
            picked.append(rng.choice(options))
        return "torch", picked

    def messages(self, index: int, library: str, picked: Sequence[Seed]) -> list[dict[str, str]]:
        rng = _rng(self.seed, index)
        parts = [f"Compose these {len(picked)} operator classes sequentially into one Model, in this order "
                 f"(the output of each feeds the next; add reshapes only where shapes demand): "
                 f"{', '.join(s.expression for s in picked)}.", ""]
        if library != "torch":
            parts[0] = f"Write one task whose Model applies {picked[0].name} from {picked[0].module}, on its own."
        for number, seed in enumerate(picked, 1):
            example = seed_task(seed, self.preset, rng)
            if example:
                parts += [f"Operator {number}, {seed.module}.{seed.name}, as a task of its own:",
                          f"```python\n{example}```", ""]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(parts).strip()}]

    def compose(self, index: int) -> Candidate:
        import openai

        model = self.resolve_model()
        library, picked = self.pick(index)
        provenance = {"composer": self.name, "seed": self.seed, "index": index, "model": model,
                      "temperature": self.temperature, "size": self.preset.name}
        options: dict[str, Any] = {"temperature": self.temperature}
        if self.max_tokens:
            options["max_tokens"] = self.max_tokens
        try:
            response = self.client.chat.completions.create(model=model, messages=self.messages(index, library, picked),
                                                           **options)
        except openai.OpenAIError as exc:
            raise ComposeError(f"the model call for candidate {index} failed: {type(exc).__name__}: {exc}") from None
        ops = [s.name for s in picked]
        data_source = f"{library}#{len(picked)}"
        text = response.choices[0].message.content if response.choices else None
        code = extract_code(text)
        if code is None:
            return Candidate(index=index, code=None, ops=ops, data_source=data_source, composer=self.name,
                             provenance=provenance, error="the answer has no ```python block")
        candidate = Candidate(index=index, code=code, ops=ops, data_source=data_source, composer=self.name,
                              provenance=provenance)
        try:
            candidate.task().check_source()
        except TaskError as exc:
            candidate.error = str(exc).split(": ", 1)[1]
        return candidate


class ComposeError(RuntimeError):
    """A composer could not be asked (the model server failed); retrying later may work."""


__all__ = ["Candidate", "ComposeError", "DeterministicComposer", "KINDS", "LLMComposer", "PAPER_OP_COUNT_WEIGHTS",
           "Step", "chain", "extract_code", "render_task", "seed_task"]
