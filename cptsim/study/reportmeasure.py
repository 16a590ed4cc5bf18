"""The timing pass: a run's own model, data and optimizer rebuilt through ``cptsim.run.train.build`` and one training
step timed at each width, widths alternating (``cptsim report --measure-host N``). The only part of a report that
trains; torch is imported when it runs."""

from __future__ import annotations

from cptsim.errors import InputError


def _exact_on(cfg: dict) -> bool:
    """Whether the run trained with the exact int8 GEMMs (config.json host.gemm_paths, cptsim.numerics.exact_gemm)."""
    paths = (cfg.get("host") or {}).get("gemm_paths") or {}
    return paths.get("exact_gemm") == "on"


def measure_host_steps(run_path, cfg: dict, widths, n: int, warmup: int = 2, exact_modes=None,
                       raw: bool = False) -> dict:
    """Median seconds of one training step of the run's model at each (bits, grad_bits) in ``widths``: the run's
    config rebuilt (cptsim.run.train.build: model, data, quantizers, number format), one batch of its training data,
    its optimizer, its thread count and its exact-GEMM setting; ``warmup`` + ``n`` rounds, each one step per width,
    the order reversed every round (``raw``: every round's seconds, in round order). ``exact_modes`` (e.g.
    (False, True)): time each width with CPTSIM_EXACT_GEMM at each of these instead of the run's setting, in the
    same rounds; keys are then (bits, grad_bits, mode).
    InputError for what it cannot time (a graph dataset)."""
    import os
    import statistics
    import time

    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from cptsim.measure.opcount import training_optimizer, zero_grad
    from cptsim.run.config import TrainConfig
    from cptsim.run.train import build, is_graph

    settings = dict(cfg.get("settings") or {})
    settings["device"] = "cpu"
    settings.pop("tensorboard", None)
    tc = TrainConfig.from_dict(settings)
    threads = (cfg.get("host") or {}).get("threads")
    before_threads, before_env = torch.get_num_threads(), os.environ.get("CPTSIM_EXACT_GEMM")
    os.environ["CPTSIM_EXACT_GEMM"] = "1" if _exact_on(cfg) else "0"
    try:
        with torch.random.fork_rng(devices=[]):
            w = build(tc)
            if isinstance(threads, int) and threads >= 1:
                torch.set_num_threads(threads)
            if is_graph(w.train_set):
                raise InputError("the timing pass does not time graph workloads (one graph per step)")
            x, y = next(iter(DataLoader(w.train_set, batch_size=tc.batch_size, shuffle=False)))
            model = w.model
            model.train()
            opt = training_optimizer([p for p in model.parameters() if p.requires_grad], lr=tc.lr * 1e-3,
                                     momentum=tc.momentum, weight_decay=tc.weight_decay,
                                     name=tc.optimizer.strip().lower())
            params = [p for p in model.parameters() if p.requires_grad]
            clip = getattr(model, "cptsim_grad_clip", None)  # as the training loop: LMs clip the gradient norm
            keys = [tuple(wd) for wd in widths] if exact_modes is None else \
                [(*wd, bool(m)) for wd in widths for m in exact_modes]
            times: dict = {k: [] for k in keys}
            order = list(times)
            for r in range(warmup + n):
                for wd in (order if r % 2 == 0 else order[::-1]):
                    if exact_modes is not None:
                        os.environ["CPTSIM_EXACT_GEMM"] = "1" if wd[2] else "0"
                    w.set_all(wd[0], wd[1])
                    t0 = time.perf_counter()
                    zero_grad(opt)
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    if clip:
                        torch.nn.utils.clip_grad_norm_(params, clip)
                    opt.step()
                    dt = time.perf_counter() - t0
                    if r >= warmup:
                        times[wd].append(dt)
    finally:
        torch.set_num_threads(before_threads)
        if before_env is None:
            os.environ.pop("CPTSIM_EXACT_GEMM", None)
        else:
            os.environ["CPTSIM_EXACT_GEMM"] = before_env
    return times if raw else {wd: statistics.median(v) for wd, v in times.items()}
