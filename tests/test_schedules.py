"""Precision schedules against an independent scalar implementation, text form, validation and the CLI."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cptsim.cli.schedules_cmd import schedules as schedules_group
from cptsim.errors import InputError
from cptsim.cost.schedules import (
    ALIASES,
    SCHEDULE_NAMES,
    VALID_BITS,
    Schedule,
    cpt_relative_cost,
    describe,
    list_schedules,
    make_schedule,
    parse_schedule,
)

# ------------------------------------------------------------------ independent scalar reference
# Written from the formulas in DESIGN.md, one step at a time with math.*; the position in the cycle uses
# exact rationals (t / L with L = T/n is t·n/T), which is what the real-valued definition means.


def _rise(profile: str, z: float) -> float:
    if profile == "cos":
        return 0.5 * (1.0 - math.cos(math.pi * z))
    if profile == "lin":
        return z
    if profile == "exp":
        return 1.0 - math.exp(-4.0 * z)
    if profile == "rex":
        return 1.0 - (1.0 - z) / (0.1 + 0.9 * (1.0 - z))
    raise AssertionError(profile)


def _fall(profile: str, flip: str, z: float) -> float:
    if profile == "cos":
        return 0.5 * (1.0 + math.cos(math.pi * z))
    if profile == "lin":
        return 1.0 - z
    if profile == "exp":
        return math.exp(-4.0 * z) if flip == "v" else 1.0 - math.exp(-4.0 * (1.0 - z))
    if profile == "rex":
        return (1.0 - z) / (0.1 + 0.9 * (1.0 - z)) if flip == "v" else 1.0 - z / (0.1 + 0.9 * z)
    raise AssertionError(profile)


def reference_bits(name: str, T: int, n: int, q_min: int, q_max: int) -> list[int]:
    if name == "static":
        return [q_max] * T
    parts = name.split("-")
    profile, shape, flip = parts[0], parts[1], (parts[2] if len(parts) > 2 else "")
    out = []
    for t in range(T):
        cycles_done = Fraction(t * n, T)  # t / L
        k = math.floor(cycles_done)
        z = float(cycles_done - k)
        frac = _fall(profile, flip, z) if (shape == "tri" and k % 2 == 0) else _rise(profile, z)
        out.append(round(q_min + (q_max - q_min) * frac))  # Python's round() is half-to-even, like rint
    return out


CASES = [  # (T, n, q_min, q_max): divisible and not, n = 1, n > T, wide and narrow ranges
    (64, 32, 3, 8),
    (1000, 32, 3, 8),
    (1001, 7, 4, 8),
    (997, 8, 2, 16),
    (20, 6, 3, 8),  # T/n = 3.33.., t=10 starts cycle 3 exactly
    (50, 1, 1, 16),
    (5, 9, 3, 6),
    (333, 3, 5, 5),
]


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
@pytest.mark.parametrize("T,n,q_min,q_max", CASES)
def test_bits_match_independent_scalar_reference(name, T, n, q_min, q_max):
    s = make_schedule(name, q_min=q_min, q_max=q_max, cycles=n)
    got = s.bits(T)
    assert got.dtype == np.int64 and got.shape == (T,)
    assert got.tolist() == reference_bits(name, T, n, q_min, q_max)


def test_original_cpt_formula_from_the_paper():
    # B_t = rint(B_min + ½(B_max − B_min)(1 − cos(π·(t mod P)/P))), P = T / cycles, with P an integer here
    T, n, lo, hi = 3200, 32, 3, 8
    P = T // n
    expect = [int(np.rint(lo + 0.5 * (hi - lo) * (1 - math.cos(math.pi * (t % P) / P)))) for t in range(T)]
    assert make_schedule("cpt", q_min=lo, q_max=hi, cycles=n).bits(T).tolist() == expect


@pytest.mark.parametrize("name", [n for n in SCHEDULE_NAMES if n.endswith("-tri") or "-tri-" in n])
def test_triangular_schedules_start_at_q_max_and_reach_q_min(name):
    for lo, hi in [(3, 8), (1, 16), (4, 6)]:
        b = make_schedule(name, q_min=lo, q_max=hi, cycles=4).bits(4000)
        assert b[0] == hi
        assert b.min() == lo and b.max() == hi
        assert b[1000] == lo  # cycle 1 (odd) starts rising from q_min


@pytest.mark.parametrize("name", [n for n in SCHEDULE_NAMES if n.endswith("-rep")])
def test_repeated_schedules_start_each_cycle_at_q_min(name):
    b = make_schedule(name, q_min=3, q_max=8, cycles=5).bits(1000)
    assert b[[0, 200, 400, 600, 800]].tolist() == [3] * 5
    assert b.max() <= 8 and b.min() == 3


def test_static_is_q_max_at_every_step_and_ignores_q_min_and_cycles():
    s = make_schedule("static", q_min=3, q_max=6, cycles=7)
    assert s.bits(123).tolist() == [6] * 123
    assert (s.q_min, s.cycles) == (6, 1)
    assert make_schedule("static", q_max=32).bits(3).tolist() == [32, 32, 32]


def test_grad_bits_static_by_default_and_cyclic_range_follows_the_forward_profile():
    s = make_schedule("rex-tri-h", q_min=4, q_max=8, g_bits=8, cycles=8)
    assert s.grad_bits(500).tolist() == [8] * 500
    c = make_schedule("rex-tri-h", q_min=4, q_max=8, g_bits=(6, 8), cycles=8)
    assert c.grad_bits(777).tolist() == reference_bits("rex-tri-h", 777, 8, 6, 8)
    assert c.bits(777).tolist() == s.bits(777).tolist()
    assert make_schedule("cpt", g_bits="6-8") == make_schedule("cpt", g_bits=(6, 8))


def test_alias_cpt_is_cos_rep():
    assert ALIASES == {"cpt": "cos-rep"}
    assert make_schedule("cpt") == make_schedule("cos-rep")
    assert make_schedule("CPT").name == "cos-rep"


def test_bits_for_100k_steps_is_fast():
    import time

    s = make_schedule("rex-tri-h", g_bits=(6, 8), cycles=8)
    t0 = time.perf_counter()
    for _ in range(20):
        s.bits(100_000)
        s.grad_bits(100_000)
    assert (time.perf_counter() - t0) / 20 < 0.05  # vectorized: a few ms; a Python loop takes ~100 ms


# ------------------------------------------------------------------ cost


def test_cpt_relative_cost_by_hand():
    # step 0: q=3, g=8 -> (9 + 48) / 3072 ; step 1: q=8, g=8 -> (64 + 128) / 3072 ; mean = 249 / 6144
    assert cpt_relative_cost(np.array([3, 8]), np.array([8, 8])) == pytest.approx(249 / 6144)
    assert cpt_relative_cost(np.array([32]), np.array([32])) == pytest.approx(1.0)
    assert cpt_relative_cost(np.array([4, 4]), 8) == pytest.approx((16 + 64) / 3072)


def test_describe_reports_bits_cost_and_histogram():
    s = parse_schedule("lin-rep:3-5:g8:n2")
    d = describe(s, 8)
    # z = 0, .25, .5, .75 per cycle -> 3 + 2z = 3, 3.5, 4, 4.5 -> rint 3, 4, 4, 4 (half to even)
    assert s.bits(8).tolist() == [3, 4, 4, 4, 3, 4, 4, 4]
    assert d["histogram"] == {"3": 2, "4": 6}
    assert (d["min_bits"], d["max_bits"], d["mean_bits"]) == (3, 4, 3.75)
    cost = (2 * (9 + 48) + 6 * (16 + 64)) / 8 / 3072
    assert d["relative_cost_fp32"] == pytest.approx(cost)
    assert d["relative_cost_static"] == pytest.approx(cost / ((25 + 80) / 3072))
    assert d["text"] == "lin-rep:3-5:g8:n2" and d["schedule"] == s.to_json()
    assert json.loads(json.dumps(d)) == d


def test_list_schedules_covers_all_names_in_order():
    rows = list_schedules()
    assert [r["name"] for r in rows] == list(SCHEDULE_NAMES) and len(rows) == 11
    kinds = {r["name"]: r["kind"] for r in rows}
    assert kinds["static"] == "static" and kinds["cos-rep"] == "repeated" and kinds["exp-tri-h"] == "triangular"
    assert all(r["description"] and r["reference"] for r in rows)


# ------------------------------------------------------------------ text form


@pytest.mark.parametrize("text,expect", [
    ("cos-rep:3-8:g8:n32", Schedule("cos-rep", 3, 8, 8, 8, 32)),
    ("cpt:3-8", Schedule("cos-rep", 3, 8, 8, 8, 32)),
    ("cpt", Schedule("cos-rep", 3, 8, 8, 8, 32)),
    ("static:8", Schedule("static", 8, 8, 8, 8, 1)),
    ("static:32", Schedule("static", 32, 32, 32, 32, 1)),  # full precision: the error too
    ("static:32:g8", Schedule("static", 32, 32, 8, 8, 1)),
    ("static", Schedule("static", 8, 8, 8, 8, 1)),
    ("rex-tri-h:4-8:g6-8:n8", Schedule("rex-tri-h", 4, 8, 6, 8, 8)),
    ("lin-tri:n4:g6:2-5", Schedule("lin-tri", 2, 5, 6, 6, 4)),
    ("cos-rep:8", Schedule("cos-rep", 8, 8, 8, 8, 32)),
])
def test_parse_schedule_examples(text, expect):
    assert parse_schedule(text) == expect


def test_parse_defaults_fill_only_omitted_parts():
    s = parse_schedule("rex-rep:4-8", q_min=2, q_max=6, g_bits="6-8", cycles=8)
    assert s == Schedule("rex-rep", 4, 8, 6, 8, 8)
    assert parse_schedule("static", q_max=6) == Schedule("static", 6, 6, 8, 8, 1)


_names = st.sampled_from(list(SCHEDULE_NAMES) + list(ALIASES))
_bits = st.integers(1, 16)


@st.composite
def _schedules(draw):
    name = draw(_names)
    a, b = sorted((draw(_bits), draw(_bits)))
    if name == "static":
        a = b = draw(st.sampled_from(sorted(VALID_BITS)))
    g = draw(st.one_of(st.sampled_from(sorted(VALID_BITS)), st.tuples(_bits, _bits).map(lambda p: tuple(sorted(p)))))
    if name == "static" and isinstance(g, tuple):
        g = g[1]
    return make_schedule(name, q_min=a, q_max=b, g_bits=g, cycles=draw(st.integers(1, 10_000)))


@settings(max_examples=300, deadline=None)
@given(_schedules())
def test_text_and_json_round_trip(s):
    assert parse_schedule(s.to_text()) == s
    assert Schedule.from_json(json.loads(json.dumps(s.to_json()))) == s


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("call", [
    lambda: make_schedule("cosine"),
    lambda: make_schedule("cos-rep", q_min=8, q_max=3),
    lambda: make_schedule("cos-rep", q_min=0, q_max=8),
    lambda: make_schedule("cos-rep", q_min=3, q_max=17),
    lambda: make_schedule("cos-rep", q_min=3, q_max=32),  # 32 only for static
    lambda: make_schedule("cos-rep", q_min=32, q_max=32),
    lambda: make_schedule("static", q_max=20),
    lambda: make_schedule("cos-rep", cycles=0),
    lambda: make_schedule("cos-rep", g_bits=(8, 6)),
    lambda: make_schedule("cos-rep", g_bits=(6, 32)),
    lambda: make_schedule("cos-rep", g_bits="six"),
    lambda: make_schedule("static", g_bits=(6, 8)),
    lambda: make_schedule("cos-rep", q_min=3.5),
    lambda: make_schedule("cos-rep").bits(0),
    lambda: make_schedule("cos-rep").grad_bits(-5),
    lambda: Schedule.from_json({"name": "cpt", "q_min": 3}),
    lambda: Schedule.from_json(["cpt"]),
    lambda: cpt_relative_cost(np.array([]), np.array([])),
])
def test_bad_input_raises_input_error(call):
    with pytest.raises(InputError) as e:
        call()
    assert "\n" not in str(e.value)


def test_unknown_name_lists_valid_names_and_alias():
    with pytest.raises(InputError, match=r"unknown schedule 'cosine'.*cos-rep \(alias cpt\).*rex-tri-h"):
        make_schedule("cosine")


@pytest.mark.parametrize("text,part", [
    ("cpt:3-x", "3-x"), ("cpt:x", "x"), ("cpt:g", "g"), ("cpt::n3", "''"), ("cpt:n3:n4", "n4"),
    ("static:3-8", "3-8"), ("cpt:n3-4", "n3-4"), ("cpt:9-3", "q_min=9"), ("", "expected"), ("nope:3-8", "nope"),
])
def test_bad_text_names_the_part_and_the_form(text, part):
    with pytest.raises(InputError) as e:
        parse_schedule(text)
    msg = str(e.value)
    assert part in msg and "\n" not in msg
    if "part" in msg:
        assert "NAME[:QMIN-QMAX|:Q][:gG|:gGMIN-GMAX][:nCYCLES]" in msg


# ------------------------------------------------------------------ CLI


def _invoke(args):
    return CliRunner().invoke(schedules_group, args, catch_exceptions=True)


def test_cli_list_table_and_json():
    r = _invoke(["list"])
    assert r.exit_code == 0, r.output
    assert "rex-tri-h" in r.output and "cpt" in r.output
    r = _invoke(["list", "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.output)
    assert [s["name"] for s in doc["schedules"]] == list(SCHEDULE_NAMES)


def test_cli_show_table_and_json():
    r = _invoke(["show", "cpt", "static", "--steps", "1000"])
    assert r.exit_code == 0, r.output
    assert "cos-rep:3-8:g8:n32" in r.output and "static:8:g8" in r.output
    r = _invoke(["show", "cpt", "rex-tri-h:4-8:g6-8:n8", "--steps", "1000", "--cycles", "4", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    texts = [d["text"] for d in doc["schedules"]]
    assert texts == ["cos-rep:3-8:g8:n4", "rex-tri-h:4-8:g6-8:n8"]
    assert doc["schedules"][0] == describe(parse_schedule("cpt:n4"), 1000)


def test_cli_show_plot_writes_a_real_png(tmp_path):
    import matplotlib.image

    png = tmp_path / "s.png"
    r = _invoke(["show", "cpt", "exp-tri-v", "static:32", "--steps", "2000", "--plot", str(png), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["plot"] == str(png)
    assert png.stat().st_size > 5_000
    img = matplotlib.image.imread(png)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300 and img.shape[2] in (3, 4)


def test_cli_bad_name_fails_with_a_message():
    r = _invoke(["show", "cosine"])
    assert r.exit_code != 0
    assert isinstance(r.exception, InputError) and "unknown schedule 'cosine'" in str(r.exception)
    r = _invoke(["show", "cpt", "--steps", "0"])
    assert isinstance(r.exception, InputError)


def test_cli_main_turns_bad_schedule_into_exit_2():
    try:
        from cptsim.cli.main import cli
    except ImportError:  # main imports commands other engineers are still writing
        pytest.skip("cptsim.cli.main not importable yet")
    r = CliRunner().invoke(cli, ["schedules", "show", "cosine"])
    assert r.exit_code == 2
    assert "error: unknown schedule 'cosine'" in r.output


@pytest.mark.parametrize("T, n", [(100_000, 32), (20, 6), (7, 10), (64_001, 64), (345, 32), (1, 1), (5, 5)])
def test_cycle_position_is_exact_integer_division(T, n):
    from cptsim.cost.schedules import cycle_position

    k, z = cycle_position(T, n)
    kk, rr = np.divmod(np.arange(T, dtype=np.int64) * n, T)
    assert np.array_equal(k, kk) and np.array_equal(z, rr / T)


@pytest.mark.parametrize("T, n", [(100_000, 32), (20, 6), (7, 10), (64_001, 64), (345, 32), (1, 1), (5, 5), (99, 3)])
@pytest.mark.parametrize("name", ["cos-rep", "rex-rep", "cos-tri", "exp-tri-h", "rex-tri-v"])
def test_bits_equal_the_per_step_definition_whether_cycles_divide_the_run_or_not(T, n, name):
    # bits() evaluates one cycle (or the distinct positions) and tiles/gathers; it must equal the formula per step
    from cptsim.cost.schedules import cycle_position, profile_fn

    s = make_schedule(name, q_min=2, q_max=9, cycles=n)
    k, z = cycle_position(T, n)
    expected = np.rint(2 + 7 * profile_fn(name)(z, k)).astype(np.int64)
    assert s.bits(T).dtype == np.int64 and np.array_equal(s.bits(T), expected)


def test_cli_show_names_each_widths_format_in_a_float_family(tmp_path):
    # mx (cptsim.numerics.families): 4 -> mxfp4, 5 and 6 -> mxfp6, 7 and 8 -> mxfp8; gradients as --grad-format says
    png = tmp_path / "mx.png"
    r = _invoke(["show", "cpt:4-8:g8:n2", "--steps", "200", "--number-format", "mx", "--grad-format", "fp8e5m2",
                 "--plot", str(png), "--json"])
    assert r.exit_code == 0, r.output
    f = json.loads(r.output)["schedules"][0]["formats"]
    assert f == {"forward": {"4": "mxfp4", "5": "mxfp6", "6": "mxfp6", "7": "mxfp8", "8": "mxfp8"},
                 "gradient": {"8": "fp8e5m2"}}
    assert png.stat().st_size > 5_000
    r = _invoke(["show", "cpt", "--json"])  # the integer default: no formats
    assert "formats" not in json.loads(r.output)["schedules"][0]
    r = _invoke(["show", "cpt", "--number-format", "posit"])
    assert isinstance(r.exception, InputError) and "posit" in str(r.exception)


@pytest.mark.parametrize("T, n", [(20, 6), (7, 10), (345, 32), (1, 1), (99, 3), (64_000, 64), (1000, 8)])
@pytest.mark.parametrize("name", [n for n in SCHEDULE_NAMES if n != "static"])
def test_thresholds_split_each_piece_where_bits_cross_each_width(T, n, name):
    # The planner counts a schedule's steps at each width from Schedule.pieces and Schedule.thresholds alone; the
    # truth they must match is bits(): in each piece's cycles, a step at position r = (t*n) mod T has bits <= b
    # exactly when r < R (rising) or r >= R (falling).
    for lo, hi in ((2, 9), (3, 8), (4, 5), (1, 16)):
        s = make_schedule(name, q_min=lo, q_max=hi, cycles=n)
        bits = s.bits(T)
        t = np.arange(T, dtype=np.int64)
        k, r = t * n // T, t * n % T
        pieces = Schedule.pieces(name)
        shapes = [p.shape for p in pieces]
        levels = np.arange(lo, hi)
        which = np.repeat(np.arange(len(pieces)), levels.size)
        R = Schedule.thresholds(T, shapes, which, np.full(which.size, lo), np.full(which.size, hi),
                                np.tile(levels, len(pieces)))
        covered = np.zeros(T, dtype=bool)
        for i, p in enumerate(pieces):
            mine = {"all": np.ones(T, bool), "even": k % 2 == 0, "odd": k % 2 == 1}[p.cycles]
            covered |= mine
            for j, b in enumerate(levels.tolist()):
                below = r[mine] < R[i * levels.size + j]
                expect = bits[mine] <= b
                assert np.array_equal(~below if p.falling else below, expect), (name, lo, hi, p, b)
        assert covered.all()


def test_thresholds_take_elements_in_any_shape_order():
    shapes = ["cos-up", "exp-down-h"]
    which, lo, hi, b = np.array([1, 0, 1, 0]), np.array([3, 3, 2, 2]), np.array([8, 8, 9, 9]), np.array([5, 5, 4, 6])
    got = Schedule.thresholds(1000, shapes, which, lo, hi, b)
    for i in range(4):
        one = Schedule.thresholds(1000, [shapes[which[i]]], [0], lo[i:i + 1], hi[i:i + 1], b[i:i + 1])
        assert got[i] == one[0]
    assert Schedule.pieces("static") == () and Schedule.pieces("cpt")[0].cycles == "all"
