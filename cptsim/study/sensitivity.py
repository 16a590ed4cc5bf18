"""Per-layer sensitivity, measured on the user's workload in a short pass: two estimates and their cost.

1. ``hessian`` (HAWQ-V2/V3, PyHessian): Hutchinson's estimate of the trace of each layer's block of the loss Hessian,
   tr(H_l) ~ mean over Rademacher vectors v of v_l . (H v)_l, from double backward at full precision (no quantizer
   op: the model's own Hessian, as HAWQ takes it). The layer's sensitivity is HAWQ's perturbation
   Omega_l = tr(H_l) / n_l * ||Q_qmin(W_l) - W_l||^2: the expected loss increase of quantizing its weight to q_min.
2. ``loss`` (cheaper: forward passes only): the loss increase when this layer alone runs at q_min and every other
   quantized layer at q_max, on the same fixed batches, in evaluation mode (the activation ranges of training).

Number formats: with a float family (``number_format`` fp | mx | nvfp, ``grad_format``) both probe in the
run's formats: the warm-up trains in them, ``hessian`` takes the perturbation of quantizing W to the format q_min names
(``formats.quantize`` along the weight's input dimension, as the layers do), ``loss`` runs the layer alone in that
format and the others in q_max's. A width the family lacks names the next wider format (mx: q_min 2 probes MXFP4).

The pass: build the workload as ``cptsim train`` does, train ``warmup`` steps at static q_max (sensitivity at random
initialisation says little), then measure on ``batches`` fixed batches. Pure where it can be: ``hutchinson_trace``
and ``weight_perturbation`` are functions of a model and tensors; ``measure`` holds the state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["SENSITIVITY_FORMAT", "hutchinson_trace", "weight_perturbation", "loss_increase", "measure"]

SENSITIVITY_FORMAT = "cptsim.sensitivity/1"
METHODS = ("hessian", "loss")


def _loss(model, batches) -> torch.Tensor:
    total = sum(F.cross_entropy(model(x), y, reduction="sum") for x, y in batches)
    return total / sum(int(y.numel()) for _, y in batches)


def hutchinson_trace(model, layers: dict, batches, samples: int, seed: int = 0) -> dict:
    """{layer: tr(H_l)} by Hutchinson with ``samples`` Rademacher vectors over every layer's weight at once (the
    per-layer traces of the block-diagonal share each Hessian-vector product)."""
    weights = [m.weight for m in layers.values()]
    gen = torch.Generator().manual_seed(seed)
    acc = [0.0] * len(weights)
    loss = _loss(model, batches)
    grads = torch.autograd.grad(loss, weights, create_graph=True)
    for s in range(samples):
        vs = [(torch.randint(0, 2, w.shape, generator=gen, dtype=torch.float32) * 2 - 1).to(w.device)
              for w in weights]
        hv = torch.autograd.grad(grads, weights, grad_outputs=vs, retain_graph=s + 1 < samples)
        for i, (v, h) in enumerate(zip(vs, hv)):
            acc[i] += float((v * h).sum())
    return {n: a / samples for n, a in zip(layers, acc)}


def weight_perturbation(weight: torch.Tensor, bits: int, fmt=None) -> float:
    """||Q_bits(W) - W||^2 with the training's weight quantizer (per output channel, round to nearest); ``fmt`` (a
    float ``Format``, the one ``bits`` names in the run's family): W in that format, blocked along dimension 1 (the
    weight's input channels, the GEMM's reduction), as the quantized layers quantize it."""
    from cptsim.numerics.quant import quantize_weight

    with torch.no_grad():
        if fmt is not None:
            from cptsim.numerics.formats import quantize

            return float(((quantize(weight, fmt, dim=1 if weight.dim() > 1 else -1) - weight) ** 2).sum())
        return float(((quantize_weight(weight, bits) - weight) ** 2).sum())


def loss_increase(model, precision, layers: dict, batches, q_min: int, q_max: int, g_bits: int) -> tuple[float, dict]:
    """(loss with every quantized layer at q_max, {layer: loss with it alone at q_min minus that})."""
    from cptsim.numerics.layers import PrecisionState, assign_precision

    low = PrecisionState(formats=precision.formats)  # a float family: q_min's format (module docstring)
    low.set(q_min, g_bits)
    precision.set(q_max, g_bits)
    with torch.no_grad():
        ref = float(_loss(model, batches))
        out = {}
        for n, m in layers.items():
            assign_precision(model, {n: low})
            out[n] = float(_loss(model, batches)) - ref
            assign_precision(model, {n: precision})
    return ref, out


@dataclass
class Settings:
    model: str = "digits-cnn"
    dataset: str | None = None
    data_dir: str | None = None
    batch_size: int | None = None
    q_min: int = 2
    q_max: int = 8
    g_bits: int = 8
    warmup: int = 50
    batches: int = 4
    samples: int = 16
    seed: int = 0
    methods: tuple = METHODS
    fp_layers: list | None = None
    number_format: str = "int"  # the run's format family (cptsim.numerics.families); "int": CPT's integers
    grad_format: str | None = None

    def validate(self) -> None:
        from cptsim.errors import InputError
        from cptsim.numerics.families import format_map
        from cptsim.numerics.quant import check_bits

        format_map(self.number_format or "int", self.grad_format)  # unknown names, a lone grad format: one line
        for name in ("q_min", "q_max", "g_bits"):
            check_bits(getattr(self, name), f"--{name.replace('_', '-')}")
        if not 1 <= self.q_min <= self.q_max <= 16:
            raise InputError(f"--q-min {self.q_min} and --q-max {self.q_max} must satisfy 1 <= q-min <= q-max <= 16")
        for name in ("batches", "samples"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise InputError(f"--warmup must be >= 0, got {self.warmup}")
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise InputError(f"unknown --method {','.join(bad) or '(none)'}; choose from {', '.join(METHODS)}")


def measure(s: Settings) -> dict:
    """The sensitivity document (``SENSITIVITY_FORMAT``): per layer, each method's value and the weights the planner
    takes (normalised to sum 1), each method's time and passes, the workload key it belongs to."""
    from cptsim.numerics import ckernels  # noqa: F401  (the eager quantizers: double backward needs them)
    from cptsim.run.config import TrainConfig, run_workload, workload_key
    from cptsim.run.train import build, epoch_batches, resolved_config

    s.validate()
    cfg = TrainConfig(model=s.model, dataset=s.dataset, data_dir=s.data_dir, batch_size=s.batch_size,
                      steps=max(s.warmup, 1), schedule=f"static:{s.q_max}:g{s.g_bits}", seed=s.seed,
                      fp_layers=s.fp_layers, augment=False, recal_batches=0,
                      number_format=s.number_format or "int", grad_format=s.grad_format)
    t0 = time.perf_counter()
    w = build(cfg)
    model = w.model
    layers = {n: m for n, m in model.named_modules() if n in set(w.quantized_layers) and hasattr(m, "weight")}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, momentum=cfg.momentum)
    w.set_bits(s.q_max, s.g_bits)
    model.train()
    fixed = []
    step = 0
    for epoch in range(10 ** 6):
        for _, _, batch in epoch_batches(cfg, w, epoch, 0, w.steps_per_epoch, 0, 1):
            if batch is None:
                continue
            if len(fixed) < s.batches:
                fixed.append((batch[0], batch[1]))
            if step < s.warmup:
                opt.zero_grad()
                F.cross_entropy(model(batch[0]), batch[1]).backward()
                opt.step()
            step += 1
            if step >= s.warmup and len(fixed) >= s.batches:
                break
        if step >= s.warmup and len(fixed) >= s.batches:
            break
    warm_s = time.perf_counter() - t0
    model.eval()
    out = {"format": SENSITIVITY_FORMAT, "model": s.model, "dataset": w.info.name, "q_min": s.q_min,
           "q_max": s.q_max, "g_bits": s.g_bits, "warmup_steps": s.warmup, "batches": len(fixed),
           "batch_size": cfg.batch_size, "seed": s.seed,
           "workload_key": workload_key(run_workload(resolved_config(cfg, w))),
           "warmup_s": round(warm_s, 4), "methods": {}, "layers": []}
    fmap = w.precision.formats
    low_fmt = None
    if fmap is not None:  # what q_min and q_max ran as (integer documents stay as they were)
        from cptsim.numerics.formats import parse_format

        low_fmt = parse_format(fmap.fwd_names[s.q_min])
        out["number_format"] = {**fmap.to_json(), "q_min_format": fmap.fwd_names[s.q_min],
                                "q_max_format": fmap.fwd_names[s.q_max]}
    rows = {n: {"name": n, "params": int(m.weight.numel())} for n, m in layers.items()}
    if "hessian" in s.methods:
        t = time.perf_counter()
        w.set_all(32, 32)  # the model's own Hessian: no quantizer op, so double backward is exact
        trace = hutchinson_trace(model, layers, fixed, s.samples, s.seed)
        for n, m in layers.items():
            dw = weight_perturbation(m.weight, s.q_min, low_fmt)
            rows[n].update(hessian_trace=trace[n], weight_delta_sq=dw, hessian=trace[n] / rows[n]["params"] * dw)
        out["methods"]["hessian"] = {"time_s": round(time.perf_counter() - t, 4), "hvp": s.samples,
                                     "definition": "tr(H_l)/n_l * ||Q_qmin(W_l) - W_l||^2 (HAWQ-V3), Hutchinson"}
    if "loss" in s.methods:
        t = time.perf_counter()
        ref, inc = loss_increase(model, w.precision, layers, fixed, s.q_min, s.q_max, s.g_bits)
        for n in layers:
            rows[n]["loss"] = inc[n]
        out["methods"]["loss"] = {"time_s": round(time.perf_counter() - t, 4), "forward_passes": len(layers) + 1,
                                  "reference_loss": ref,
                                  "definition": "loss(layer alone at q_min, others at q_max) - loss(all at q_max)"}
    out["layers"] = list(rows.values())
    for m in out["methods"]:
        out["methods"][m]["weights"] = weights(out, m)
    return out


def weights(doc: dict, method: str) -> dict:
    """{layer: weight >= 0}, summing to 1: the method's values clipped at 0 (a layer whose loss fell at q_min is
    noise-level insensitive), equal weights where every value is 0."""
    vals = {r["name"]: max(float(r.get(method, 0.0) or 0.0), 0.0) for r in doc["layers"]}
    total = sum(vals.values())
    n = len(vals)
    return {k: (v / total if total > 0 else 1.0 / n) for k, v in vals.items()}
