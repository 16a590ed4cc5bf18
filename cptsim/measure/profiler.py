"""Measured per-layer MACs: what each training step really executes, per phase (forward, dgrad, wgrad).

In the style of fvcore / ``torch.utils.flop_counter``: a table ``COUNTERS`` from module type to a counting function
``fn(module, input, output) -> MACs``; supporting another layer type is one entry. Types are matched through the MRO,
so ``QConv2d`` / ``QLinear`` (subclasses of ``nn.Conv2d`` / ``nn.Linear``) use their base class's counter.

Counting rules ("count what executes"), applied by a forward hook per layer:

* forward: every call while ``MacCounter.enabled`` (the training loop turns it off for evaluation);
* dgrad (error x weight -> input gradient): only if grad mode is on and the layer's input requires grad, so the
  first layer, whose input is the data, has none;
* wgrad (error x input -> weight gradient): only if grad mode is on and the weight requires grad (frozen -> 0);
* a layer called several times in one step accumulates every call.

For Conv and Linear each of the three GEMMs has the forward's MAC count (dgrad is the transposed conv of the
error with the same weights, wgrad the correlation of input and error), so one number per call serves all three
phases. The hooks only read shapes and do integer arithmetic: no tensor ops, no ``.item()``, no syncs.
Activation checkpointing re-runs forwards during backward; those re-runs are counted as executed forwards
(and would count their backward again), which is the one case where hooks and reality part.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import torch
import torch.nn as nn

from cptsim.errors import InputError
from cptsim.numerics.lm_layers import Matmul, matmul_macs

__all__ = [
    "PHASES",
    "PROFILE_FORMAT",
    "MATMUL_TYPES",
    "COUNTERS",
    "conv2d_macs",
    "linear_macs",
    "counter_for",
    "LayerRecord",
    "GEMM_KEYS",
    "gemm_shape",
    "LayerProfile",
    "ProfileArrays",
    "MacCounter",
    "profile_model",
]

PHASES = ("fwd", "dgrad", "wgrad")
NUMEL_KEYS = ("weight", "input", "output")
# The forward GEMM of a layer, as a GPU kernel tiles it (cptsim.cost.hardware.gpu_kernels): ``groups``
# independent GEMMs per call (a grouped or depthwise conv), each ``n`` output columns by ``k`` deep, over ``rows``
# output rows per sample (summed over calls; conv: output positions, linear: tokens, attention: batched rows);
# ``rows_per_gemm`` > 0 when the rows come as a batch of separate GEMMs of that many rows (attention's bmm),
# 0 when all of a call's rows, batch included, form one GEMM (conv, linear).
GEMM_KEYS = ("groups", "n", "k", "rows", "rows_per_gemm")


def is_depthwise_gemm(groups, n):
    """A depthwise convolution: more than one group, one output column each (scalars or arrays alike)."""
    return (n == 1) & (groups > 1)
PROFILE_FORMAT = "cptsim.profile/2"  # /2 adds "ops": every op of the step (cptsim.measure.opcount)
READABLE_FORMATS = ("cptsim.profile/1", PROFILE_FORMAT)
# Layer types whose GEMMs are matrix multiplies (cuBLAS on a GPU; torch.backends.cuda.matmul.allow_tf32 governs
# their FP32 precision), as opposed to convolutions (cuDNN; torch.backends.cudnn.allow_tf32).
MATMUL_TYPES = frozenset({"Linear", "Matmul"})


# ------------------------------------------------------------------------------------------------ counting functions


def conv2d_macs(module: nn.Conv2d, input: torch.Tensor, output: torch.Tensor) -> int:
    """N·Cout·Hout·Wout · (Cin/groups)·kh·kw, read from the real output shape.

    Using the output shape makes stride, padding and dilation free: each output element is one dot product of
    (Cin/groups)·kh·kw terms, whatever produced its position. Works unchanged for Conv1d/Conv3d shapes.
    """
    per_output = module.in_channels // module.groups
    for k in module.kernel_size:
        per_output *= k
    return output.numel() * per_output


def linear_macs(module: nn.Linear, input: torch.Tensor, output: torch.Tensor) -> int:
    """prod(input.shape[:-1]) · in_features · out_features, for input of any rank (B, F), (B, T, F), ..."""
    return input.numel() * module.out_features


COUNTERS: dict[type, Callable[[nn.Module, torch.Tensor, Any], int]] = {
    nn.Conv2d: conv2d_macs,
    nn.Linear: linear_macs,
    Matmul: matmul_macs,  # attention's two activation-by-activation matmuls (cptsim.numerics.lm_layers)
}


def _weight_numel(m: nn.Module) -> int:
    w = getattr(m, "weight", None)
    return int(w.numel()) if isinstance(w, torch.Tensor) else 0


def counter_for(cls: type) -> tuple[type, Callable] | None:
    """(the COUNTERS key, its counting function) for a module class, via its MRO; None if not counted."""
    for base in cls.__mro__:
        fn = COUNTERS.get(base)
        if fn is not None:
            return base, fn
    return None


def _is_quantized(module: nn.Module) -> bool:
    from cptsim.numerics.layers import QUANTIZED_TYPES

    return isinstance(module, QUANTIZED_TYPES)


# ------------------------------------------------------------------------------------------------ records


@dataclass
class LayerRecord:
    """One counted layer. ``macs`` are per sample and per phase; ``numel``: weight total, input/output per sample
    (summed over the layer's calls in a step); ``calls`` per step; ``operand``: elements per sample of a weightless
    layer's second operand (attention's ``Matmul(a, b)``: K or V), summed over calls, 0 for layers with a weight."""

    name: str
    type: str
    quantized: bool
    macs: dict[str, int]
    numel: dict[str, int]
    calls: int = 1
    gemm: dict | None = None  # the forward GEMM's shape (``gemm_shape``); None where the layer type has none
    operand: int = 0

    def to_json(self) -> dict:
        d = {"name": self.name, "type": self.type, "quantized": self.quantized,
             "macs": {p: int(self.macs[p]) for p in PHASES},
             "numel": {k: int(self.numel[k]) for k in NUMEL_KEYS}, "calls": int(self.calls)}
        if self.gemm is not None:
            d["gemm"] = {k: int(self.gemm[k]) for k in GEMM_KEYS}
        if self.operand:
            d["operand"] = int(self.operand)
        return d


@dataclass
class ProfileArrays:
    """Numpy views of a profile for the cost model (rows in layer order).

    macs (L, 3) float64 per sample, columns PHASES; quantized (L,) bool; numel (L, 3) float64, columns
    weight (total), input, output (per sample, summed over calls); calls (L,) float64.
    """

    names: list[str]
    macs: np.ndarray
    quantized: np.ndarray
    numel: np.ndarray
    calls: np.ndarray
    ops: Any = None  # the step's other ops (cptsim.measure.opcount.OpProfile), when the profile has them
    gemm: np.ndarray | None = None  # (L, 5) GEMM_KEYS per layer; NaN rows where a layer has no shape record
    is_conv: np.ndarray | None = None  # (L,) bool: a convolution (its kernel depends on the memory format)
    matmul: Any = None  # (L,) bool: the layer's GEMMs are matmuls (MATMUL_TYPES), not convolutions; None: unknown
    channels_last: bool = False  # the step's memory format: NHWC (channels_last) or PyTorch's default NCHW
    operand: np.ndarray | None = None  # (L,) float64: second-operand elements per sample (LayerRecord.operand)

    def __len__(self) -> int:
        return len(self.names)


def _bad(msg: str) -> InputError:
    return InputError(f"profile: {msg}")


def _count(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
        raise _bad(f"{where} must be an integer >= 0, got {v!r}")
    return int(v)


def _gemm_record(g: Any, where: str) -> dict | None:
    if g is None:
        return None  # profiles written before the shapes were recorded
    if not isinstance(g, dict) or any(k not in g for k in GEMM_KEYS):
        raise _bad(f"{where}.gemm must be an object with keys {', '.join(GEMM_KEYS)}")
    return {k: _count(g[k], f"{where}.gemm.{k}") for k in GEMM_KEYS}


def gemm_shape(module: nn.Module, x: torch.Tensor, output: torch.Tensor) -> tuple[int, int, int, int, int] | None:
    """(groups, n, k, rows of this call, rows_per_gemm) of a counted layer's forward GEMM; None for other types."""
    if isinstance(module, nn.Conv2d):
        g = module.groups
        kk = 1
        for d in module.kernel_size:
            kk *= d
        return g, module.out_channels // g, module.in_channels // g * kk, output.numel() // module.out_channels, 0
    if isinstance(module, nn.Linear):
        return 1, module.out_features, module.in_features, output.numel() // module.out_features, 0
    if isinstance(module, Matmul) and output.dim() >= 2:
        n = int(output.shape[-1])
        return 1, n, int(x.shape[-1]), output.numel() // max(n, 1), int(output.shape[-2])
    return None


@dataclass
class LayerProfile:
    """Per-sample MACs of every counted layer of a model, as measured in one real training step."""

    model: str
    input_shape: list[int]
    layers: list[LayerRecord] = field(default_factory=list)
    ops: Any = None  # cptsim.measure.opcount.OpProfile: every op of the step (format /2); None in /1 files
    # The memory format the step runs in: a GPU's convolutions cost differently in NHWC (channels_last) and in
    # PyTorch's default NCHW (cptsim.cost.hardware.gpu_kernels); MACs and bytes do not depend on it.
    channels_last: bool = False

    def to_json(self) -> dict:
        d = {"format": PROFILE_FORMAT, "model": self.model, "input_shape": [int(s) for s in self.input_shape],
             "layers": [r.to_json() for r in self.layers]}
        if self.ops is not None:
            d["ops"] = self.ops.to_json()
        if self.channels_last:
            d["memory_format"] = "channels_last"
        return d

    @classmethod
    def from_json(cls, d: Any) -> "LayerProfile":
        if not isinstance(d, dict):
            raise _bad(f"expected a JSON object with \"format\": {PROFILE_FORMAT!r}, got {type(d).__name__}")
        fmt = d.get("format")
        if fmt not in READABLE_FORMATS:
            raise _bad(f"format must be {PROFILE_FORMAT!r} (or the older {READABLE_FORMATS[0]!r}), got {fmt!r}")
        for key in ("model", "input_shape", "layers"):
            if key not in d:
                raise _bad(f"missing key {key!r}")
        shape = d["input_shape"]
        if not isinstance(shape, list) or not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                                                           for s in shape):
            raise _bad(f"input_shape must be a list of positive integers, got {shape!r}")
        if not isinstance(d["layers"], list):
            raise _bad(f"layers must be a list, got {type(d['layers']).__name__}")
        layers = []
        for i, r in enumerate(d["layers"]):
            where = f"layers[{i}]"
            if not isinstance(r, dict):
                raise _bad(f"{where} must be an object")
            for key in ("name", "type", "quantized", "macs", "numel"):
                if key not in r:
                    raise _bad(f"{where} lacks key {key!r}")
            if not isinstance(r["name"], str) or not isinstance(r["type"], str):
                raise _bad(f"{where}.name and .type must be strings")
            if not isinstance(r["quantized"], bool):
                raise _bad(f"{where}.quantized must be true or false, got {r['quantized']!r}")
            for key, names in (("macs", PHASES), ("numel", NUMEL_KEYS)):
                if not isinstance(r[key], dict) or any(n not in r[key] for n in names):
                    raise _bad(f"{where}.{key} must be an object with keys {', '.join(names)}")
            layers.append(LayerRecord(
                name=r["name"], type=r["type"], quantized=r["quantized"],
                macs={p: _count(r["macs"][p], f"{where}.macs.{p}") for p in PHASES},
                numel={k: _count(r["numel"][k], f"{where}.numel.{k}") for k in NUMEL_KEYS},
                calls=_count(r.get("calls", 1), f"{where}.calls"),
                gemm=_gemm_record(r.get("gemm"), where),
                operand=_count(r.get("operand", 0), f"{where}.operand"),
            ))
        model = d["model"]
        if not isinstance(model, str):
            raise _bad(f"model must be a string, got {model!r}")
        ops = None
        if d.get("ops") is not None:
            from .opcount import OpProfile

            ops = OpProfile.from_json(d["ops"])
        fmt = d.get("memory_format", "contiguous")
        if fmt not in ("contiguous", "channels_last"):
            raise _bad(f'memory_format must be "contiguous" or "channels_last", got {fmt!r}')
        return cls(model=model, input_shape=list(shape), layers=layers, ops=ops, channels_last=fmt == "channels_last")

    def op_mix(self) -> list[str]:
        """The kinds of kernel that make up this network (``cptsim.cost.hardware.files.OP_MIXES``), so that a time
        estimate can say whether the networks its profile was checked on had them: dense convolutions, grouped
        ones, depthwise ones, attention (matmul layers or fused kernels), linear-dominated (over half the forward
        MACs in Linear layers), recurrent (LSTM)."""
        mix = set()
        fwd = sum(r.macs["fwd"] for r in self.layers) or 1
        lin = 0
        for r in self.layers:
            g = r.gemm or {}
            if r.type == "Conv2d":
                groups = g.get("groups", 1)
                mix.add("conv" if groups == 1 else "depthwise" if is_depthwise_gemm(groups, g.get("n")) else "grouped")
            elif r.type == "Matmul":
                mix.add("attention")
            elif r.type == "Linear":
                lin += r.macs["fwd"]
            if r.name.endswith(".hh"):  # a recurrent layer's hidden-to-hidden GEMM (cptsim.numerics.lm_layers)
                mix.add("lstm")
        if lin * 2 > fwd:
            mix.add("linear")
        if self.ops is not None and any(o.kind == "attention" for o in self.ops.records):
            mix.add("attention")
        return sorted(mix)

    def totals(self) -> dict[str, int]:
        """Per-phase MACs per sample, summed over layers."""
        return {p: sum(r.macs[p] for r in self.layers) for p in PHASES}

    def arrays(self) -> ProfileArrays:
        return ProfileArrays(
            names=[r.name for r in self.layers],
            macs=np.array([[r.macs[p] for p in PHASES] for r in self.layers], dtype=np.float64).reshape(-1, 3),
            quantized=np.array([r.quantized for r in self.layers], dtype=bool),
            numel=np.array([[r.numel[k] for k in NUMEL_KEYS] for r in self.layers], dtype=np.float64).reshape(-1, 3),
            calls=np.array([r.calls for r in self.layers], dtype=np.float64),
            ops=self.ops,
            matmul=np.array([r.type in MATMUL_TYPES for r in self.layers], dtype=bool),
            gemm=np.array([[r.gemm[k] for k in GEMM_KEYS] if r.gemm is not None else [np.nan] * len(GEMM_KEYS)
                           for r in self.layers], dtype=np.float64).reshape(-1, len(GEMM_KEYS)),
            is_conv=np.array([r.type == "Conv2d" for r in self.layers], dtype=bool),
            channels_last=bool(self.channels_last),
            operand=np.array([r.operand for r in self.layers], dtype=np.float64),
        )


# ------------------------------------------------------------------------------------------------ the counter

# Accumulator slots of one layer (a plain list: the hook's integer adds are the whole per-step cost).
_FWD, _DGRAD, _WGRAD, _CALLS, _IN, _OUT, _ROWS, _OPND = range(8)


class MacCounter:
    """Attach to a model (forward hooks on every layer type in COUNTERS); counts what each training step executes.

    ``reset()`` at the start of a step, run the step, read ``step_macs()`` (batch included) or
    ``layer_profile(batch, shape)`` (per sample). Set ``enabled = False`` around work that must not count
    (evaluation). ``close()`` (or leaving a ``with`` block) removes the hooks.
    """

    def __init__(self, model: nn.Module, model_name: str = ""):
        self.model_name = model_name
        self.enabled = True
        self._modules: list[nn.Module] = []
        self._names: list[str] = []
        self._types: list[str] = []
        self._acc: list[list[int]] = []
        self._shapes: list[dict] = []  # per layer: the forward GEMM's (groups, n, k, rows_per_gemm), first call
        self._handles: list = []
        for name, module in model.named_modules():
            found = counter_for(type(module))
            if found is None:
                continue
            base, fn = found
            acc = [0, 0, 0, 0, 0, 0, 0, 0]
            shape: dict = {}
            self._modules.append(module)
            self._names.append(name or type(module).__name__)
            self._types.append(base.__name__)
            self._acc.append(acc)
            self._shapes.append(shape)
            self._handles.append(module.register_forward_hook(self._hook(module, fn, acc, shape), with_kwargs=True))

    def _hook(self, owner: nn.Module, fn: Callable, acc: list[int], shape: dict) -> Callable:
        grad_enabled = torch.is_grad_enabled

        def hook(module, args, kwargs, output):
            # `module is owner`: a deepcopy of the model carries this hook along; its calls are not ours.
            if not self.enabled or module is not owner:
                return
            x = args[0] if args else next(iter(kwargs.values()))
            n = fn(module, x, output)
            acc[_FWD] += n
            if grad_enabled():
                if x.requires_grad:
                    acc[_DGRAD] += n
                # a weightless layer (attention's Matmul, called m(a, b)) has its second operand where a layer
                # has its weight: its "dgrad" is the gradient w.r.t. a (error x b), its "wgrad" the one w.r.t. b
                w = args[1] if len(args) > 1 else getattr(module, "weight", None)
                if w is not None and w.requires_grad:
                    acc[_WGRAD] += n
            acc[_CALLS] += 1
            acc[_IN] += x.numel()
            acc[_OUT] += output.numel()
            if len(args) > 1 and isinstance(args[1], torch.Tensor):  # Matmul(a, b): b is read (and its grad written)
                acc[_OPND] += args[1].numel()
            if shape.get("none") is None:
                gs = gemm_shape(module, x, output)
                if gs is None:
                    shape["none"] = True
                else:
                    shape.update(groups=gs[0], n=gs[1], k=gs[2], rows_per_gemm=gs[4])
                    acc[_ROWS] += gs[3]

        return hook

    # -- per step

    def reset(self) -> None:
        """Start a new step: zero every count."""
        for acc in self._acc:
            acc[:] = (0, 0, 0, 0, 0, 0, 0, 0)

    def step_macs(self) -> dict[str, int]:
        """MACs of everything counted since ``reset``, per phase, batch included."""
        return {p: sum(acc[i] for acc in self._acc) for i, p in enumerate(PHASES)}

    def step_arrays(self) -> ProfileArrays:
        """The counted step as ProfileArrays with the batch included (macs and input/output numel are totals), so
        ``cost.step_cost(counter.step_arrays(), q, g, batch=1)`` costs exactly what was measured."""
        return ProfileArrays(
            names=list(self._names),
            macs=np.array([acc[:3] for acc in self._acc], dtype=np.float64).reshape(-1, 3),
            quantized=np.array([_is_quantized(m) for m in self._modules], dtype=bool),
            numel=np.array([[_weight_numel(m), acc[_IN], acc[_OUT]] for m, acc in zip(self._modules, self._acc)],
                           dtype=np.float64).reshape(-1, 3),
            calls=np.array([acc[_CALLS] for acc in self._acc], dtype=np.float64),
            matmul=np.array([t in MATMUL_TYPES for t in self._types], dtype=bool),
            operand=np.array([acc[_OPND] for acc in self._acc], dtype=np.float64),
        )

    def layer_profile(self, batch_size: int, input_shape: Iterable[int]) -> LayerProfile:
        """Per-sample profile of the last counted step (every count divided by ``batch_size``)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
        b = batch_size

        def per_sample(v: int) -> int:
            return (v + b // 2) // b  # exact for layers that see the batch; rounded otherwise

        layers = []
        for m, name, typ, acc, shape in zip(self._modules, self._names, self._types, self._acc, self._shapes):
            gemm = None
            if "n" in shape and acc[_CALLS]:
                gemm = {"groups": shape["groups"], "n": shape["n"], "k": shape["k"], "rows": per_sample(acc[_ROWS]),
                        "rows_per_gemm": shape["rows_per_gemm"]}
            layers.append(LayerRecord(
                name=name, type=typ, quantized=_is_quantized(m),
                macs={p: per_sample(acc[i]) for i, p in enumerate(PHASES)},
                numel={"weight": _weight_numel(m),
                       "input": per_sample(acc[_IN]), "output": per_sample(acc[_OUT])},
                calls=acc[_CALLS], gemm=gemm, operand=per_sample(acc[_OPND]),
            ))
        return LayerProfile(model=self.model_name, input_shape=[int(s) for s in input_shape], layers=layers)

    # -- lifetime

    def close(self) -> None:
        """Remove the hooks (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> "MacCounter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------------------------------ one-shot profiling


def _random_batch(shape: Any, batch_size: int, device: torch.device) -> torch.Tensor:
    try:
        dims = [int(s) for s in shape]
    except (TypeError, ValueError):
        raise InputError(f"input shape must be sizes like (C, H, W) or (T, F), got {shape!r}") from None
    if not dims or any(s < 1 for s in dims):
        raise InputError(f"input shape must be positive sizes like (C, H, W) or (T, F), got {tuple(shape)}")
    return torch.randn(batch_size, *dims, device=device)


def profile_model(model: nn.Module, example_batch_or_input_shape: Any, batch_size: int = 2,
                  model_name: str = "") -> LayerProfile:
    """Per-sample MACs of one real training step: forward, cross-entropy on random labels, backward (no optimizer).

    Runs on a deepcopy of ``model`` in training mode, inside ``torch.random.fork_rng``, so the caller's weights,
    BatchNorm statistics, activation ranges, precision state and RNG streams are all untouched. Give an example
    batch (a tensor, first dim = batch) or a per-sample input shape ((C, H, W), (T, F)) for a random batch of
    ``batch_size``. The layers' ``requires_grad`` flags are kept, so frozen layers profile with wgrad 0.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    work = copy.deepcopy(model)
    work.train()
    param = next(work.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        torch.manual_seed(0)
        if isinstance(example_batch_or_input_shape, torch.Tensor):
            x = example_batch_or_input_shape.detach().to(device)
            if x.dim() < 2:
                raise InputError(f"example batch must have a batch dimension, got shape {tuple(x.shape)}")
            batch_size = int(x.shape[0])
        else:
            make = getattr(work, "example_input", None)  # a language model wants token ids, not floats
            x = (make(batch_size, example_batch_or_input_shape, device) if make is not None
                 else _random_batch(example_batch_or_input_shape, batch_size, device))
        shape = list(x.shape[1:])
        counter = MacCounter(work, model_name)
        try:
            try:
                out = work(x)
            except RuntimeError as e:
                # Nearly always a model that cannot take this input shape: the user's shape or model choice.
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise InputError(f"{model_name or type(model).__name__}: a training step on input shape "
                                 f"{tuple(shape)} failed: {reason}") from None
            if not isinstance(out, torch.Tensor) or out.dim() < 2 or out.shape[0] != batch_size:
                raise InputError(f"model output must be logits (batch, classes, ...), got "
                                 f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
            # Class dim 1, as F.cross_entropy expects; labels sized from the output.
            labels = torch.randint(out.shape[1], (out.shape[0], *out.shape[2:]), device=device)
            loss = nn.functional.cross_entropy(out.float(), labels)
            if loss.requires_grad:
                loss.backward()
            prof = counter.layer_profile(batch_size, shape)
        finally:
            counter.close()
        from .opcount import count_step_ops

        prof.ops = count_step_ops(model, x)  # the step's other ops, on fresh copies (the MACs above are untouched)
        return prof


def profile_named_model(model: str, shape: tuple[int, ...], num_classes: int,
                        fp_layers: list[str] | None = None) -> "LayerProfile":
    """Create a registry model, quantize it as training would, and profile one training step (per-sample MACs).

    ``fp_layers``: globs of layers kept at full precision; None = the model's own convention, resolved by the
    registry (``cptsim.models.default_fp_layers``); [] = quantize every layer. The step runs at the fresh
    PrecisionState's 32 bits (no quantizer ops): MACs do not depend on the bits, and the layers are the quantized
    ones, so each layer's ``quantized`` flag is what training will have."""
    from cptsim.models import create_model, default_fp_layers
    from cptsim.numerics.layers import quantize_model, resolve_fp_layers

    in_channels = shape[0] if len(shape) == 3 else 1
    torch_model = create_model(model, num_classes=num_classes, in_channels=in_channels, input_shape=shape)
    keep = default_fp_layers(torch_model) if fp_layers is None else resolve_fp_layers(torch_model, fp_layers)
    quantize_model(torch_model, fp_layers=keep)
    return profile_model(torch_model, shape, batch_size=2, model_name=model)
