"""The dataset a workload uses when none is named: the embedded one of the model's kind.

A language model (a model registered with ``input="text"``: lstm-lm, transformer-lm) gets the embedded text corpus
(``pydoc-chars``), a graph model (``input="graph"``: gcn, sage, gat) the karate club (``karate``, shipped inside
torch_geometric), every other model the embedded digits, so that ``cptsim train --model lstm-lm`` or ``--model gcn``
(and plan, cost, profile, sweep, range-test, ``TrainConfig`` and ``RunRecorder``) works with no other flag. A
dataset that is named is used as named: one of another kind stays an error (``check_pairing``, also raised where the
model meets the data).
"""

from __future__ import annotations

import sys

from cptsim.errors import InputError

__all__ = ["default_dataset", "model_kind", "dataset_kind", "check_pairing", "default_input_warning",
           "IMAGE_DEFAULT", "TEXT_DEFAULT", "GRAPH_DEFAULT"]

IMAGE_DEFAULT = "digits"
TEXT_DEFAULT = "pydoc-chars"  # cptsim.data.text.EMBEDDED
GRAPH_DEFAULT = "karate"  # cptsim.data.graph.GRAPH_DEFAULT
_BY_KIND = {"text": TEXT_DEFAULT, "graph": GRAPH_DEFAULT, "image": IMAGE_DEFAULT}
_GRAPH_DATASETS = "karate, cora, citeseer, pubmed, planetoid, ogbn-arxiv, synthetic-graph:N,F,K[:DEG]"


def _is_graph_module(model) -> bool:
    """A built model with a PyG message-passing layer (torch_geometric is loaded if one was built)."""
    if getattr(model, "cptsim_input", None) == "graph":
        return True
    nn = sys.modules.get("torch_geometric.nn")
    mp = getattr(nn, "MessagePassing", None) if nn is not None else None
    modules = getattr(model, "modules", None)
    return mp is not None and callable(modules) and any(isinstance(m, mp) for m in modules())


def model_kind(model) -> str | None:
    """"text" for a language model, "graph" for a graph neural network, "image" for the others, None for a name
    the registry does not know. ``model``: a registry name (its ``model_info(...)["input"]``), or a built model (one
    of cptsim's language models is "text", one with a PyG message-passing layer "graph", any other module "image")."""
    if isinstance(model, str):
        from cptsim.models import model_info

        try:
            kind = model_info(model)["input"]
        except InputError:
            return None
        return kind if kind in ("text", "graph") else "image"
    from cptsim.models.text import LSTMLM, TransformerLM

    if isinstance(model, (LSTMLM, TransformerLM)):
        return "text"
    return "graph" if _is_graph_module(model) else "image"


def dataset_kind(name: str) -> str | None:
    """"graph" for a graph dataset (``graph_edges`` set), "text" for a token-sequence one, "image" for the others,
    None for a name the registry does not know (or a malformed generated-dataset name)."""
    from .registry import nominal_info

    try:
        info = nominal_info(name)
    except InputError:
        return None
    if info.graph_edges is not None:
        return "graph"
    return "text" if len(tuple(info.input_shape)) == 1 else "image"


def default_dataset(model) -> str:
    """The embedded dataset of ``model``'s kind (see the module docstring; a name or a built model). An unknown
    model name gets the image default: the model's own error is raised where it is built, with the list of names."""
    return _BY_KIND.get(model_kind(model) or "image", IMAGE_DEFAULT)


def check_pairing(model, dataset: str) -> None:
    """An InputError when a known model and a known dataset are of different kinds (a language model on images,
    an image model on text, a graph model on either, either on a graph); anything unknown passes (it is checked
    where it is built)."""
    mk, dk = model_kind(model), dataset_kind(dataset)
    if mk is None or dk is None or mk == dk:
        return
    label = model if isinstance(model, str) else type(model).__name__
    if mk == "text":
        raise InputError(f"{label} is a language model: it needs a text dataset (ptb, wikitext-2, wikitext-103, "
                         f"{TEXT_DEFAULT}), not the {dk} dataset {dataset}; leave the dataset out for {TEXT_DEFAULT}")
    if mk == "graph":
        raise InputError(f"{label} is a graph model: it needs a graph dataset ({_GRAPH_DATASETS}), not the {dk} "
                         f"dataset {dataset}; leave the dataset out for {GRAPH_DEFAULT}")
    if dk == "graph":
        raise InputError(f"{label} is an image model: the graph dataset {dataset} needs a graph model (gcn, sage or "
                         f"gat); leave the dataset out for {IMAGE_DEFAULT}")
    raise InputError(f"{label} is an image model: the text dataset {dataset} needs a language model (lstm-lm or "
                     f"transformer-lm); leave the dataset out for {IMAGE_DEFAULT}")


# What an image model registered for another input was made for (the registry's ``input`` kinds), for the warning
_MADE_FOR = {"cifar": "CIFAR's 3x32x32", "imagenet": "ImageNet's 3x224x224"}


def default_input_warning(model: str, dataset: str | None, input_shape_given: bool) -> str | None:
    """One line when ``model`` meets the embedded image default's input only because no dataset was named: an image
    model made for another input (a CIFAR or ImageNet network, any torchvision: / timm: one) priced or profiled on
    digits' 1x8x8 images costs next to nothing, and nothing else would say so. None when a dataset or an input
    shape was given, for a model made for digits or for any input (digits-cnn, mlp), and for a language or graph
    model (their embedded corpus and graph are ordinary inputs of theirs)."""
    if dataset is not None or input_shape_given or model_kind(model) != "image":
        return None
    from cptsim.models import model_info

    made_for = model_info(model)["input"]
    if made_for in ("digits", "any"):
        return None
    from .registry import nominal_info

    shape = "x".join(str(d) for d in nominal_info(IMAGE_DEFAULT).input_shape)
    own = _MADE_FOR.get(made_for, f"{made_for} input")
    return (f"no --dataset: {model} (made for {own} input) is costed on the embedded default dataset, "
            f"{IMAGE_DEFAULT} ({shape} input); give --dataset (e.g. cifar10, imagefolder) or --input-shape C,H,W "
            "for its own")
