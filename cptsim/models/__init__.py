"""models/: the model registry and the model families (the "model" of "model + data" in the data flow).

- ``registry``: ``create_model``, ``list_models``, ``model_info``, ``register_model``, and each model's
  full-precision-layer convention (``default_fp_layers``), resolved here and handed to
  ``cptsim.numerics.layers.quantize_model`` as a list;
- ``vision``: CIFAR ResNets, MobileNetV2, the digits CNN, MLPs, ImageNet ResNets;
- ``text``: lstm-lm and transformer-lm (built from ``cptsim.numerics.lm_layers``);
- ``graph``: gcn, sage and gat on PyTorch Geometric (imported only when one is built), ``bind_graph``,
  ``random_graph``;
- ``external``: ``torchvision:NAME`` and ``timm:NAME``;
- ``loss``: ``class_cross_entropy``, the training loss over any logits layout (the training loop's and the op counter's).

May import: ``cptsim.errors``, ``cptsim.numerics``. Never data, measurement, cost or anything later in the flow.
"""

from .registry import (FP_LAYERS_ATTR, _REGISTRY, create_model, default_fp_layers, list_models, meta_model,  # noqa: F401
                       model_info, register_model, register_resolver)
from . import vision, text, graph, external  # noqa: E402,F401  (each family registers its models)
from .vision import (BasicBlock, CifarResNet, DigitsCNN, MLP, MobileNetV2, TokenMLP,  # noqa: E402,F401
                     cifar_resnet_depths)
from .graph import GAT, GCN, GraphNet, GraphSAGE, bind_graph, is_graph_model, random_graph  # noqa: E402,F401

__all__ = ["create_model", "meta_model", "list_models", "model_info", "default_fp_layers", "register_model", "register_resolver",
           "cifar_resnet_depths", "CifarResNet", "BasicBlock", "MobileNetV2", "DigitsCNN", "MLP", "TokenMLP",
           "GraphNet", "GCN", "GraphSAGE", "GAT", "bind_graph", "random_graph", "is_graph_model"]
