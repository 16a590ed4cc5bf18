"""The planner's quality score: a documented proxy for how good a model a precision schedule will train.

No formula predicts accuracy from bits. What the two papers behind cptsim did find (shared/reference/papers.md):

1. *Quality tracks training cost* (Wolfe & Kyrillidis 2024): across the ten schedules, the ones that spend more
   BitOPs -- more steps at more bits -- train better models. So the score rises with the bits of every step.
2. *Low precision early in training does lasting damage* (their critical-period experiment: hold forward precision
   low for the first D steps, then train normally; larger D hurts more, and later training does not repair it).
   So a step early in the run counts more than the same step late in it.

The score, ``early-weighted-fidelity/1``, for a run of T steps with forward bits q_t and gradient bits g_t::

    score = sum_t w(t/T) * phi(q_t, g_t) / sum_t w(t/T)                           in [0, 1]; static FP32 ~ 1

    phi(q, g) = (f(q)^2 + 2 f(q) f(g)) / 3        fidelity of one training step
    f(b)      = 1 - 4^-(b-1)                      fidelity of one b-bit operand
    w(tau)    = 1 + ALPHA * exp(-tau / TAU0)      weight of a step at run fraction tau = t/T

* f: uniform quantization noise power falls 4x per added bit (6 dB/bit); f(1) = 0 (one bit keeps only a sign),
  f(2) = 0.75, f(4) = 0.98, f(8) = 0.99994, f(32) = 1 to double precision. Diminishing returns per bit are what
  make a steady mid precision better than alternating extremes of the same cost.
* phi: the step's three GEMMs weighted as CPT's cost formula (q^2 + 2qg)/3 weighs them -- forward W x A
  (fidelity f(q)^2) and the two backward GEMMs error x W and error x A (f(g) f(q) each).
* w: ALPHA = 2, TAU0 = 0.1: a step at the very start counts 3x, at 10% of the run 1.74x, at 30% 1.10x, at the
  end 1x. The early-training window of the critical-period literature is the first few tens of percent.

Properties the planner relies on (tests/test_search.py checks them): the score never falls when any step's bits
rise (phi increases in q and in g, w > 0), and moving a block of low-precision steps earlier lowers it (w falls
with t). It is a *ranking* device among schedules of one workload; its absolute value means nothing, and
``cptsim plan --pilot K`` replaces it with measured accuracy of short real runs, ``--quality db`` with a model fitted
to measured full runs (``quality.py``).

Checked against measured runs (``benchmarks/quality_check.py``; tests/test_quality.py re-checks the shipped runs):
on digits-cnn, 3 epochs, forward bits 2-4, 14 schedules at equal BitOPs x 3 seeds, Spearman(score, mean accuracy)
= 0.69 (per seed 0.68 +- 0.04). That holds once evaluation re-estimates BatchNorm statistics at the evaluation
bits (``cptsim.run.train.recalibrate``): the score rewards "high early, low late", and without re-estimation a schedule
that ends low was judged with low-precision statistics. With it, the one-cycle triangular schedule that
ends at q_min is the best cyclic schedule measured, as the score predicts, so schedules are not forced to end at
q_max and the score has no final-precision term.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SCORE_NAME", "ALPHA", "TAU0", "SCORE_HELP", "operand_fidelity", "step_fidelity", "step_weights",
           "score_bits", "score_json", "layer_weights"]

SCORE_NAME = "early-weighted-fidelity/1"
ALPHA = 2.0
TAU0 = 0.1

SCORE_DEFINITION = ("score = sum_t w(t/T) phi(q_t, g_t) / sum_t w(t/T); phi(q, g) = (f(q)^2 + 2 f(q) f(g)) / 3; "
                    "f(b) = 1 - 4^-(b-1); w(tau) = 1 + 2 exp(-tau / 0.1)")

SCORE_HELP = (
    f"Quality score ({SCORE_NAME}), a proxy grounded in two published findings -- quality tracks training cost, "
    "and low precision early in training does lasting damage (Wolfe & Kyrillidis' critical-period experiment): "
    "score = sum_t w(t/T)*phi(q_t,g_t) / sum_t w(t/T), phi(q,g) = (f(q)^2 + 2 f(q) f(g))/3 (the fwd, dgrad, wgrad "
    "GEMMs), f(b) = 1 - 4^-(b-1) (quantization noise falls 4x per bit), w(tau) = 1 + 2 exp(-tau/0.1) (a step at "
    "the start counts 3x, after 30% of the run ~1x). It rises with the bits of every step and weighs early steps "
    "more. --pilot K replaces it with measured accuracy of short real runs."
)


def operand_fidelity(bits) -> np.ndarray:
    """f(b) = 1 - 4^-(b-1): how much of an operand survives b-bit quantization (0 at 1 bit, ~1 at 32)."""
    b = np.asarray(bits, dtype=np.float64)
    return 1.0 - np.power(4.0, -(b - 1.0))


def step_fidelity(q, g) -> np.ndarray:
    """phi(q, g) = (f(q)^2 + 2 f(q) f(g)) / 3 for forward bits q and gradient bits g (broadcasting)."""
    fq, fg = operand_fidelity(q), operand_fidelity(g)
    return (fq * fq + 2.0 * fq * fg) / 3.0


def step_weights(total_steps: int, alpha: float = ALPHA, tau0: float = TAU0) -> np.ndarray:
    """w(t/T) for t = 0..T-1: 1 + alpha * exp(-(t/T) / tau0)."""
    tau = np.arange(int(total_steps), dtype=np.float64) / float(total_steps)
    return 1.0 + alpha * np.exp(-tau / tau0)


def score_bits(bits, grad_bits) -> np.ndarray:
    """The score of runs given their bits per step: ``bits`` (T,) or (C, T) (one row per candidate);
    ``grad_bits`` broadcasts against it (a scalar for static gradient bits). Returns a float or (C,)."""
    q = np.asarray(bits)
    T = q.shape[-1]
    w = step_weights(T)
    phi = step_fidelity(q, grad_bits)
    return (phi * w).sum(axis=-1) / w.sum()


def score_json() -> dict:
    """What the plan records about the score it ranked by."""
    return {"name": SCORE_NAME, "definition": SCORE_DEFINITION, "params": {"alpha": ALPHA, "tau0": TAU0},
            "help": SCORE_HELP}


def layer_weights(qnames: list[str], weights: dict | None) -> np.ndarray:
    """Sensitivity weights of the quantized layers ``qnames``, clipped at 0 and normalised to sum 1 (equal without a
    measurement). A quantized layer the measurement does not name -- an activation-by-activation matmul of attention
    (``attn.scores``, ``attn.mix``), which has no weight for the Hessian or the one-layer probe to perturb -- counts
    as an average layer: the mean of the measured ones. (Giving it 1.0 against measured weights that sum to 1 would
    let four unmeasured matmuls outweigh the whole measured model.)"""
    L = len(qnames)
    if not weights:
        return np.full(L, 1.0 / L)
    known = [max(float(weights[n]), 0.0) for n in qnames if n in weights]
    fill = float(np.mean(known)) if known else 1.0
    w = np.array([max(float(weights[n]), 0.0) if n in weights else fill for n in qnames])
    return w / w.sum() if w.sum() > 0 else np.full(L, 1.0 / L)
