"""Crawl: seed operators for synthesis, from ``torch.nn`` (and ``transformers`` where installed).

Every public ``torch.nn`` module class is looked at. Those with a *recipe* become seeds: the
recipe proposes realistic constructor arguments for an input shape (``Linear(in, out)`` from
the last dimension, ``Conv2d(channels, out, k)`` from the channel dimension, ...). The rest are
listed as skipped, each with its reason (stochastic, needs two inputs, returns a tuple, ...), so
the crawl's coverage is visible. From ``transformers``, the module classes of
``transformers.activations`` that take no constructor arguments are seeds (the paper keeps
transformers modules standalone: they are never composed with others).

Shapes are checked by building a module on the ``meta`` device and calling it on a meta
tensor: no memory, no compute. Only library classes are instantiated here, never generated code.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Shape = tuple[int, ...]
Call = tuple[tuple, dict]
#: A recipe proposes constructor arguments for an input shape, or None where the class does not fit it.
Recipe = Callable[[Shape, random.Random, "SizePreset"], Call | None]

KINDS = ("compute", "activation", "norm", "pool", "reshape")
DEFAULT_TRANSFORMERS_MODULES = ("transformers.activations",)


# --------------------------------------------------------------------------- shapes


#: Input layouts: the name of each dimension, as the generated task's module-level constants.
LAYOUTS: dict[str, tuple[str, ...]] = {
    "vector": ("batch_size", "in_features"),
    "sequence": ("batch_size", "seq_len", "hidden_size"),
    "signal": ("batch_size", "in_channels", "length"),
    "image": ("batch_size", "in_channels", "height", "width"),
    "volume": ("batch_size", "in_channels", "depth", "height", "width"),
}


@dataclass(frozen=True)
class SizePreset:
    """How large generated tasks are: choices per layout dimension (``width`` follows ``height``),
    the output sizes of channel- and feature-changing operators, and a cap on any tensor's elements.

    Once a chain is found, its batch size is set so that its largest tensor holds about
    ``target_numel`` elements (times 0.5, 1 or 2, drawn), within ``max_numel``: every operator
    keeps the batch dimension, so this scales the work without changing the chain."""

    name: str
    dims: dict[str, dict[str, tuple[int, ...]]]
    channels: tuple[int, ...]
    features: tuple[int, ...]
    max_numel: int
    target_numel: int
    max_parameters: int

    def start(self, layout: str, rng: random.Random) -> dict[str, int]:
        """Values for the layout's dimensions, drawn with ``rng``."""
        values: dict[str, int] = {}
        for dim in LAYOUTS[layout]:
            values[dim] = values["height"] if dim == "width" else rng.choice(self.dims[layout][dim])
        return values


# Realistic sizes: an H100 moves about 3 TB/s, so a memory-bound operator takes the filter's minimum
# of 1 ms only on tensors of about a gigabyte: the largest tensor of a chain is aimed at 2^28 floats
# (1 GiB), the cap (2^29, 2 GiB) keeps a chain within memory. Set without a GPU at hand: the filter
# decides, and these are the numbers to tune if too many candidates come out too fast or too slow.
# An operator's parameters are capped at 2^27 (512 MiB): sized from a long last dimension, a
# Linear or TransformerEncoderLayer would otherwise take tens of gigabytes (seen on an H100: a
# d_model 32768 encoder layer, 8.6G parameters, minutes of initialising on the CPU).
REALISTIC = SizePreset(
    name="realistic",
    dims={
        "vector": {"batch_size": (256, 512, 1024, 2048, 4096), "in_features": (1024, 2048, 4096, 8192)},
        "sequence": {"batch_size": (8, 16, 32), "seq_len": (256, 512, 1024), "hidden_size": (512, 768, 1024, 2048)},
        "signal": {"batch_size": (16, 32, 64), "in_channels": (16, 32, 64), "length": (4096, 8192, 16384, 32768)},
        "image": {"batch_size": (16, 32, 64, 128), "in_channels": (3, 16, 32, 64), "height": (128, 224, 256, 512)},
        "volume": {"batch_size": (4, 8, 16), "in_channels": (3, 8, 16, 32), "depth": (16, 32, 64), "height": (32, 64, 128)},
    },
    channels=(16, 32, 64, 128),
    features=(1024, 2048, 4096, 8192),
    max_numel=1 << 29,
    target_numel=1 << 28,
    max_parameters=1 << 27,
)

# Small sizes for the CPU: the same operators and chains, a few thousand elements.
SMALL = SizePreset(
    name="small",
    dims={
        "vector": {"batch_size": (8, 16, 32), "in_features": (32, 64, 128)},
        "sequence": {"batch_size": (2, 4), "seq_len": (8, 16, 32), "hidden_size": (16, 32, 64)},
        "signal": {"batch_size": (2, 4), "in_channels": (4, 8), "length": (32, 64, 128)},
        "image": {"batch_size": (2, 4), "in_channels": (3, 4, 8), "height": (8, 16, 32)},
        "volume": {"batch_size": (2,), "in_channels": (2, 3, 4), "depth": (4, 8), "height": (8, 16)},
    },
    channels=(4, 8, 16),
    features=(16, 32, 64),
    max_numel=1 << 16,
    target_numel=1 << 12,
    max_parameters=1 << 16,
)

PRESETS = {preset.name: preset for preset in (REALISTIC, SMALL)}


# --------------------------------------------------------------------------- seeds


@dataclass(frozen=True)
class Seed:
    """One operator class: where it lives, what kind of operator it is, the input ranks it takes,
    and the recipe for its constructor arguments."""

    name: str
    module: str
    kind: str
    ranks: tuple[int, ...]
    recipe: Recipe = field(compare=False, repr=False)

    @property
    def library(self) -> str:
        return self.module.split(".")[0]

    @property
    def expression(self) -> str:
        """How generated code names the class (``nn.Conv2d``; a transformers class by its own name)."""
        return f"nn.{self.name}" if self.module == "torch.nn" else self.name

    def cls(self) -> type:
        return getattr(importlib.import_module(self.module), self.name)

    def output_shape(self, call: Call, shape: Shape, *, max_parameters: int | None = None) -> Shape | None:
        """The output shape for an input shape, from a meta-device run; None if the call fails,
        does not return one tensor, or builds a module of more than ``max_parameters`` parameters."""
        import torch

        args, kwargs = call
        try:
            with torch.device("meta"), torch.no_grad():
                module = self.cls()(*args, **kwargs)
                if max_parameters is not None and sum(p.numel() for p in module.parameters()) > max_parameters:
                    return None
                out = module(torch.empty(shape))
        except Exception:  # noqa: BLE001 - any failure means "does not fit this shape"
            return None
        return tuple(out.shape) if isinstance(out, torch.Tensor) else None


@dataclass(frozen=True)
class CrawlResult:
    """The seeds found, and the classes looked at but not usable, each with its reason."""

    seeds: list[Seed]
    skipped: dict[str, str]
    notes: list[str]

    def by_library(self, library: str) -> list[Seed]:
        return [seed for seed in self.seeds if seed.library == library]


# --------------------------------------------------------------------------- recipes


def _no_args(shape: Shape, rng: random.Random, preset: SizePreset) -> Call:
    return (), {}


def _const(**kwargs) -> Recipe:
    return lambda shape, rng, preset: ((), dict(kwargs))


def _choice(**choices: Sequence) -> Recipe:
    return lambda shape, rng, preset: ((), {key: rng.choice(list(values)) for key, values in choices.items()})


def _spatial(shape: Shape) -> Shape:
    return shape[2:]


def _conv(shape: Shape, rng: random.Random, preset: SizePreset) -> Call | None:
    kernel = rng.choice((3, 5)) if len(shape) < 5 else 3
    if min(_spatial(shape)) < kernel:
        return None
    return (shape[1], rng.choice(preset.channels), kernel), {"padding": rng.choice((0, kernel // 2))}


def _conv_transpose(shape: Shape, rng: random.Random, preset: SizePreset) -> Call | None:
    kernel, stride = rng.choice(((2, 2), (3, 2), (3, 1), (4, 2)))
    return (shape[1], rng.choice(preset.channels), kernel), {"stride": stride}


def _linear(shape: Shape, rng: random.Random, preset: SizePreset) -> Call:
    return (shape[-1], rng.choice(preset.features)), {}


def _channels(shape: Shape, rng: random.Random, preset: SizePreset) -> Call:
    return (shape[1],), {}


def _instance_norm(shape: Shape, rng: random.Random, preset: SizePreset) -> Call:
    return (shape[1],), {"affine": rng.random() < 0.5}


def _last_dim(shape: Shape, rng: random.Random, preset: SizePreset) -> Call:
    return (shape[-1],), {}


def _group_norm(shape: Shape, rng: random.Random, preset: SizePreset) -> Call | None:
    groups = [g for g in (2, 4, 8, 16, 32) if shape[1] % g == 0 and g < shape[1]]
    return ((rng.choice(groups), shape[1]), {}) if groups else None


def _prelu(shape: Shape, rng: random.Random, preset: SizePreset) -> Call:
    return (), {"num_parameters": shape[1] if len(shape) > 1 and rng.random() < 0.5 else 1}


def _softmax(shape: Shape, rng: random.Random, preset: SizePreset) -> Call:
    return (), {"dim": rng.choice((1, -1))}


def _glu(shape: Shape, rng: random.Random, preset: SizePreset) -> Call | None:
    return ((), {"dim": -1}) if shape[-1] % 2 == 0 else None


def _pool(shape: Shape, rng: random.Random, preset: SizePreset) -> Call | None:
    return ((2,), {"stride": 2}) if min(_spatial(shape)) >= 2 else None


def _lp_pool(shape: Shape, rng: random.Random, preset: SizePreset) -> Call | None:
    return ((2, 2), {}) if min(_spatial(shape)) >= 2 else None


def _adaptive(shape: Shape, rng: random.Random, preset: SizePreset) -> Call:
    size = rng.choice([s for s in (1, 2, 4, 8) if s <= min(_spatial(shape))])
    return (size,), {}


def _upsample(shape: Shape, rng: random.Random, preset: SizePreset) -> Call:
    modes = ("nearest", "bilinear") if len(shape) == 4 else ("nearest",)
    mode = rng.choice(modes)
    return (), {"scale_factor": 2, "mode": mode, **({"align_corners": False} if mode == "bilinear" else {})}


def _pixel_shuffle(shape: Shape, rng: random.Random, preset: SizePreset) -> Call | None:
    return ((2,), {}) if shape[1] % 4 == 0 else None


def _pixel_unshuffle(shape: Shape, rng: random.Random, preset: SizePreset) -> Call | None:
    return ((2,), {}) if shape[2] % 2 == 0 and shape[3] % 2 == 0 else None


def _channel_shuffle(shape: Shape, rng: random.Random, preset: SizePreset) -> Call | None:
    groups = [g for g in (2, 4) if shape[1] % g == 0 and shape[1] > g]
    return ((rng.choice(groups),), {}) if groups else None


def _pad(shape: Shape, rng: random.Random, preset: SizePreset) -> Call | None:
    return ((rng.choice((1, 2)),), {}) if min(_spatial(shape)) > 2 else None


def _constant_pad(shape: Shape, rng: random.Random, preset: SizePreset) -> Call:
    return (rng.choice((1, 2)), rng.choice((0.0, 0.5, -1.0))), {}


def _encoder_layer(shape: Shape, rng: random.Random, preset: SizePreset) -> Call | None:
    heads = [h for h in (4, 8, 16) if shape[-1] % h == 0]
    if not heads:
        return None
    return (shape[-1], rng.choice(heads)), {"dim_feedforward": 2 * shape[-1], "dropout": 0.0, "batch_first": True}


def _unfold(shape: Shape, rng: random.Random, preset: SizePreset) -> Call:
    return (), {"kernel_size": 3, "padding": 1}


def _recipes() -> dict[str, tuple[str, tuple[int, ...], Recipe]]:
    """class name -> (kind, input ranks, recipe)."""
    table: dict[str, tuple[str, tuple[int, ...], Recipe]] = {"Linear": ("compute", (2, 3), _linear)}
    for n in (1, 2, 3):
        rank = (n + 2,)
        table[f"Conv{n}d"] = ("compute", rank, _conv)
        table[f"ConvTranspose{n}d"] = ("compute", rank, _conv_transpose)
        table[f"BatchNorm{n}d"] = ("norm", (2, 3) if n == 1 else rank, _channels)
        table[f"InstanceNorm{n}d"] = ("norm", rank, _instance_norm)
        table[f"MaxPool{n}d"] = ("pool", rank, _pool)
        table[f"AvgPool{n}d"] = ("pool", rank, _pool)
        table[f"AdaptiveAvgPool{n}d"] = ("pool", rank, _adaptive)
        table[f"AdaptiveMaxPool{n}d"] = ("pool", rank, _adaptive)
        table[f"LPPool{n}d"] = ("pool", rank, _lp_pool)
        table[f"ReflectionPad{n}d"] = ("reshape", rank, _pad)
        table[f"ReplicationPad{n}d"] = ("reshape", rank, _pad)
        table[f"CircularPad{n}d"] = ("reshape", rank, _pad)
        table[f"ZeroPad{n}d"] = ("reshape", rank, _pad)
        table[f"ConstantPad{n}d"] = ("reshape", rank, _constant_pad)
    table.update({
        "TransformerEncoderLayer": ("compute", (3,), _encoder_layer),
        "LayerNorm": ("norm", (2, 3, 4), _last_dim),
        "RMSNorm": ("norm", (2, 3, 4), _last_dim),
        "GroupNorm": ("norm", (3, 4, 5), _group_norm),
        "LocalResponseNorm": ("norm", (3, 4), _choice(size=(3, 5))),
        "Flatten": ("reshape", (3, 4, 5), _no_args),
        "Unfold": ("reshape", (4,), _unfold),
        "Upsample": ("reshape", (3, 4, 5), _upsample),
        "UpsamplingNearest2d": ("reshape", (4,), _const(scale_factor=2)),
        "UpsamplingBilinear2d": ("reshape", (4,), _const(scale_factor=2)),
        "PixelShuffle": ("reshape", (4,), _pixel_shuffle),
        "PixelUnshuffle": ("reshape", (4,), _pixel_unshuffle),
        "ChannelShuffle": ("reshape", (4,), _channel_shuffle),
        "Softmax": ("activation", (2, 3, 4, 5), _softmax),
        "LogSoftmax": ("activation", (2, 3, 4, 5), _softmax),
        "Softmin": ("activation", (2, 3, 4, 5), _softmax),
        "Softmax2d": ("activation", (3, 4), _no_args),
        "GLU": ("activation", (2, 3, 4, 5), _glu),
        "LeakyReLU": ("activation", (2, 3, 4, 5), _choice(negative_slope=(0.01, 0.1, 0.2))),
        "ELU": ("activation", (2, 3, 4, 5), _choice(alpha=(1.0, 0.5))),
        "CELU": ("activation", (2, 3, 4, 5), _choice(alpha=(1.0, 0.5))),
        "GELU": ("activation", (2, 3, 4, 5), _choice(approximate=("none", "tanh"))),
        "Hardtanh": ("activation", (2, 3, 4, 5), _const(min_val=-1.0, max_val=1.0)),
        "Threshold": ("activation", (2, 3, 4, 5), lambda shape, rng, preset: ((0.1, 0.0), {})),
        "Hardshrink": ("activation", (2, 3, 4, 5), _const(lambd=0.5)),
        "Softshrink": ("activation", (2, 3, 4, 5), _const(lambd=0.5)),
        "Softplus": ("activation", (2, 3, 4, 5), _choice(beta=(1.0, 2.0))),
        "PReLU": ("activation", (2, 3, 4, 5), _prelu),
    })
    for name in ("ReLU", "ReLU6", "SELU", "SiLU", "Mish", "Sigmoid", "Tanh", "Hardsigmoid", "Hardswish",
                 "Softsign", "LogSigmoid", "Tanhshrink"):
        table[name] = ("activation", (2, 3, 4, 5), _no_args)
    return table


#: Why a torch.nn class is not a seed (checked in order: exact names, then name patterns).
_SKIP_REASONS = {
    **dict.fromkeys(("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout", "RReLU",
                     "FractionalMaxPool2d", "FractionalMaxPool3d"), "stochastic (random in training mode)"),
    "Identity": "computes nothing",
    **dict.fromkeys(("Module", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict", "Container"),
                    "a container"),
    **dict.fromkeys(("RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell", "RNNBase", "RNNCellBase",
                     "MultiheadAttention"), "returns a tuple or a state"),
    **dict.fromkeys(("Transformer", "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder"),
                    "needs several inputs or submodules"),
    **dict.fromkeys(("Embedding", "EmbeddingBag"), "needs integer indices"),
    **dict.fromkeys(("Bilinear", "CosineSimilarity", "PairwiseDistance"), "needs two inputs"),
    "SyncBatchNorm": "needs torch.distributed",
    "Fold": "needs an output size matched to its input",
    "Unflatten": "needs a target shape matched to its input",
    "CrossMapLRN2d": "legacy",
    "DataParallel": "a wrapper that spreads another module over GPUs",
}


def _skip_reason(name: str) -> str:
    if name in _SKIP_REASONS:
        return _SKIP_REASONS[name]
    if "Loss" in name:
        return "a loss: needs a target (two inputs)"
    if name.startswith("Lazy"):
        return "lazy: shapes known only at the first call"
    if name.startswith("MaxUnpool"):
        return "needs pooling indices"
    return "no shape recipe"


# --------------------------------------------------------------------------- the crawl


def crawl(*, transformers: bool = True, transformers_modules: Sequence[str] = DEFAULT_TRANSFORMERS_MODULES) -> CrawlResult:
    """Seeds from every public ``torch.nn`` module class with a recipe, then (if ``transformers``
    and the package is installed) from the zero-argument module classes of ``transformers_modules``.
    Deterministic for a given torch and transformers version (classes in name order)."""
    import torch

    recipes = _recipes()
    seeds: list[Seed] = []
    skipped: dict[str, str] = {}
    notes: list[str] = []
    for name in sorted(dir(torch.nn)):
        obj = getattr(torch.nn, name)
        if name.startswith("_") or not inspect.isclass(obj) or not issubclass(obj, torch.nn.Module):
            continue
        if name in recipes:
            kind, ranks, recipe = recipes[name]
            seeds.append(Seed(name=name, module="torch.nn", kind=kind, ranks=ranks, recipe=recipe))
        else:
            skipped[f"torch.nn.{name}"] = _skip_reason(name)
    if transformers:
        for module_name in transformers_modules:
            found, module_skipped, note = crawl_zero_arg_modules(module_name)
            seeds += found
            skipped.update(module_skipped)
            if note:
                notes.append(note)
    return CrawlResult(seeds=seeds, skipped=skipped, notes=notes)


def crawl_zero_arg_modules(module_name: str) -> tuple[list[Seed], dict[str, str], str | None]:
    """Seeds from the ``nn.Module`` classes a module defines that build without arguments and map
    a (batch, seq_len, hidden) tensor to one tensor (activations, mostly). Returns the seeds,
    the classes skipped with reasons, and a note when the module is not installed."""
    import torch

    top = module_name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        return [], {}, f"{top} is not installed: no {module_name} seeds (pip install {top} to add them)"
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a broken optional install is a note, not a crash
        return [], {}, f"{module_name} does not import ({type(exc).__name__}: {exc}): no seeds from it"
    seeds, skipped = [], {}
    probe_shape = (2, 4, 8)
    for name, obj in sorted(vars(module).items()):
        if (name.startswith("_") or not inspect.isclass(obj) or not issubclass(obj, torch.nn.Module)
                or obj.__module__ != module.__name__):
            continue
        seed = Seed(name=name, module=module_name, kind="activation", ranks=(2, 3, 4), recipe=_no_args)
        try:
            needs_args = any(p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                             for p in inspect.signature(obj).parameters.values())
        except (TypeError, ValueError):
            needs_args = True
        if needs_args:
            skipped[f"{module_name}.{name}"] = "needs constructor arguments"
        elif seed.output_shape(((), {}), probe_shape) != probe_shape:
            skipped[f"{module_name}.{name}"] = "does not map a tensor to one tensor of its shape"
        else:
            seeds.append(seed)
    return seeds, skipped, None


def numel(shape: Shape) -> int:
    return math.prod(shape)
