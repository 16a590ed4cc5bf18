"""Time figures as the commands print them: a workload's throughput, and how sure a hardware profile's time is
(``cost``, ``plan`` and ``report`` say it alike)."""

from __future__ import annotations

from .common import si


def throughput(samples: float, seconds: float, epoch_samples: int | None) -> dict:
    """{"samples_per_s", "epoch_samples", "epoch_s"} of work that takes ``seconds`` for ``samples`` samples
    (epoch_s None without an epoch size)."""
    rate = samples / seconds if seconds > 0 else float("inf")
    return {"samples_per_s": rate, "epoch_samples": epoch_samples,
            "epoch_s": epoch_samples / rate if epoch_samples and rate > 0 else None}


def rate_text(rate: float) -> str:
    """Samples per second for people: whole numbers, or 3 significant digits below 100 (a graph is one sample, and
    a big one takes longer than a second)."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"


def time_sureness(hw, prof, mix: list[str], c) -> dict:
    """How sure a profile's time is (its [validation] against this network's op mix) and, on a GPU with a measured
    host overhead, whether an eager step is launch-bound and what CUDA graphs save: the ``cost --json`` keys
    ``time_validation`` and ``launch_bound``. ``mix``: ``prof.op_mix()``."""
    out = {"time_validation": hw.time_validation(mix, op_list=prof.ops is not None)}
    if c.steps:
        lb = hw.launch_bound(prof.ops, c.latency_s["total"] / c.steps)
        if lb is not None:
            out["launch_bound"] = lb
    return out


def sureness_lines(name: str, s: dict) -> list[str]:
    v = s["time_validation"]
    if not v["checked"]:
        lines = [f"{name} time: {v['note']}"]
    else:
        missing = v.get("op_mix_missing", [])
        cover = ("its op mix was covered" if v.get("op_mix_covered") else
                 f"not checked on {', '.join(missing)} (this network has them)" if missing else
                 "those were whole steps, this one is its GEMMs alone")
        lines = [f"{name} time: median |error| {100 * v['median_abs_error']:.0f}%, worst "
                 f"{100 * v['worst_abs_error']:.0f}% over {v['n']} {v['against']} "
                 f"({'held out' if v['held_out'] == 'yes' else 'in-sample'}); {cover}"]
    if v.get("op_list_missing"):
        lines.append(f"{name} time: {v['op_list_missing']}")
    lb = s.get("launch_bound")
    if lb is not None:
        lines.append(f"{name} step: GPU {si(lb['gpu_step_s'], 's')}, host dispatch {si(lb['host_step_s'], 's')} "
                     f"-> an eager step is {lb['bound']}-bound ({si(lb['eager_step_s'], 's')}); CUDA graphs (cptsim "
                     f"train's default on CUDA) would save {100 * lb['cuda_graphs_saving']:.0f}%")
    return lines
