"""The dataset a workload uses when none is named: the embedded one of the model's kind.

A language model (a model registered with ``input="text"``: lstm-lm, transformer-lm) gets the embedded text corpus
(``pydoc-chars``), every other model the embedded digits, so that ``cptsim train --model lstm-lm`` (and plan, cost,
profile, sweep, range-test, ``TrainConfig`` and ``RunRecorder``) works with no other flag. A dataset that is named
is used as named: one of the other kind stays an error, raised where the model meets the data (``create_model``).
"""

from __future__ import annotations

from cptsim.errors import InputError

__all__ = ["default_dataset", "model_kind", "dataset_kind", "check_pairing", "IMAGE_DEFAULT", "TEXT_DEFAULT"]

IMAGE_DEFAULT = "digits"
TEXT_DEFAULT = "pydoc-chars"  # cptsim.data.text.EMBEDDED
_BY_KIND = {"text": TEXT_DEFAULT}  # a graph model's kind would map to "karate" once graph models exist


def model_kind(model) -> str | None:
    """"text" for a language model, "image" for the others, None for a name the registry does not know. ``model``:
    a registry name, or a built model (one of cptsim's language models is "text", any other module "image")."""
    if isinstance(model, str):
        from cptsim.models import model_info

        try:
            kind = model_info(model)["input"]
        except InputError:
            return None
        return "text" if kind == "text" else "image"
    from cptsim.models.text import LSTMLM, TransformerLM

    return "text" if isinstance(model, (LSTMLM, TransformerLM)) else "image"


def dataset_kind(name: str) -> str | None:
    """"text" for a token-sequence dataset, "image" for the others, None for a name the registry does not know."""
    from .registry import nominal_info

    try:
        shape = nominal_info(name).input_shape
    except InputError:
        return None
    return "text" if len(tuple(shape)) == 1 else "image"


def default_dataset(model) -> str:
    """The embedded dataset of ``model``'s kind (see the module docstring; a name or a built model). An unknown
    model name gets the image default: the model's own error is raised where it is built, with the list of names."""
    return TEXT_DEFAULT if model_kind(model) == "text" else IMAGE_DEFAULT


def check_pairing(model, dataset: str) -> None:
    """An InputError when a known model and a known dataset are of different kinds (a language model on images,
    an image model on text); anything unknown passes (it is checked where it is built)."""
    mk, dk = model_kind(model), dataset_kind(dataset)
    if mk is None or dk is None or mk == dk:
        return
    label = model if isinstance(model, str) else type(model).__name__
    if mk == "text":
        raise InputError(f"{label} is a language model: it needs a text dataset (ptb, wikitext-2, wikitext-103, "
                         f"{TEXT_DEFAULT}), not the image dataset {dataset}; leave the dataset out for {TEXT_DEFAULT}")
    raise InputError(f"{label} is an image model: the text dataset {dataset} needs a language model (lstm-lm or "
                     f"transformer-lm); leave the dataset out for {IMAGE_DEFAULT}")
