"""Every figure cptsim draws, in one module: matplotlib (Agg backend) in, PNG out.

    run_figure(report) -> bytes            one run: bits, cumulative BitOPs, BitOPs by layer, target hardware, host time
                                           (cptsim report)
    comparison_figure(rows) -> bytes       several runs: accuracy vs executed BitOPs and vs time (cptsim report)
    plot_frontier(plan, path)              the planner's candidates: cost vs score, frontier, budget (cptsim plan)
    plot_schedules(scheds, steps, path)    bits over steps, one panel per schedule (cptsim schedules show)
    sweep_figure(report) -> bytes          accuracy vs cost per schedule family with seed spread, and accuracy vs
                                           the proxy score (cptsim sweep --report)

Functions that return bytes leave where to write to the caller; those given a path write it atomically (a kill
never leaves half an image). Without matplotlib, every function raises InputError (exit 2) naming the fix.
"""

from __future__ import annotations

import io

import numpy as np

from cptsim.errors import InputError
from cptsim.textfmt import si


def require_matplotlib():
    """Import matplotlib with the Agg backend; InputError (exit 2) when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise InputError(f"plots need matplotlib, which cannot be imported here ({e}); "
                         "install it (pip install matplotlib) or leave out --plot") from None
    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def write_png(fig, path, flag: str = "--plot", **savefig_kw) -> None:
    """Write a figure as PNG atomically; an unwritable path is bad input (exit 2) naming ``flag``."""
    from cptsim.fileio import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", **savefig_kw)
    try:
        atomic_write_bytes(path, buf.getvalue())
    except OSError as e:
        raise InputError(f"{flag}: cannot write {str(path)!r}: {e.strerror or e}") from None


_GROUP_COLORS = ("C2", "C1", "C4", "C8", "C5", "C9", "C6", "C7")  # not C0 (executed) nor C3 (gradient bits)


def _layer_bits_lines(ax, ps, steps, lb: dict) -> None:
    """The bits panel of a per-layer run (``report._layer_bits_series``): each group of layers on one schedule
    (planned, thin), and the forward bits averaged over the quantized layers weighted by their forward MACs, planned
    (thick, grey) and executed (the executed steps' bits per layer)."""
    if lb.get("planned_effective") is not None:
        ax.step(ps, lb["planned_effective"], where="post", lw=2.5, color="0.8",
                label="planned forward bits, MAC-weighted over layers")
    for k, grp in enumerate(g for g in lb["groups"] if g["bits"] is not None):
        n = len(grp["layers"])
        who = ("the other layers" if grp["global"] else grp["layers"][0] if n == 1 else f"{n} layers")
        ax.step(ps, grp["bits"], where="post", lw=1.3, ls=(0, (3, 1.5)), color=_GROUP_COLORS[k % len(_GROUP_COLORS)],
                label=f"planned {grp['schedule']}: {who} ({100 * grp['mac_share']:.0f}% of MACs)")
    ax.step(steps, lb["executed_effective"], where="post", lw=1.0, color="C0",
            label="executed forward bits, MAC-weighted over layers")


def run_figure(report) -> bytes:
    """PNG bytes of one run's seven panels (``run_figure_object``)."""
    plt = require_matplotlib()
    fig = run_figure_object(report)
    try:
        return _png(fig)
    finally:
        plt.close(fig)


def _legend_below(ax, ncol: int = 2, **kw):
    """A legend under the axes, off the data (cyclic schedules and bars fill a panel: no corner is free)."""
    return ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol, fontsize=8, frameon=False, **kw)


def run_figure_object(report):
    """The matplotlib figure of one run (a ``cptsim.study.report.RunReport``): bits over steps, the test metric
    under it over the same steps; cumulative BitOPs planned vs executed; per-layer BitOPs share; the target
    hardware's energy and latency, planned, executed and baseline (``_hardware_panels``); host time per epoch,
    measured vs modelled. Every legend sits under its panel, off the data."""
    plt = require_matplotlib()
    from matplotlib.ticker import MaxNLocator

    s, d = report.series, report.data
    fig = plt.figure(figsize=(13, 17))
    grid = fig.add_gridspec(4, 2, height_ratios=[1, 0.8, 0.9, 0.9])
    ax_bits, ax_cum = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    ax_metric = fig.add_subplot(grid[1, 0], sharex=ax_bits)  # under the precision: same steps
    ax_layers = fig.add_subplot(grid[1, 1])
    ax_energy, ax_lat = fig.add_subplot(grid[2, 0]), fig.add_subplot(grid[2, 1])
    ax_time = fig.add_subplot(grid[3, :])
    _hardware_panels(ax_energy, ax_lat, d.get("hardware") or [], d.get("baseline") or {})
    _metric_panel(ax_metric, s.get("accuracy") or {})
    title = (f"{d['run']['name']}: {d['run']['model']} on {d['run']['dataset']}, "
             f"{d['run'].get('schedule_label', d['run']['schedule'])}")
    fig.suptitle(title, fontsize=12)

    if "step" in s:
        ps = np.arange(len(s["planned_bits"]))
        lb = s.get("layer_bits")
        if lb:  # a per-layer run: one thin line per group of layers sharing a schedule, and the MAC-weighted mean
            _layer_bits_lines(ax_bits, ps, s["step"], lb)
            extra = [g["bits"] for g in lb["groups"] if g["bits"] is not None]
        else:
            ax_bits.step(ps, s["planned_bits"], where="post", lw=2.5, color="0.8", label="planned forward bits")
            ax_bits.step(s["step"], s["bits"], where="post", lw=1.0, color="C0", label="executed forward bits")
            extra = []
        ax_bits.step(s["step"], s["grad_bits"], where="post", lw=1.0, ls="--", color="C3",
                     label="executed gradient bits")
        lo = min([int(np.min(s["bits"])), int(np.min(s["grad_bits"])), int(np.min(s["planned_bits"]))]
                 + [int(np.min(b)) for b in extra])
        hi = max([int(np.max(s["bits"])), int(np.max(s["grad_bits"])), int(np.max(s["planned_bits"]))]
                 + [int(np.max(b)) for b in extra])
        ax_bits.set_ylim(lo - 0.7, hi + 0.7)
        ax_bits.yaxis.set_major_locator(MaxNLocator(integer=True))
        names = run_format_names(d)
        if names is not None:  # a float family: each width's tick names its format, the legend the gradients'
            name_widths(ax_bits, names["forward"], lo, hi)
            ax_bits.lines[-1].set_label("executed gradient bits (" + ", ".join(sorted(set(
                names["gradient"].values()))) + ")")
        _legend_below(ax_bits, ncol=3)

        b = d["bitops"]
        ax_cum.plot(ps + 1, np.cumsum(s["planned_bitops"]), lw=3, color="0.75",
                    label=f"planned ({b['planned']['source']}): {b['planned']['total']:.3g}")
        ax_cum.plot(s["step"] + 1, np.cumsum(s["executed_bitops"]), lw=1.2, color="C0",
                    label=f"executed (trace): {b['executed']['total']:.3g}")
        diff = b["diff_pct"]["total"]
        ax_cum.set_title(f"cumulative BitOPs: executed {diff:+.2f}% vs planned" if diff is not None
                         else "cumulative BitOPs", fontsize=10)
        _legend_below(ax_cum, ncol=1)
    else:
        for ax in (ax_bits, ax_cum):
            ax.text(0.5, 0.5, "no executed steps", ha="center", va="center", transform=ax.transAxes)
    if "step" in s:
        inside = s["step"] < len(s["planned_bits"])
        off = int(((s["bits"][inside] != s["planned_bits"][s["step"][inside]])
                   | (s["grad_bits"][inside] != s["planned_grad_bits"][s["step"][inside]])).sum())
        ax_bits.set_title("precision over training steps" + (" (executed = planned at every step run)" if not off
                          else f" ({off} steps differ from the plan)"), fontsize=10)
    else:
        ax_bits.set_title("precision over training steps", fontsize=10)
    ax_bits.set_xlabel("training step")
    ax_bits.set_ylabel("bits")
    ax_cum.set_xlabel("training step")
    ax_cum.set_ylabel("BitOPs (cumulative)" if not d["run"].get("number_format")
                      else "BitOPs (cumulative; each format's element bits)")
    for ax in (ax_bits, ax_cum):
        ax.grid(alpha=0.3)

    layers = s.get("layers")
    if layers and layers["top"]:
        rows = list(layers["top"])
        names = [f"{r['name']} ({r['bits']}b)" for r in rows]
        shares = [100 * r["share"] for r in rows]
        colors = ["C0" if r["quantized"] else "C1" for r in rows]
        y = np.arange(len(names))[::-1]
        ax_layers.barh(y, shares, color=colors)
        ax_layers.set_yticks(y, names, fontsize=8)
        for yi, v in zip(y, shares):
            ax_layers.text(v, yi, f" {v:.1f}%", va="center", fontsize=7)
        ax_layers.set_xlim(0, max(shares) * 1.18)
        from matplotlib.patches import Patch

        _legend_below(ax_layers, handles=[Patch(color="C0", label="quantized"),
                                          Patch(color="C1", label="full precision")])
    other = layers["other"] if layers else None
    ax_layers.set_title("executed BitOPs by layer (share of the run)"
                        + (f"; {other['layers']} more layers hold {100 * other['share']:.1f}%" if other else ""),
                        fontsize=10)
    ax_layers.set_xlabel("% of executed BitOPs")

    h = s.get("host_time")
    if h and h["per_epoch"]:
        ep = [e["epoch"] for e in h["per_epoch"]]
        ms = [e["measured_s"] for e in h["per_epoch"]]
        mo = [e["modelled_s"] for e in h["per_epoch"]]
        x = np.arange(len(ep))
        if len(ep) <= 40:
            ax_time.bar(x - 0.2, ms, 0.4, label="measured (sum of step times)", color="C2")
            ax_time.bar(x + 0.2, mo, 0.4, label=f"modelled ({h['profile']} profile)", color="C4")
            ax_time.set_xticks(x, [str(e) for e in ep], fontsize=8 if len(ep) <= 20 else 6)
            ax_time.set_ylim(0, 1.1 * max(max(ms), max(mo)))
        else:
            ax_time.plot(ep, ms, label="measured (sum of step times)", color="C2")
            ax_time.plot(ep, mo, label=f"modelled ({h['profile']} profile)", color="C4")
        err = h["error_pct"]
        where = "GPU" if h.get("kind") == "gpu" else "host"
        ax_time.set_title(f"{where} step time per epoch: modelled {err:+.1f}% vs measured "
                          f"({h['modelled_s']:.3g} s vs {h['measured_s']:.3g} s)", fontsize=10)
        _legend_below(ax_time)
    else:
        ax_time.text(0.5, 0.5, "host time not modelled", ha="center", va="center", transform=ax_time.transAxes)
        ax_time.set_title("host step time per epoch", fontsize=10)
    ax_time.set_xlabel("epoch")
    ax_time.set_ylabel("seconds")
    ax_time.grid(alpha=0.3, axis="y")
    fig.tight_layout(rect=(0, 0, 1, 0.985))  # the suptitle above the top panels' titles
    return fig


def _hardware_panels(ax_e, ax_t, rows: list[dict], baseline: dict) -> None:
    """Energy and latency on each target hardware as % of the baseline's (the report's one baseline: the plan's,
    or static q_max of the run's schedule), three bars each: planned, executed (modelled on that hardware; the
    GPU that ran also shows its measurement) and the baseline; each bar is labelled with its absolute value."""
    label = baseline.get("label", "static q_max")
    for ax, key, unit, what in ((ax_e, "energy_j", "J", "energy"), (ax_t, "latency_s", "s", "latency")):
        usable = [r for r in rows if (r.get("vs_static") or {}).get(key)]
        if not usable:
            ax.text(0.5, 0.5, "no target hardware modelled", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(f"{what} on the target hardware", fontsize=10)
            continue
        x = np.arange(len(usable))
        w = 0.26
        for i, r in enumerate(usable):
            native = (r.get("modelled_natively") or r["executed"])[key]
            base = native / r["vs_static"][key] if r["vs_static"][key] else None
            pvs = (r.get("planned_vs_static") or {}).get(key)
            bars = [("planned", r["planned"].get(key), 100 * pvs if pvs is not None else None, "0.7", None),
                    ("executed, modelled", native, 100 * r["vs_static"][key], "C0", None),
                    (f"baseline: {label}", base, 100.0, "white", "0.3")]
            for j, (name, val, pct, color, edge) in enumerate(bars):
                if pct is None:
                    continue
                ax.bar(x[i] + (j - 1) * w, pct, w, color=color, edgecolor=edge or color,
                       label=name if i == 0 else None)
                ax.text(x[i] + (j - 1) * w, pct, si(val, unit), ha="center", va="bottom", fontsize=7,
                        rotation=90)
        top = 1.35 * max([100.0] + [100 * (r.get("planned_vs_static") or {}).get(key, 0) for r in usable])
        for i, r in enumerate(usable):
            native = (r.get("modelled_natively") or r["executed"])[key]
            base = native / r["vs_static"][key] if r["vs_static"][key] else None
            if r.get("modelled_natively") and r["executed"].get(key) is not None and base:
                m = 100 * r["executed"][key] / base  # warm-up included: may be far off the modelled scale
                shown = min(m, 0.95 * top)
                ax.plot([x[i] - 1.5 * w, x[i] + 1.5 * w], [shown, shown], color="C3", lw=2,
                        label="measured on the GPU that ran (all steps)")
                ax.text(x[i] + 1.5 * w, shown, f" {si(r['executed'][key], unit)}" + (" (off scale)" if m > shown
                        else ""), va="center", fontsize=7, color="C3", clip_on=True)
        ax.set_xticks(x, [r["name"] for r in usable], fontsize=8)
        ax.set_ylim(0, top)
        ax.set_ylabel(f"{what}, % of the baseline")
        ax.set_title(f"{what} on the target hardware (modelled): planned, executed, baseline", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        _legend_below(ax, ncol=2)


def metric_curve(acc: dict) -> tuple[str, list[tuple[str, list, list]]]:
    """(y label, [(label, steps, values)]) of a report's evaluations: test (and validation) accuracy in %, or
    perplexity for a language model; only the evaluations that carry a step and the value."""
    ppl = "perplexity" in acc
    keys = (("test_ppl", "test perplexity"), ("val_ppl", "validation perplexity")) if ppl else \
        (("test_acc", "test accuracy"), ("val_acc", "validation accuracy"))
    scale = 1.0 if ppl else 100.0
    curves = []
    for key, label in keys:
        pts = [(e["step"], scale * e[key]) for e in acc.get("epochs", [])
               if isinstance(e.get("step"), (int, float)) and isinstance(e.get(key), (int, float))]
        if pts:
            curves.append((label, [p[0] for p in pts], [p[1] for p in pts]))
    bits = acc.get("eval_bits")
    what = "perplexity (lower is better)" if ppl else "accuracy (%)"
    return f"{what} at {bits} bits" if bits else what, curves


def _metric_panel(ax, acc: dict) -> None:
    ylabel, curves = metric_curve(acc)
    for i, (label, x, y) in enumerate(curves):
        ax.plot(x, y, marker="o", ms=4, lw=1.2, color=("C2", "C1")[i % 2], label=label)
        ax.annotate(f"{y[-1]:.4g}", (x[-1], y[-1]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if curves:
        _legend_below(ax)
    else:
        ax.text(0.5, 0.5, "no evaluation recorded yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_title("test metric over training steps (measured at q_max)", fontsize=10)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def comparison_figure(rows: list[dict]) -> bytes:
    """PNG bytes of the runs side by side: accuracy at q_max vs executed BitOPs, and vs measured time."""
    plt = require_matplotlib()

    fig, (ax_b, ax_t) = plt.subplots(1, 2, figsize=(13, 5.2))
    fig.suptitle(f"accuracy vs cost across {len(rows)} runs (accuracy at q_max, measured; cost executed)",
                 fontsize=12)
    for ax, key, xlabel in ((ax_b, "executed_bitops", "executed BitOPs (whole run)"),
                            (ax_t, "measured_time_s", "measured training time on this machine (s)")):
        pts = [r for r in rows if r[key] is not None and r["final_acc"] is not None]
        for i, r in enumerate(rows):
            if r not in pts:
                continue
            c = f"C{i % 10}"
            ax.scatter([r[key]], [100 * r["final_acc"]], color=c, s=60, zorder=3,
                       label=f"{i + 1}  {r['run']}: {r['model']}, {r.get('schedule_label', r['schedule'])}")
            if r["best_acc"] is not None and r["best_acc"] != r["final_acc"]:
                ax.scatter([r[key]], [100 * r["best_acc"]], facecolors="none", edgecolors=c, s=60, zorder=3)
            # Numbers, not names, next to the points: runs of one cost sit on top of each other.
            ax.annotate(str(i + 1), (r[key], 100 * r["final_acc"]), textcoords="offset points",
                        xytext=(5, 4 + 9 * (i % 3)), fontsize=8, color=c)
        xs = [r[key] for r in pts]
        if xs and min(xs) > 0 and max(xs) / min(xs) > 20:
            ax.set_xscale("log")
        ax.margins(x=0.08, y=0.15)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    ax_b.set_title("filled: final, hollow: best epoch", fontsize=9)
    handles, labels = ax_b.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(2, len(handles)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.035 * ((len(handles) + 1) // 2), 1, 1))
    try:
        return _png(fig)
    finally:
        plt.close(fig)


def plot_frontier(p, path: str) -> None:
    """PNG: every candidate's cost (% of static q_max on the budget's metric) vs score; within-budget ones in
    colour by schedule, the Pareto frontier, the budget line and the chosen schedule."""
    plt = require_matplotlib()

    from cptsim.planner.search import COST_KEYS, METRIC_NAMES

    c = p.candidates
    key = COST_KEYS[p.metric]
    base = float(getattr(p.baseline, key)["total"])
    x = 100.0 * c.cost[key] / base
    y = c.score
    within = c.cost[key] <= p.budget_absolute
    names = np.array([s.name for s in c.schedules])
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.scatter(x[~within], y[~within], s=8, color="0.82", label="over budget", zorder=1)
    cmap = plt.get_cmap("tab20")
    for i, name in enumerate(dict.fromkeys(names[within])):
        m = within & (names == name)
        ax.scatter(x[m], y[m], s=12, color=cmap(i % 20), label=name, zorder=2)
    fx = [100.0 * pt["cost"] / base for pt in p.frontier]
    fy = [pt["score"] for pt in p.frontier]
    ax.step(fx, fy, where="post", color="black", lw=1.2, label="Pareto frontier", zorder=3)
    ax.axvline(100.0 * p.budget_absolute / base, color="tab:red", ls="--", lw=1.2,
               label=f"budget {p.budget.spec}", zorder=3)
    cx = 100.0 * float(getattr(p.estimate, key)["total"]) / base
    ax.scatter([cx], [p.score], marker="*", s=260, color="gold", edgecolor="black", zorder=4,
               label=f"chosen {p.schedule.to_text()}")
    what = METRIC_NAMES[p.metric]
    where = "" if p.metric == "bitops" else f" on {p.hardware.name}"
    ax.set_xlabel(f"{what}{where}, % of static {p.baseline_schedule.q_max} bits")
    ax.set_ylabel("score (early-weighted-fidelity/1)" if p.ranking == "proxy" else "proxy score")
    ax.set_title(f"{p.workload.describe()}: {len(c)} candidates", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    try:
        write_png(fig, path, dpi=120)
    finally:
        plt.close(fig)


def run_format_names(data: dict) -> dict | None:
    """{"forward": {bits: name}, "gradient": {bits: name}} of a run that ran a float family (config.json's
    "number_format"), else None. From the report's data where it carries them, else the run's config."""
    nf = data.get("number_format")
    if nf is None:
        path = (data.get("run") or {}).get("path")
        if not path:
            return None
        try:
            from cptsim.run.rundir import RunDir

            nf = RunDir.open(path).read_config().get("number_format")
        except Exception:  # noqa: BLE001 - a figure without format names rather than none
            return None
    if not isinstance(nf, dict) or not isinstance(nf.get("formats"), dict):
        return None
    return {k: {int(b): str(n) for b, n in (nf["formats"].get(k) or {}).items()} for k in ("forward", "gradient")}


def name_widths(ax, names: dict, lo: int, hi: int) -> None:
    """Label the y axis of a bits-over-steps panel with each width's format ("4 mxfp4") from ``lo`` to ``hi``."""
    widths = [w for w in sorted(names) if lo <= w <= hi]
    if widths:
        ax.set_yticks(widths)
        ax.set_yticklabels([f"{w} {names[w]}" for w in widths], fontsize=8)
        ax.set_ylabel("bits (format)")


def plot_schedules(scheds: list, total_steps: int, path, number_format: str = "int",
                   grad_format: str | None = None) -> None:
    """A PNG with one step plot of bits over training steps per schedule (gradient bits dashed when they vary).
    ``number_format`` (a float family): each width's tick names the format it runs in, and the legend
    the gradient format."""
    plt = require_matplotlib()
    from matplotlib.ticker import MaxNLocator

    from cptsim.numerics.families import format_map

    fmap = format_map(number_format, grad_format)

    steps = range(total_steps)
    fig, axes = plt.subplots(len(scheds), 1, sharex=True, squeeze=False,
                             figsize=(10, 1.2 + 1.9 * len(scheds)))
    for ax, s in zip(axes[:, 0], scheds):
        q = s.bits(total_steps)
        ax.step(steps, q, where="post", lw=1.0, label=f"{s.to_text()}  forward (mean {q.mean():.2f})")
        if s.g_min != s.g_max:
            g = s.grad_bits(total_steps)
            ax.step(steps, g, where="post", lw=1.0, ls="--", label=f"gradient (mean {g.mean():.2f})")
        lo = min(s.q_min, s.g_min if s.g_min != s.g_max else s.q_min)
        hi = max(s.q_max, s.g_max if s.g_min != s.g_max else s.q_max)
        pad = 0.5 if hi > lo else 1.0  # a constant schedule needs room for integer ticks either side
        ax.set_ylim(lo - pad, hi + pad)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("bits")
        if fmap is not None:
            name_widths(ax, {w: fmap.fwd_names[w] for w in range(lo, hi + 1)}, lo, hi)
            gnames = sorted({fmap.grad_names[int(b)] for b in set(s.grad_bits(total_steps).tolist())})
            ax.plot([], [], ls="none", label=f"{fmap.family} family; gradients {', '.join(gnames)}")
        ax.grid(alpha=0.3)
        # Outside the axes: cyclic schedules fill the whole panel, so a legend inside would hide data.
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    axes[-1, 0].set_xlabel("training step")
    fig.suptitle(f"precision schedules over {total_steps} steps")
    fig.tight_layout()
    try:
        write_png(fig, path, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)


# Markers per schedule family: the figure tells families apart by shape as well as colour (grey-scale prints).
_MARKERS = "osD^v<>phX*P8"


def sweep_figure(report: dict) -> bytes:
    """PNG bytes of a sweep report (``cptsim.study.sweep.sweep_report``): left, mean test accuracy vs BitOPs relative to
    the static baseline, one point per schedule with its seed spread (mean +- std error bars), one marker and colour
    per schedule family; right, mean accuracy vs the proxy score, with the Spearman rank correlation. A language
    model's report (``measure`` ppl) plots test perplexity instead, lower is better."""
    plt = require_matplotlib()

    table = report["schedules"]
    lm = (report.get("measure") or {}).get("key") == "ppl"

    def fig_of(t):  # (y, error bar)
        return (t["ppl_mean"], t["ppl_std"]) if lm else (100.0 * t["acc_mean"], 100.0 * t["acc_std"])
    fams = list(dict.fromkeys(t["family"] for t in table))
    style = {f: (f"C{i % 10}", _MARKERS[i % len(_MARKERS)]) for i, f in enumerate(fams)}
    fig, (ax_c, ax_s) = plt.subplots(1, 2, figsize=(13, 5.6))
    w = report.get("workload") or {}
    ref = report.get("cost_reference") or {}
    fig.suptitle(f"{w.get('model', '?')} on {w.get('dataset', '?')}, {w.get('steps', '?')} steps x batch "
                 f"{w.get('batch_size', '?')}: {report['runs']} runs, {len(table)} schedules "
                 f"(workload {report['workload_key']})", fontsize=11)
    for ax, key in ((ax_c, "cost_rel"), (ax_s, "score")):
        seen = set()
        for t in table:
            if t[key] is None:
                continue
            color, marker = style[t["family"]]
            x = 100.0 * t[key] if key == "cost_rel" else t[key]
            y, err = fig_of(t)
            ax.errorbar([x], [y], yerr=[err], fmt=marker, color=color,
                        ms=7, capsize=3, lw=1.2, label=None if t["family"] in seen else t["family"], zorder=3)
            seen.add(t["family"])
            if key == "cost_rel" and len(table) <= 24:
                ax.annotate(t["schedule"], (x, y), textcoords="offset points", xytext=(5, 3),
                            fontsize=7, color=color)
        ax.set_ylabel("test perplexity (lower is better), mean +- std over seeds" if lm else
                      "test accuracy (%), mean +- std over seeds")
        ax.grid(alpha=0.3)
        ax.margins(x=0.1, y=0.15)
    ax_c.set_xlabel(f"BitOPs, % of {ref.get('schedule', 'static q_max')}")
    ax_c.set_title(f"{'perplexity' if lm else 'accuracy'} vs cost, by schedule family", fontsize=10)
    ax_c.legend(fontsize=8, loc="best")
    sp = report["spearman"]
    if sp["rho"] is None:
        title = "Spearman rank correlation: n/a (fewer than 3 distinct schedules)"
    else:
        vs = " (score vs -perplexity)" if lm else ""
        title = f"Spearman rho{vs} = {sp['rho']:.2f} over {sp['n_schedules']} schedules"
        if sp.get("per_seed_mean") is not None:
            title += f"; per seed {sp['per_seed_mean']:.2f} +- {sp['per_seed_std']:.2f}"
    ax_s.set_title(title, fontsize=10)
    ax_s.set_xlabel(f"proxy score ({report.get('score_name', 'score')})")
    fig.tight_layout()
    try:
        return _png(fig)
    finally:
        plt.close(fig)


def energy_figure(report) -> bytes | None:
    """A CUDA run's energy per epoch: measured (NVML, the trace's energy_j) vs modelled (the host profile's power x
    modelled time), with the average measured power. None when the run has no measured energy."""
    h = report.data.get("host_time") or {}
    if h.get("measured_energy_j") is None:
        return None
    require_matplotlib()
    import matplotlib.pyplot as plt

    eps = h["per_epoch"]
    x = np.arange(len(eps))
    meas = [e["measured_energy_j"] for e in eps]
    model = [e.get("modelled_energy_j") or 0.0 for e in eps]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar(x - 0.2, meas, 0.4, label="measured (NVML)", color="tab:blue")
    if h.get("modelled_energy_j") is not None:
        ax.bar(x + 0.2, model, 0.4, label=f"modelled ({h['profile']} profile)", color="tab:orange")
    ax.set_xticks(x, [str(e["epoch"]) for e in eps])
    ax.set_xlabel("epoch")
    ax.set_ylabel("GPU energy of the training steps (J)")
    err = h.get("energy_error_pct")
    ax.set_title(f"energy per epoch: modelled {err:+.1f}% vs measured, {h.get('measured_avg_power_w', 0):.0f} W "
                 "average" if err is not None else "energy per epoch (measured)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    try:
        return _png(fig)
    finally:
        plt.close(fig)
