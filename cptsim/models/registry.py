"""Model registry: CLI names -> plain PyTorch models, in the style of timm's ``create_model``.

The one home of model names. The families register themselves here: ``vision`` (CIFAR ResNets, MobileNetV2, the
digits CNN, MLPs, ImageNet ResNets), ``text`` (lstm-lm, transformer-lm, which take ``name:options``), ``graph``
(gcn, sage, gat on PyTorch Geometric, ``name:options`` too) and ``external`` (``torchvision:NAME``, ``timm:NAME``).
Models use only plain PyTorch layers (and PyG's); quantization swaps layers in place later, so nothing here knows
about bits. Each model may carry ``cptsim_fp_layers``, the module
names that CPT's own convention keeps at full precision for that kind of model; ``default_fp_layers`` resolves it
to the list that ``cptsim.numerics.layers.quantize_model`` takes (numerics never asks the registry).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from cptsim.errors import InputError

__all__ = ["create_model", "meta_model", "list_models", "model_info", "default_fp_layers", "register_model", "register_resolver"]

# The attribute a model carries its own full-precision layer names in; its home is the quantizer layer's convention
from cptsim.numerics.layers import FP_LAYERS_ATTR, resolve_fp_layers  # noqa: E402

Builder = Callable[..., nn.Module]  # builder(num_classes, in_channels, input_shape) -> nn.Module


@dataclass(frozen=True)
class _Entry:
    name: str
    builder: Builder
    family: str
    input: str  # "cifar" | "digits" | "imagenet" | "any" | "text" | "graph"
    description: str


_REGISTRY: dict[str, _Entry] = {}

_INPUT_KINDS = ("cifar", "digits", "imagenet", "any", "text", "graph")
GRAPH_MODELS_HINT = "gcn, sage or gat"


def register_model(name: str, *, family: str, input: str, description: str) -> Callable[[Builder], Builder]:
    """Decorator: register ``builder(num_classes, in_channels, input_shape)`` under ``name``."""
    if input not in _INPUT_KINDS:
        raise ValueError(f"input must be one of {_INPUT_KINDS}, got {input!r}")

    def deco(fn: Builder) -> Builder:
        key = name.lower()
        if key in _REGISTRY:
            raise ValueError(f"model {name!r} is already registered")
        _REGISTRY[key] = _Entry(key, fn, family, input, description)
        return fn

    return deco


# Names that are not in _REGISTRY: a family's resolver builds their entry. Exact-prefix resolvers take the names
# "prefix:options" (language models' options, torchvision:/timm: classifiers); pattern resolvers take any name
# they recognise (resnetD for any depth 6n+2) and return None for the others.
_PREFIX_RESOLVERS: dict[str, Callable[[str], _Entry]] = {}
_PATTERN_RESOLVERS: list[Callable[[str], "_Entry | None"]] = []
_LISTED: list[str] = []  # names list_models shows ahead of the registry's (examples of pattern-resolved names)


def register_resolver(resolver, *, prefix: str | None = None, listed: tuple[str, ...] = ()) -> None:
    """Register ``resolver(name) -> _Entry`` for "prefix:..." names, or, with no prefix, a pattern resolver
    ``resolver(lower-case name) -> _Entry | None``; ``listed``: example names for ``list_models``."""
    if prefix is None:
        _PATTERN_RESOLVERS.append(resolver)
    else:
        _PREFIX_RESOLVERS[prefix] = resolver
    _LISTED.extend(listed)


# --------------------------------------------------------------------------------------------------------------
# Public API


def _resolve(name: str) -> _Entry:
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"model name must be a non-empty string, got {name!r}")
    key = name.strip().lower()
    if key in _REGISTRY:
        return _REGISTRY[key]
    for resolver in _PATTERN_RESOLVERS:
        entry = resolver(key)
        if entry is not None:
            return entry
    base, colon, _opts = key.partition(":")  # transformer-lm:layers=4,width=256; timm:NAME (case kept)
    if colon and base in _PREFIX_RESOLVERS:
        return _PREFIX_RESOLVERS[base](name.strip())
    import difflib

    close = difflib.get_close_matches(key, list_models(), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise InputError(f"unknown model {name!r}{hint} (all: {', '.join(list_models())}; or resnetD for any D = 6n+2, "
                     "torchvision:NAME, timm:NAME)")


def create_model(name: str, num_classes: int = 10, in_channels: int = 3, input_shape=None,
                 graph: bool | None = None) -> nn.Module:
    """Build a freshly initialised model by registry name.

    ``input_shape`` (C, H, W) is needed only by the shape-agnostic models (``mlp``, ``token-mlp``); the others
    ignore it. ``in_channels`` comes from the dataset. Language models take (T,), graph models (N, F) (nodes,
    features per node; their ``in_channels`` is ignored). ``graph``: whether the data is a graph dataset (None:
    judged from the shape, 2-D is a graph); a graph model on other data, or another model on a graph, is an
    InputError.
    """
    entry = _resolve(name)
    for label, value in (("num_classes", num_classes), ("in_channels", in_channels)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{label} must be a positive integer, got {value!r}")
    shape = tuple(input_shape) if input_shape is not None else None
    if entry.input == "graph":
        if graph is False or shape is None or len(shape) != 2:
            raise InputError(f"{name} is a graph model: it needs a graph dataset (node features (N, F)), not one of "
                             f"input shape {shape}")
    elif graph or (graph is None and shape is not None and len(shape) == 2 and entry.input != "any"):
        kind = "a language model" if entry.input == "text" else "an image model"
        raise InputError(f"{name} is {kind}; a graph dataset (node features {shape}) needs a graph model: "
                         f"{GRAPH_MODELS_HINT}")
    if entry.input not in ("text", "any") and shape is not None and len(shape) == 1:
        raise InputError(f"{name} is an image model; a text dataset (sequence input {shape}) needs a "
                         "language model: lstm-lm or transformer-lm")
    return entry.builder(num_classes, in_channels, input_shape)


# In-place initialisers a module runs on its fresh parameters. On the meta device they have no data to fill, yet
# torch implements several of their meta kernels in Python (torch._refs), whose first call imports torch._dynamo
# (~1.5-2 s on a 2-core machine) for a check that needs only names and shapes. A training process pays that import
# anyway (torch.optim's first optimizer makes it); a sweep's parent process, which only checks, no longer does.
_META_NOOPS = frozenset({"normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
                         "xavier_uniform_", "xavier_normal_", "orthogonal_", "constant_", "zeros_", "ones_",
                         "erfinv_", "exponential_", "random_", "bernoulli_", "log_normal_"})


class _SkipMetaInit(TorchFunctionMode):
    """Returns a meta tensor unchanged from the initialisers above; everything else runs as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
        if getattr(func, "__name__", "") in _META_NOOPS and isinstance(t, torch.Tensor) and t.is_meta:
            return t
        return func(*args, **kwargs)


def meta_model(name: str, num_classes: int = 10, in_channels: int = 3, input_shape=None,
               graph: bool | None = None) -> nn.Module:
    """``create_model`` on the meta device with its random initialisers skipped: the model's names, shapes and
    model/data pairing, for the checks a command makes before it builds the real one (same arguments, same
    InputErrors). Its parameters hold no values."""
    with torch.device("meta"), _SkipMetaInit():
        return create_model(name, num_classes=num_classes, in_channels=in_channels, input_shape=input_shape,
                            graph=graph)


def list_models(pattern: str | None = None) -> list[str]:
    """Concrete model names (the CIFAR ResNets listed are examples; any resnet{6n+2} builds). fnmatch filter."""
    names = list(_LISTED) + sorted(_REGISTRY)
    if pattern is not None:
        names = [n for n in names if fnmatch.fnmatch(n, pattern.lower())]
    return names


def model_info(name: str) -> dict:
    """{"name", "family", "input", "description"} without building the model."""
    e = _resolve(name)
    return {"name": e.name, "family": e.family, "input": e.input, "description": e.description}


def default_fp_layers(model: nn.Module) -> list[str]:
    """Module names CPT keeps at full precision for this model: the model's own ``cptsim_fp_layers`` (set by
    ``create_model``), otherwise the last ``nn.Linear`` (CPT's CIFAR convention: every conv quantized, the final
    classifier not); only layers that quantization would swap. The rule itself is the quantizer layer's
    (``cptsim.numerics.layers.declared_fp_layers``), so that ``quantize_model(model)`` on a model built outside the
    registry follows the same convention."""
    return resolve_fp_layers(model, None)
