"""data/: the dataset registry and the dataset families (the "data" of "model + data" in the data flow).

- ``registry``: ``dataset_info``, ``epoch_size``, ``load_datasets``, ``register_dataset`` (the public way a family
  registers), and the image datasets: sklearn digits (embedded), CIFAR-10/100, MNIST, Fashion-MNIST, ImageNet-style
  folders, ``synthetic:C,H,W:K[:N]``;
- ``text``: the text corpora (PTB, WikiText-2/103, the embedded pydoc-chars) and per-token evaluation;
- ``graph``: the graph datasets, one sample = the whole graph (karate, embedded via PyG; Planetoid's cora, citeseer,
  pubmed and any ``planetoid`` folder; ogbn-arxiv; ``synthetic-graph:N,F,K[:DEG]``), ``Graph`` and ``GraphSplit``;
- ``defaults``: ``default_dataset(model)``, the embedded dataset of a model's kind (when ``--dataset`` is not given).

Nothing here ever downloads. May import: ``cptsim.errors``, ``cptsim.numerics``, ``cptsim.models``.
"""

from .registry import (  # noqa: F401
    CIFAR100_MEAN, CIFAR100_STD, CIFAR10_MEAN, CIFAR10_STD, DIGITS_SPLIT_SEED, DataInfo, FASHION_MEAN,
    FASHION_STD, IMAGEFOLDER_DEFAULT_SIZE, IMAGENET_MEAN, IMAGENET_STD, MAX_IMAGE_SIZE, MNIST_MEAN, MNIST_STD,
    SMALL_IMAGE, SYNTHETIC, SYNTHETIC_DEFAULT_N, SYNTHETIC_FORM, SYNTHETIC_MAX_ELEMENTS, SYNTHETIC_SEED,
    SyntheticDataset, check_data_dir, check_given_data_dir, dataset_info, dataset_size, epoch_size,
    imagefolder_transforms, list_datasets, load_datasets, native_image_size, needs_data_dir, nominal_info, parse_synthetic,
    register_dataset, register_prefix, resolve_image_size, synthetic_test_size)
from . import text  # noqa: E402,F401  (registers ptb, wikitext-2, wikitext-103, pydoc-chars)
from . import graph  # noqa: E402,F401  (registers karate, planetoid, cora, citeseer, pubmed, ogbn-arxiv, ...)
from .graph import Graph, GraphSplit  # noqa: E402,F401
from .defaults import (check_pairing, dataset_kind, default_dataset, default_input_warning,  # noqa: E402,F401
                       model_kind)
