"""CPT's precision range test: find the lowest forward precision at which a network starts to learn.

CPT (Fu et al., ICLR 2021) says q_min "can be identified using a simple precision range test within the first
few training epochs" but ships no implementation. The accepted reading (reference/papers.md), done here as a
real short training run:

1. build the real workload (quantized model, real data) with `cptsim.run.train.build`;
2. measure the untrained model's accuracy on the first `baseline_batches` training batches, in eval mode at
   q_start bits: the level the first stage's improvement is measured from;
3. train ONE model in stages at forward precision q_start, q_start+1, ..., q_max (`steps_per_stage` SGD steps
   each, default one epoch; gradient bits fixed), recording each stage's mean training accuracy and loss over
   the batches it trained on (train mode, the accuracy of the logits that produced each step's loss);
4. improvement(q) = accuracy(stage q) - accuracy(stage q-1) (the baseline for the first stage);
   q_min = the first q whose improvement exceeds `threshold` (`suggest_q_min`).

Why the first precision that improves, not the best one: accuracy keeps rising in later stages just because
training continues; the first jump marks the precision at which gradient steps start to carry signal.

Why threshold 0.05 (5 points of training accuracy, absolute): a stage's mean accuracy over one epoch of digits
(1437 samples) has a sampling error of about sqrt(0.25/1437) = 1.3 points at 50% accuracy, so the difference of
two stages about 1.9 points; 5 points is ~2.6 of those, above noise, yet well below what a network gains in
the stage where it starts learning (digits, seeds 0-2: +10 to +21 points at 2 bits, +39 to +45 at 3 bits). With much shorter stages (a few batches) the noise grows
(320 samples: ~4 points on the difference); use longer stages or a larger threshold there.

When no stage improves by more than the threshold the test is inconclusive (in practice: stages too short, or a
learning rate too low for the network to learn anything measurable). The suggestion is then the precision with the
largest positive improvement (lowest bits on ties), and q_max if none improved at all: without evidence that low
precision trains, the safe lower bound is the top one. `conclusive` says which case applied.

On the embedded digits workload (digits-cnn, batch 64, lr 0.05, one epoch per stage) 2-bit training already
learns (12% untrained -> 23% over the 2-bit epoch -> 68% at 3 bits), so the test suggests q_min = 2.

Language models (a text dataset, which has its own validation split): accuracy means little for them, so the
measure is the validation loss instead - the per-token loss on the dataset's validation split, at the end of each
stage, in eval mode at that stage's precision, the state carried along the text (``cptsim.data.text.evaluate_lm``);
the baseline is the untrained model's at q_start. improvement(q) is the *relative* fall of the validation loss,
(loss(q-1) - loss(q)) / loss(q-1), so the threshold is again a fraction: 0.05 = the loss falls by 5%. The model's
gradient clipping (``cptsim_grad_clip``) applies as in training.

Number formats: with a float family (``number_format`` fp | mx | nvfp, and optionally ``grad_format``) the
test trains in that family's formats, as ``cptsim train --number-format`` would run them: a stage at width q runs the
format q names. Widths a family lacks name the next wider format (mx: 2, 3, 4 all run MXFP4), so stages at them would
only measure more training in the same format; the test runs one stage per *distinct* format instead, at the widest
width that names it within q_start..q_max (mx 2..8: 4 MXFP4, 6 MXFP6, 8 MXFP8), and suggests that width. The
baseline is the untrained model in the first stage's format. ``stages_bits(settings)`` gives the widths.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from cptsim.errors import InputError

__all__ = ["FORMAT", "RangeTestSettings", "StageRow", "RangeTestResult", "run_range_test", "suggest_q_min",
           "stage_bits"]

FORMAT = "cptsim.rangetest/1"
DEFAULT_THRESHOLD = 0.05
RULE = ("q_min = the first precision whose mean training accuracy improves on the previous stage "
        "(the untrained model for the first stage) by more than the threshold")
RULE_LM = ("q_min = the first precision after whose stage the validation loss is lower than after the previous "
           "stage (the untrained model for the first stage) by more than the threshold, as a fraction of it")


# A graph trains full batch, one step per epoch: a stage of one step says nothing about a precision, so a graph's
# default stage is this many full-batch steps (a tenth of the graph recipe's 200 epochs).
GRAPH_STAGE_STEPS = 20


@dataclass(frozen=True)
class RangeTestSettings:
    """What a range test runs. steps_per_stage None = one epoch of the training set per precision (a graph, whose
    epoch is one full-batch step: ``GRAPH_STAGE_STEPS``)."""

    model: str = "digits-cnn"
    dataset: str | None = None  # None: the embedded dataset of the model's kind (cptsim.data.default_dataset)
    data_dir: str | None = None
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    q_start: int = 2
    q_max: int = 8
    g_bits: int = 8
    steps_per_stage: int | None = None
    threshold: float = DEFAULT_THRESHOLD
    baseline_batches: int = 4
    seed: int = 0
    device: str = "cpu"
    workers: int = 0
    augment: bool = True
    image_size: int | None = None  # imagefolder only (cptsim.data.resolve_image_size)
    fp_layers: list[str] | None = None  # layers kept in full precision; None: the model's convention
    # the run's number format family and gradient format (cptsim.numerics.families; "int": CPT's integers)
    number_format: str = "int"
    grad_format: str | None = None

    def __post_init__(self) -> None:
        if self.dataset is None:
            from cptsim.data import default_dataset

            object.__setattr__(self, "dataset", default_dataset(self.model))
        if self.number_format is None:
            object.__setattr__(self, "number_format", "int")

    def format_map(self):
        """The family's ``FormatMap`` (None: integers). InputError for an unknown family or gradient format."""
        from cptsim.numerics.families import format_map

        return format_map(self.number_format, self.grad_format)

    def validate(self) -> None:
        for name, value in (("--q-start", self.q_start), ("--q-max", self.q_max)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 16:
                raise InputError(f"{name} must be a precision in 1..16, got {value!r}")
        if self.q_start >= self.q_max:
            raise InputError(f"--q-start {self.q_start} must be below --q-max {self.q_max} "
                             "(the test raises precision from q_start to q_max)")
        g = self.g_bits
        if isinstance(g, bool) or not isinstance(g, int) or not (1 <= g <= 16 or g == 32):
            raise InputError(f"--g-bits must be 1..16 or 32 (full precision), got {g!r}")
        if self.steps_per_stage is not None and (isinstance(self.steps_per_stage, bool) or
                                                 not isinstance(self.steps_per_stage, int) or
                                                 self.steps_per_stage < 1):
            raise InputError(f"--steps-per-stage must be at least 1, got {self.steps_per_stage!r}")
        t = self.threshold
        if not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t < 1:
            raise InputError(f"--threshold must be a fraction of accuracy between 0 and 1 (0.05 = 5 points), got {t!r}")
        if not isinstance(self.baseline_batches, int) or self.baseline_batches < 1:
            raise InputError(f"baseline_batches must be at least 1, got {self.baseline_batches!r}")
        fmap = self.format_map()
        if fmap is not None and len(stage_bits(self)) < 2:
            raise InputError(f"--q-start {self.q_start}..--q-max {self.q_max} name one {self.number_format} format "
                             f"only ({fmap.fwd_names[self.q_max]}): the test needs two formats to compare; "
                             "widen the range")


def stage_bits(settings: RangeTestSettings) -> list[int]:
    """The forward widths the test trains at: every width q_start..q_max for integers; with a float family one per
    distinct format, the widest width within the range that names it (module docstring)."""
    widths = list(range(settings.q_start, settings.q_max + 1))
    fmap = settings.format_map()
    if fmap is None:
        return widths
    return [w for w in widths if w == settings.q_max or fmap.fwd_names[w] != fmap.fwd_names[w + 1]]


@dataclass(frozen=True)
class StageRow:
    """One precision's stage. `improvement` is train_acc minus the previous stage's (or the baseline's)."""

    bits: int
    steps: int
    samples: int
    train_acc: float
    loss: float | None  # None when every step of the stage had a non-finite loss
    improvement: float
    skipped_steps: int = 0  # steps whose loss was not finite: no weight update
    val_loss: float | None = None  # language models: per-token validation loss after the stage (the measure)
    format: str | None = None  # a float family: the forward format the stage ran (None: CPT's integers)

    def to_json(self) -> dict:
        d = asdict(self)
        if d["format"] is None:  # integer tests write what they wrote before
            del d["format"]
        return d


@dataclass
class RangeTestResult:
    settings: RangeTestSettings
    baseline_acc: float
    rows: list[StageRow]
    suggested_q_min: int
    conclusive: bool
    reason: str
    steps_per_stage: int
    time_s: float = 0.0
    train_size: int = 0
    input_shape: list[int] = field(default_factory=list)
    baseline_val_loss: float | None = None  # language models: the untrained model's validation loss

    @property
    def measure(self) -> str:
        """What improvement is measured on: "train_acc", or "val_loss" for a language model."""
        return "val_loss" if self.baseline_val_loss is not None else "train_acc"

    @property
    def threshold(self) -> float:
        return self.settings.threshold

    def _settings_json(self) -> dict:
        d = asdict(self.settings)
        if d["number_format"] == "int" and d["grad_format"] is None:  # integer tests write what they wrote before
            del d["number_format"], d["grad_format"]
        return d

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "settings": self._settings_json(),
            "steps_per_stage": self.steps_per_stage,
            "threshold": self.threshold,
            "measure": self.measure,
            "rule": RULE_LM if self.measure == "val_loss" else RULE,
            "baseline": {"bits": self.settings.q_start, "acc": self.baseline_acc,
                         "batches": self.settings.baseline_batches, "mode": "eval"}
            | ({"val_loss": self.baseline_val_loss} if self.measure == "val_loss" else {}),
            "stages": [r.to_json() for r in self.rows],
            "suggested_q_min": self.suggested_q_min,
            "conclusive": self.conclusive,
            "reason": self.reason,
            "train_size": self.train_size,
            "input_shape": self.input_shape,
            "time_s": self.time_s,
        }


def suggest_q_min(rows: Sequence[StageRow], threshold: float, measure: str = "train_acc") -> tuple[int, bool, str]:
    """(q_min, conclusive, reason) from stage rows in increasing bits order (rule in the module docstring).
    ``measure`` "val_loss" (a language model) words the reason for a relative fall of the validation loss."""
    if not rows:
        raise ValueError("no stages to choose from")
    lm = measure == "val_loss"
    what, pts = ("the validation loss", f"{100 * threshold:g}%") if lm else \
        ("training accuracy", f"{100 * threshold:g} points")
    verb, unit = ("falls", "%") if lm else ("improves", "")
    for r in rows:
        if r.improvement > threshold:
            return r.bits, True, (f"first precision after which {what} {verb} by more than {pts} "
                                  f"({'-' if lm else '+'}{100 * r.improvement:.1f}{unit})")
    best = max(rows, key=lambda r: (r.improvement, -r.bits))
    if best.improvement > 0:
        return best.bits, False, (f"inconclusive: no precision improved {what} by more than {pts}; "
                                  f"{best.bits} bits improved most ({'-' if lm else '+'}{100 * best.improvement:.1f}"
                                  f"{unit}) - try more --steps-per-stage")
    top = rows[-1].bits
    return top, False, (f"inconclusive: {what} never improved; suggesting the top precision {top} "
                        "(no evidence that lower precision trains) - check --lr and --steps-per-stage")


ProgressFn = Callable[[int, int, dict], None]  # (steps done, total steps, {"bits", "loss", "stage"})


def run_range_test(settings: RangeTestSettings, progress: ProgressFn | None = None) -> RangeTestResult:
    """Run the precision range test for real (see the module docstring) and return every stage and the suggestion."""
    from cptsim.run.train import TrainConfig, build, epoch_batches

    settings.validate()
    t0 = time.perf_counter()
    cfg = TrainConfig(model=settings.model, dataset=settings.dataset, data_dir=settings.data_dir,
                      schedule=f"static:{settings.q_max}:g{settings.g_bits}", epochs=1,
                      batch_size=settings.batch_size, lr=settings.lr, momentum=settings.momentum,
                      weight_decay=settings.weight_decay, lr_schedule="constant", seed=settings.seed,
                      device=settings.device, workers=settings.workers, augment=settings.augment,
                      image_size=settings.image_size,
                      fp_layers=None if settings.fp_layers is None else list(settings.fp_layers),
                      number_format=settings.number_format, grad_format=settings.grad_format)
    w = build(cfg)
    fmap = w.precision.formats  # a float family: each stage runs the format its width names
    model, device = w.model, settings.device
    valid = getattr(w.train_set, "valid", None)  # a text dataset's own validation split: a language model
    lm = valid is not None and getattr(valid, "is_text", False)
    clip = getattr(model, "cptsim_grad_clip", None)

    def val_loss() -> float:
        from cptsim.data.text import evaluate_lm

        model.eval()
        try:
            return evaluate_lm(model, valid, device)[0]
        finally:
            model.train()
    from cptsim.run.train import IGNORE_INDEX, is_graph

    spe = settings.steps_per_stage or (GRAPH_STAGE_STEPS if is_graph(w.train_set) else w.steps_per_epoch)
    precisions = stage_bits(settings)
    total = spe * len(precisions)

    def batches():
        # The data order continues across stages and epochs, as one training run would see it.
        epoch = 0
        while True:
            for _, _, xy in epoch_batches(cfg, w, epoch, 0, w.steps_per_epoch, rank=0, world=1):
                yield xy
            epoch += 1

    # Baseline: the untrained model at q_start (a float family: the first stage's format, the one q_start names) in
    # eval mode on the first batches (which stage 1 then trains on).
    model.eval()
    w.precision.set(settings.q_start, settings.g_bits)
    correct = seen = 0
    with torch.no_grad():
        for i, (_, _, (x, y)) in enumerate(epoch_batches(cfg, w, 0, 0, w.steps_per_epoch, rank=0, world=1)):
            if i >= settings.baseline_batches:
                break
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(1) == y).sum().item()
            seen += (y != IGNORE_INDEX).sum().item()  # a graph's nodes outside the training mask are not samples
    baseline = correct / max(seen, 1)
    baseline_loss = val_loss() if lm else None

    opt = torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=settings.momentum,
                          weight_decay=settings.weight_decay)
    data = batches()
    rows: list[StageRow] = []
    prev, done = baseline_loss if lm else baseline, 0
    model.train()
    for stage, bits in enumerate(precisions):
        w.precision.set(bits, settings.g_bits)
        correct = seen = skipped = 0
        loss_sum, loss_n = 0.0, 0
        for _ in range(spe):
            x, y = next(data)
            x, y = x.to(device), y.to(device)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss_v = loss.item()
            n = (y != IGNORE_INDEX).sum().item()  # per labelled sample (a graph: its training nodes)
            correct += (logits.detach().argmax(1) == y).sum().item()
            seen += n
            if math.isfinite(loss_v):
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                loss_sum += loss_v * n
                loss_n += n
            else:  # too few bits can blow up the logits; skip the update rather than poison the weights
                skipped += 1
            done += 1
            if progress is not None:
                progress(done, total, {"bits": bits, "loss": loss_v, "stage": stage})
        acc = correct / max(seen, 1)
        if lm:  # the relative fall of the validation loss (module docstring)
            vl = val_loss()
            gain = (prev - vl) / prev if math.isfinite(vl) and prev > 0 else -math.inf
        else:
            vl, gain = None, acc - prev
        rows.append(StageRow(bits=bits, steps=spe, samples=seen, train_acc=acc,
                             loss=loss_sum / loss_n if loss_n else None, improvement=gain,
                             skipped_steps=skipped, val_loss=vl,
                             format=None if fmap is None else fmap.fwd_names[bits]))
        prev = vl if lm else acc
        if any(not torch.isfinite(p).all() for p in model.parameters()):
            raise InputError(f"the range test diverged at {bits} bits (weights became non-finite); "
                             f"lower --lr (now {settings.lr})")

    q_min, conclusive, reason = suggest_q_min(rows, settings.threshold, "val_loss" if lm else "train_acc")
    if fmap is not None:
        reason += f"; {q_min} bits run {fmap.fwd_names[q_min]} ({settings.number_format} family)"
    return RangeTestResult(settings=settings, baseline_acc=baseline, rows=rows, suggested_q_min=q_min,
                           conclusive=conclusive, reason=reason, steps_per_stage=spe,
                           time_s=round(time.perf_counter() - t0, 3),
                           train_size=len(w.train_set), input_shape=list(w.info.input_shape),
                           baseline_val_loss=baseline_loss)
