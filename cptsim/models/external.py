"""Models from other libraries by name: ``torchvision:NAME`` and ``timm:NAME``, randomly initialised.

``cptsim.models`` resolves a ``SOURCE:NAME`` model name here. Only classification builders are offered (the
top-level ``torchvision.models`` namespace; any timm architecture), always built with no pretrained weights, so
nothing is ever downloaded. timm is an optional extra: ``pip install 'cptsim[timm]'``.

Each model keeps CPT's ImageNet convention of full-precision layers (``cptsim_fp_layers``): its first convolution
(the stem, which sees the raw image) and its last linear layer (the classifier).
"""

from __future__ import annotations

import difflib
from typing import Callable

import torch.nn as nn

from cptsim.errors import InputError

from .registry import FP_LAYERS_ATTR, _Entry, register_resolver

SOURCES = ("torchvision", "timm")
TIMM_INSTALL = "pip install 'cptsim[timm]' (or pip install timm)"

# torchvision builders whose defaults do not suit a plain training step: the auxiliary classifiers make the
# training-mode forward return a tuple, and the init_weights default warns.
_TORCHVISION_KWARGS = {
    "googlenet": {"aux_logits": False, "init_weights": True},
    "inception_v3": {"aux_logits": False, "init_weights": True},
}


def _unknown(source: str, name: str, names: list[str], listing: str) -> InputError:
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
    if not close:  # a distinctive part of the name, e.g. "resnext" for "resnext50_32x4"
        stem = name.rstrip("0123456789_x.").split("_")[0]
        close = [n for n in names if stem and n.startswith(stem)][:5]
    hint = f"; close matches: {', '.join(f'{source}:{n}' for n in close)}" if close else ""
    return InputError(f"unknown {source} model {name!r}{hint} (all {len(names)} names: {listing})")


def _torchvision_names() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def _timm():
    try:
        import timm
    except ImportError:
        raise InputError(f"timm:NAME models need timm, which is not installed: {TIMM_INSTALL}") from None
    return timm


def _first_conv_and_last_linear(model: nn.Module) -> tuple[str | None, str | None]:
    convs = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    return (convs[0] if convs else None), (linears[-1] if linears else None)


def _set_in_channels(model: nn.Module, in_channels: int, label: str) -> None:
    """Replace the first convolution by one taking ``in_channels`` (a freshly initialised copy of its shape)."""
    first, _ = _first_conv_and_last_linear(model)
    if first is None:
        raise InputError(f"{label} has no Conv2d stem to give {in_channels} input channels")
    parent_name, _, attr = first.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, attr)
    if old.groups != 1:
        raise InputError(f"{label}: its first convolution is grouped; it cannot take {in_channels} input channels")
    new = nn.Conv2d(in_channels, old.out_channels, old.kernel_size, stride=old.stride, padding=old.padding,
                    dilation=old.dilation, bias=old.bias is not None, padding_mode=old.padding_mode)
    nn.init.kaiming_normal_(new.weight, mode="fan_out", nonlinearity="relu")
    setattr(parent, attr, new)


def _mark_fp_layers(model: nn.Module, attr: str) -> nn.Module:
    first, last = _first_conv_and_last_linear(model)
    setattr(model, attr, [n for n in (first, last) if n is not None])
    return model


def resolve(source: str, name: str, fp_attr: str) -> tuple[Callable[..., nn.Module], str, str]:
    """(builder(num_classes, in_channels, input_shape), description, canonical name) for ``source:name``.

    InputError when the name is not one of the source's classification models. ``fp_attr``: the attribute that
    holds the full-precision layer names."""
    label = f"{source}:{name}"
    if not name:
        raise InputError(f"{source}:NAME needs a model name after the colon (e.g. {source}:resnet50)")
    if source == "torchvision":
        import torchvision

        names = _torchvision_names()
        if name not in names and name.lower() in names:
            name = name.lower()
        if name not in names and name in torchvision.models.list_models():
            raise InputError(f"{label} is not a classification model (cptsim trains and costs classifiers; "
                             "torchvision's detection, segmentation, video and optical-flow models are not offered)")
        if name not in names:
            raise _unknown(source, name, names, "python -c 'import torchvision; "
                                                "print(torchvision.models.list_models(module=torchvision.models))'")

        def build(num_classes: int, in_channels: int, input_shape=None) -> nn.Module:
            kwargs = dict(_TORCHVISION_KWARGS.get(name, {}))
            if name.startswith("vit_") and input_shape is not None and len(tuple(input_shape)) == 3:
                kwargs["image_size"] = int(tuple(input_shape)[-1])  # torchvision's ViT fixes its input size
            model = torchvision.models.get_model(name, weights=None, num_classes=num_classes, **kwargs)
            if in_channels != 3:
                _set_in_channels(model, in_channels, label)
            return _mark_fp_layers(model, fp_attr)

        return build, f"torchvision.models {name} (random init, no weights downloaded)", f"{source}:{name}"

    if source == "timm":
        timm = _timm()
        names = timm.list_models()
        arch = name.split(".")[0]  # a pretrained tag (resnet50.a1_in1k) names weights, which are never loaded
        if arch not in names and arch.lower() in names:
            arch = arch.lower()
        if arch not in names:
            raise _unknown(source, name, names, "python -c 'import timm; print(timm.list_models())'")

        def build(num_classes: int, in_channels: int, input_shape=None) -> nn.Module:
            kwargs = {}
            if input_shape is not None and len(tuple(input_shape)) == 3:
                kwargs["img_size"] = int(tuple(input_shape)[-1])  # only the models with a fixed size take it
            try:
                model = timm.create_model(arch, pretrained=False, num_classes=num_classes, in_chans=in_channels,
                                          **kwargs)
            except TypeError:
                model = timm.create_model(arch, pretrained=False, num_classes=num_classes, in_chans=in_channels)
            return _mark_fp_layers(model, fp_attr)

        return build, f"timm {arch} (random init, no weights downloaded)", f"{source}:{arch}"

    raise InputError(f"unknown model source {source!r}; choose from: {', '.join(SOURCES)}")


def _register() -> None:
    """``torchvision:NAME`` and ``timm:NAME``: any classifier of those libraries, by its own (case-kept) name."""
    def resolver_for(source: str):
        def resolver(raw: str) -> _Entry:
            builder, description, canonical = resolve(source, raw.partition(":")[2].strip(), FP_LAYERS_ATTR)
            return _Entry(canonical, builder, family=source, input="imagenet", description=description)
        return resolver

    for source in ("torchvision", "timm"):
        register_resolver(resolver_for(source), prefix=source)


_register()
