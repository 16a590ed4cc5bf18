"""`cptsim hw`: list, inspect and calibrate hardware profiles."""

from __future__ import annotations

import click
from rich.table import Table

from cptsim.errors import InputError
from cptsim.cost.hardware import HardwareProfile, list_profiles, load_profile, profile_origin, user_profile_dir

from .common import emit_json, err, json_option, out, print_table, si, wide_option

SHOW_BITS = (2, 3, 4, 5, 6, 8, 12, 16, 32)
_SHOW_MACS = 1e9  # the GEMM size `hw show` costs per row: compute-bound, no DRAM traffic


@click.group()
def hw() -> None:
    """Hardware profiles: what a GEMM at given bit widths costs on a machine.

    \b
      cptsim hw list                 the shipped profiles (and yours)
      cptsim hw show a100            a profile's numbers, sources, and cost at 2..32 bits
      cptsim hw show ./my_npu.toml   your own profile, by path
      cptsim hw calibrate            measure this machine; writes the 'host' profile

    \b
    Your own profiles: every NAME.toml in $CPTSIM_HOME/hw_profiles when CPTSIM_HOME is set, else in
    $XDG_CONFIG_HOME/cptsim/hw_profiles (~/.config/cptsim/hw_profiles), is listed and taken by NAME (its
    name = line must say NAME), and replaces a shipped profile of that name; `hw calibrate` writes host.toml
    there, `hw list` prints the folder. Any profile file also works by its path.
    """


def _peak(p: HardwareProfile, b: int) -> float:
    return float(p.throughput_macs_per_s(b, b))


@hw.command("list")
@wide_option
@json_option
def list_cmd(as_json: bool) -> None:
    """List the hardware profiles that --hardware / `hw show` accept by name.

    The MAC/s columns are the peak at 8x8 and 4x4 bits, after the profile's calibration factors;
    src counts the sources the file cites.
    A profile in your own directory (e.g. from `cptsim hw calibrate`) replaces a shipped one of the same name.
    """
    rows, broken = [], []
    for name in list_profiles():
        try:
            p = load_profile(name)
        except InputError as e:  # a broken user file must not hide the others
            broken.append({"name": name, "error": str(e)})
            continue
        rows.append({
            "name": p.name, "kind": p.kind, "description": p.description, "origin": profile_origin(name),
            "peak_macs_per_s": {"8x8": _peak(p, 8), "4x4": _peak(p, 4)},
            "sources": len(p.sources), "hash": p.content_hash, "path": p.path,
        })
    mine = user_profile_dir()
    if as_json:
        emit_json({"profiles": rows, "errors": broken, "user_dir": str(mine)})
        return
    t = Table(title="hardware profiles")
    for col, kw in (("name", {"no_wrap": True}), ("kind", {"no_wrap": True}),
                    ("MAC/s 8x8", {"justify": "right", "no_wrap": True}),
                    ("MAC/s 4x4", {"justify": "right", "no_wrap": True}),
                    ("src", {"justify": "right"}), ("description", {})):
        t.add_column(col, **kw)
    for r in rows:
        name = r["name"] + (" (yours)" if r["origin"] == "user" else "")
        t.add_row(name, r["kind"], si(r["peak_macs_per_s"]["8x8"]), si(r["peak_macs_per_s"]["4x4"]),
                  str(r["sources"]), r["description"])
    print_table(t, drop=("src", "MAC/s 4x4", "kind"), wrap=("description",))
    ours = sum(r["origin"] == "user" for r in rows) + len(broken)
    out.print(f"your own profiles: {mine}" + (f" ({ours} there)" if ours else
                                              " (none there yet; a NAME.toml put there is listed and taken by NAME)"),
              highlight=False, markup=False, soft_wrap=True)  # a path cut in two could not be copied
    for b in broken:
        err.print(f"[yellow]skipped[/yellow] {b['name']}: {b['error']}", markup=True, highlight=False)


def _meanings(p: HardwareProfile) -> dict[str, str]:
    """What each key of the profile's tables means, with its unit (the kind's field docs)."""
    from cptsim.cost.hardware.base import ARRAY_FIELDS

    m = {f.key: f.doc for f in type(p).PARAMS}
    m.update({f"array.{f.key}": f.doc for f in ARRAY_FIELDS})
    m.update({f"calibration.{f.key}": f.doc for f in type(p).CALIBRATION})
    return m


def _by_bits(p: HardwareProfile) -> list[dict]:
    rows = []
    for b in SHOW_BITS:
        t, e = p.gemm_cost(_SHOW_MACS, b, b, 0.0)
        rows.append({"bits": b, "runs_as": p.describe_bits(b, b), "macs_per_s": _peak(p, b),
                     "pj_per_mac": float(e) / _SHOW_MACS * 1e12, "s_per_gmac": float(t)})
    return rows


@hw.command("show")
@click.argument("name_or_path")
@json_option
def show_cmd(name_or_path: str, as_json: bool) -> None:
    """Show one profile: its numbers, sources, calibration, and what it implies per bit width.

    NAME_OR_PATH is a name from `cptsim hw list` or a path to a .toml profile. The table costs a compute-bound
    GEMM with both operands at b bits (b x b): throughput in MAC/s and energy per MAC in pJ. On GPUs the cost
    falls in steps, one per precision tier.
    """
    p = load_profile(name_or_path)
    rows = _by_bits(p)
    if as_json:
        emit_json({**p.to_json(), "by_bits": rows, "meanings": _meanings(p),
                   **({"tiers": p.tiers()} if hasattr(p, "tiers") else {})})
        return
    out.print(f"[bold]{p.name}[/bold] ({p.kind}) - {p.description}", highlight=False)
    out.print(f"file {p.path}  hash {p.content_hash}", highlight=False)
    meaning = _meanings(p)
    nums = Table(title="numbers")
    nums.add_column("key")
    nums.add_column("value", overflow="fold")
    nums.add_column("meaning (unit)", overflow="fold")
    for k, v in p.params.items():
        if k == "tiers":
            for tier in v:
                nums.add_row(f"tier {tier['name']}", f"<= {tier['bits']} bits: {tier['peak_ops']:g} {tier['unit']}",
                             "a precision tier: widest operand, peak rate")
        elif k == "array":
            for ak, av in v.items():
                nums.add_row(f"array.{ak}", str(av), meaning.get(f"array.{ak}", ""))
        else:
            nums.add_row(k, str(v).lower() if isinstance(v, bool) else str(v), meaning.get(k, ""))
    for k, v in p.calibration.items():
        if v is not None:  # an optional constant the file leaves to its default
            nums.add_row(f"calibration.{k}", f"{v:g}", meaning.get(f"calibration.{k}", ""))
    for k, v in p.validation.items():
        nums.add_row(f"validation.{k}", ", ".join(v) if isinstance(v, list) else f"{v:g}" if isinstance(v, float)
                     else str(v), "what the times were checked on")
    out.print(nums)
    if hasattr(p, "tiers"):  # the host: the GEMM tiers it measured and which training GEMMs run on each (now)
        tt = Table(title="host GEMM tiers (what runs there now)")
        tt.add_column("tier")
        tt.add_column("MAC/s", justify="right")
        tt.add_column("runs")
        for tier in p.tiers():
            tt.add_row(tier["name"], si(tier["macs_per_s"]), tier["runs"])
        out.print(tt)
    out.print("[bold]sources[/bold]")
    for s in p.sources:
        out.print(f"  - {s}", highlight=False)
    for n in p.notes:
        out.print(f"[yellow]note:[/yellow] {n}", highlight=False)
    if getattr(p, "has_array", False):
        a = p.params["array"]
        out.print(f"[yellow]note:[/yellow] an array of {a['rows']} x {a['columns']}"
                  f"{'' if a['windows'] == 1 else ' x ' + str(a['windows'])} with {a['weight_buffer_bytes']:,} / "
                  f"{a['input_buffer_bytes']:,} / {a['output_buffer_bytes']:,}-byte weight / input / output buffers: "
                  "cost, plan and report price each layer from its shape (padding to whole rows and columns, "
                  "tiling, DRAM stalls); the table below is the array's peak, which only layers that fill it reach",
                  highlight=False)
    t = Table(title=f"cost of a b x b-bit GEMM ({si(_SHOW_MACS)}MAC, compute-bound)")
    t.add_column("bits", justify="right")
    t.add_column("runs as")
    t.add_column("MAC/s", justify="right")
    t.add_column("pJ / MAC", justify="right")
    prev = None
    for r in rows:
        # A rule where the way it runs changes makes the GPU tier steps stand out.
        t.add_row(str(r["bits"]), r["runs_as"], si(r["macs_per_s"]), f"{r['pj_per_mac']:.3g}",
                  end_section=False)
        if prev is not None and r["runs_as"] != prev:
            t.rows[-2].end_section = True
        prev = r["runs_as"]
    out.print(t)


@hw.command("calibrate")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where fake-quantized training will run.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Profile file to write [default: ~/.config/cptsim/hw_profiles/host.toml, "
                   "or $CPTSIM_HOME/hw_profiles/host.toml].")
@click.option("--seconds", type=click.FloatRange(min=0.05, max=600), default=4.0, show_default=True,
              help="Time budget for the measurements (on a CPU ~2 s more: building the reference workloads).")
@json_option
def calibrate_cmd(device: str, out_path: str | None, seconds: float, as_json: bool) -> None:
    """Measure this machine and write it as a 'host' hardware profile.

    Times FP32 matmuls (conv-as-GEMM shapes), on a CPU also int8 torch._int_mm and bf16 matmuls (the host's GEMM
    tiers: int8 prices the GEMMs CPTSIM_EXACT_GEMM=1 runs as int8, bf16 is for reference), a large tensor copy (memory bandwidth), cptsim's quantizers on 4M
    elements, and the fixed cost of a layer-phase (a training step of tiny quantized layers) with torch; power from NVML on CUDA when pynvml is installed, from RAPL on a
    CPU when the OS exposes it, else unknown (energy 0). Afterwards the profile named 'host' (`cptsim hw show host`,
    and any command given that hardware) uses these numbers instead of the shipped placeholder.

    \b
    On a CPU also dropout's random numbers, a GELU and attention's per-head matmuls (the step's other ops, priced
    from a run's op list), and the fixed costs -- per quantized convolution phase, per other quantized layer phase,
    per launched op -- fitted to training steps of five reference workloads (a CNN, an MLP, a transformer block,
    a graph convolution, a stack of norms; cptsim.calibration.autocal), as a report's automatic measurement does.
    The fit's table says how well the model reproduces each: measured and modelled ms per step, error.

    \b
    --device cuda also writes this GPU as a profile for the GPU time model, host-gpu.toml beside host.toml
    (`cptsim cost --hw host-gpu`): the large-GEMM rate of every tier torch reaches (FP16/BF16, TF32, FP32,
    INT8 via torch._int_mm, FP8 via torch._scaled_mm), the SM count and clock, the stream bandwidth, the shape
    constants fitted on an FP16 GEMM grid and on depthwise convolutions, the GPU and host time per launch from
    CIFAR ResNet-20 graphed and eager, and busy / idle power from NVML. Constants isolated kernels cannot show
    (the achieved bandwidth of a network's small memory-bound kernels, the NCHW factors) come from the shipped
    fit of the card's generation; the file says which is which.
    """
    from cptsim.calibration.autocal import SETUP_SECONDS, measure_host
    from cptsim.calibration.calibrate import calibrate_host, output_path, write_host_profile

    output_path(out_path)  # a bad --out fails now, not after the measurements
    if not as_json:
        err.print(f"measuring {device} for about {seconds + (SETUP_SECONDS['cpu'] if device == 'cpu' else 0):g} "
                  "s ...")
    # a CPU: the rates and the fixed costs fitted to the reference workloads; CUDA: the rates (graph replays)
    measured = measure_host(device, seconds) if device == "cpu" else calibrate_host(device=device, seconds=seconds)
    path, prof = write_host_profile(measured, out_path)
    gpu_path = gpu_prof = records = None
    if device == "cuda":  # also this card as a `gpu` profile for the GPU time model (cptsim.calibration.gpu_micro)
        from cptsim.calibration import gpu_micro
        from cptsim.calibration.calibrate import write_gpu_profile

        if not as_json:
            err.print("microbenchmarks for the GPU time model: GEMM tiers and grid, depthwise convolutions, stream "
                      "bandwidth, ResNet-20 steps, NVML power (about a minute) ...")
        records = gpu_micro.measure(seconds=seconds, say=(lambda m: None) if as_json else
                                    (lambda m: err.print(m, markup=False, highlight=False)))
        records["measured_at"] = measured["measured_at"]
        try:
            gpu_path, gpu_prof = write_gpu_profile(records, path)
        except InputError as e:
            err.print(f"warning: no gpu profile written: {e}", markup=False)
    if as_json:
        doc = {"written": str(path), "measured": measured, "profile": prof.to_json()}
        if records is not None:
            doc["gpu_records"] = records
        if gpu_prof is not None:
            doc["gpu_profile"] = {"written": str(gpu_path), "profile": gpu_prof.to_json()}
        emit_json(doc)
        return
    t = Table(title=f"measured on this machine ({device}, {measured['threads']} threads)", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("3x3 conv fwd+bwd (N,C,H,W,K)" if device == "cuda" else "fp32 matmul",
              si(measured["matmul_macs_per_s"], "MAC/s"))
    for s in measured["matmul_by_shape"]:
        t.add_row(f"  {'x'.join(map(str, s['shape']))}", si(s["macs_per_s"], "MAC/s"))
    for tier, rec in (measured.get("tiers") or {}).items():  # a CPU: int8 _int_mm and bf16
        t.add_row(f"{tier} matmul", si(rec["macs_per_s"], "MAC/s") if rec["macs_per_s"] else rec["note"])
        for s in rec["by_shape"]:
            t.add_row(f"  {'x'.join(map(str, s['shape']))}", si(s["macs_per_s"], "MAC/s"))
    t.add_row("memory bandwidth (copy)", si(measured["bandwidth_bytes_per_s"], "B/s"))
    t.add_row("quantizer pass", si(measured["elementwise_elems_per_s"], "elem/s"))
    for key, what, unit in (("linear_macs_per_s", "fp32 matmul, Linear-layer shapes", "MAC/s"),
                            ("rng_elems_per_s", "random numbers (dropout's bernoulli_)", "elem/s"),
                            ("transcendental_elems_per_s", "GELU forward + backward", "elem/s"),
                            ("attention_macs_per_s", "attention matmuls (per-head bmm)", "MAC/s")):
        if measured.get(key):
            t.add_row(what, si(measured[key], unit))
    if measured.get("op_list"):
        t.add_row("fixed cost per quantized conv phase", f"{measured['conv_overhead_s'] * 1e6:.0f} µs")
        t.add_row("fixed cost per other quantized layer phase", f"{measured['layer_overhead_s'] * 1e6:.0f} µs")
        t.add_row("fixed cost per launched op", f"{measured['op_overhead_s'] * 1e6:.1f} µs")
        t.add_row("  (tiny-layer step, per layer-phase)", f"{measured['tiny_layer_overhead_s'] * 1e6:.0f} µs")
    else:
        t.add_row("overhead per layer-phase", f"{measured['layer_overhead_s'] * 1e6:.0f} µs")
    power = measured["power_w"]
    t.add_row("power", f"{power:.1f} W ({measured['power_source']})" if power else "unknown (energy will be 0 J)")
    if records is not None:
        from cptsim.calibration.gpu_micro import summary_rows

        for what, value in summary_rows(records):
            t.add_row(what, value)
    out.print(t)
    refs = measured.get("references") or []
    if refs:  # how well the fitted model reproduces the reference workloads' steps
        f = Table(title="fixed costs fitted to reference training steps (the host model against them)")
        for col, kw in (("workload", {}), ("measured", {"justify": "right"}), ("modelled", {"justify": "right"}),
                        ("error %", {"justify": "right"}), ("what", {})):
            f.add_column(col, **kw)
        for r in refs:
            if "measured_s" in r:
                f.add_row(r["workload"], f"{r['measured_s'] * 1e3:.2f} ms", f"{r['modelled_s'] * 1e3:.2f} ms",
                          f"{r['error_pct']:+.1f}", r["what"])
            else:
                f.add_row(r["workload"], "-", "-", "-", f"not run: {r['error']}")
        print_table(f, drop=("what",), wrap=("what",))
    out.print(f"wrote {path} (profile '{prof.name}', hash {prof.content_hash})", highlight=False)
    if gpu_prof is not None:
        out.print(f"wrote {gpu_path} (gpu profile '{gpu_prof.name}': this card for the GPU time model -- "
                  f"`cptsim cost --hw {gpu_prof.name}`; the file says which constants were measured)", highlight=False)
