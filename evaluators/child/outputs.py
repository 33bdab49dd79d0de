"""A call's outputs, read by their real type: no code of the candidate's runs when the harness reads them.

A model may return a tensor, or a tuple or list of them (nested ones flattened); a subclass of
tuple or list is read through the base type's own iterator, so an ``__iter__`` of the candidate's
cannot compute the outputs when the harness reads them. Each item must be a plain
``torch.Tensor`` (or a module's ``Parameter`` returned as is) with no attribute of its own (one
named like a method, ``out.to = ...``, would answer the harness's reads with the candidate's code).
"""

from __future__ import annotations

import torch


def flatten(value) -> list:
    """A call's outputs: the items of a tuple or list, nested ones included, else the one value.
    The real type decides, not ``isinstance``, which a ``__class__`` property fools."""
    kind = type(value)
    if issubclass(kind, tuple):
        items = tuple.__iter__(value)
    elif issubclass(kind, list):
        items = list.__iter__(value)
    else:
        return [value]
    return [leaf for item in items for leaf in flatten(item)]


def is_sequence(value) -> bool:
    """Whether ``flatten`` reads ``value`` as several outputs (by its real type)."""
    return issubclass(type(value), (tuple, list))


def is_plain(value) -> bool:
    """A tensor with nothing of its own: ``torch.Tensor`` itself, or a module's ``Parameter`` returned as
    is, with no attribute set on it."""
    return type(value) in (torch.Tensor, torch.nn.Parameter) and not _instance_dict(value)


def describe(value) -> str:
    """What a non-plain output is, for the message."""
    attributes = _instance_dict(value) if isinstance(value, torch.Tensor) else {}
    if attributes and type(value) in (torch.Tensor, torch.nn.Parameter):
        return f"a {type(value).__name__} with attributes set on it ({', '.join(sorted(attributes)[:3])})"
    return type(value).__name__


def _instance_dict(value) -> dict:
    try:
        return object.__getattribute__(value, "__dict__")
    except AttributeError:
        return {}
