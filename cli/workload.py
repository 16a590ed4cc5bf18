"""The flags `cptsim profile` and `cptsim cost` share to say which model on which input, resolved without loading
any data, and that workload's profile from the one profile builder."""

from __future__ import annotations

from cptsim.errors import InputError

from .common import parse_fp_layers, recipe, workload_options


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        shape = tuple(int(p) for p in text.strip().replace("x", ",").split(","))
    except ValueError:
        shape = ()
    if not (1 <= len(shape) <= 3) or any(s < 1 for s in shape):
        raise InputError(f"--input-shape must be positive sizes C,H,W or T,F (e.g. 3,32,32), got {text!r}")
    return shape


# What `profile` and `cost` take to say which model on which input.
profile_flags = workload_options("model", "dataset", "data_dir", "image_size", "input_shape", "num_classes",
                                 "fp_layers", "batch_size", "optimizer", "quant_agg", "channels_last")


def resolve_workload(model: str, dataset: str | None, data_dir: str | None, input_shape: str | None,
                     num_classes: int | None, image_size: int | None = None):
    """(input shape, num_classes, DataInfo or None) from the flags, without loading any data."""
    from cptsim.data import dataset_info, default_dataset, needs_data_dir

    shape = parse_shape(input_shape)
    info = None
    if shape is not None and dataset is not None and not data_dir and needs_data_dir(dataset):
        # The shape is given and nothing is loaded, so the folder is not needed: only its class count is.
        if num_classes is None:
            raise InputError(f"--dataset {dataset} with --input-shape and no --data-dir: give --num-classes "
                             "(or --data-dir, whose class folders are counted)")
        if image_size is not None:
            raise InputError("--image-size reads the images in --data-dir; --input-shape gives the shape itself")
    elif dataset is not None or shape is None:
        info = dataset_info(dataset or default_dataset(model), data_dir, image_size)
    elif image_size is not None:
        raise InputError("--image-size goes with --dataset imagefolder; --input-shape gives the shape itself")
    if shape is None:
        shape = tuple(info.input_shape)
    if num_classes is None:
        num_classes = info.num_classes if info is not None else 10
    if num_classes < 1:
        raise InputError(f"--num-classes must be a positive integer, got {num_classes}")
    return shape, num_classes, info


def build_profile(model: str, shape: tuple[int, ...], num_classes: int, fp_layers: str | None,
                  channels_last: bool = False, info=None, dataset: str | None = None, optimizer: str | None = None,
                  quant_agg: bool = False):
    """The flags as typed, handed to the one profile builder, ``cptsim.measure.profiler.profile_named_model``:
    --fp-layers parsed, a graph's edge count from its DataInfo, the optimizer the recipe's unless typed (its update
    is counted work)."""
    from cptsim.measure.profiler import profile_named_model

    optimizer = recipe(dataset, model, optimizer=optimizer)["optimizer"]
    return profile_named_model(model, shape, num_classes, parse_fp_layers(fp_layers),
                               graph_edges=getattr(info, "graph_edges", None), optimizer=optimizer,
                               quant_agg=quant_agg, channels_last=channels_last)
