"""The tiling search of a GEMM or convolution on an accelerator's array, and the access counts it implies.

Pure functions over numpy arrays; no profile objects. ``search`` prices one *problem* (a convolution or GEMM phase,
``Problem``) on one array (``ArraySpec``): every tiling of the problem into the array's double-buffered weight,
input and output buffers, in every loop order, and keeps the fastest (fewest cycles; among equals, least energy).

The model is the one the Bit Fusion authors' simulator uses (github.com/hsharma35/bitfusion,
``src/optimizer/optimizer.py``, ``src/simulator/accelerator.py``), written here from its description, vectorized
over tilings and loop orders, and generalized to rectangular outputs, fractional taps (a strided convolution's dgrad),
arrays that compute several output positions at once (Stripes' windows) and packing laws of other kinds:

* The array: ``rows`` reduction lanes, each packing ``pf`` reduction elements per cycle (Bit Fusion's brick law:
  floor(8/max(b_a,2)) * floor(8/max(b_w,2))); pf < 1 means a row's element takes 1/pf cycles (a bit-serial lane's
  serial bits, DNNsim's P; a fixed-width or wide operand's passes), and
  ``columns`` output channels. Output positions run one after another (``windows`` at a time). A channel-wise
  convolution runs its kernel taps in time and its input channels on the rows; im2col folds the taps into the
  reduction. Every tile is padded to whole rows and columns.
* Tiles: batch, output rows/columns (square tiles of a power of two, clipped), input channels (a power of two) and
  output channels (a power of two times the columns; a power of two under im2col). A tile must fit half its buffer
  (double buffering); an input tile holds its halo, ``K + (o - 1) * stride`` per side.
* Loop order: the five tile loops in any order. Walking from the innermost loop out, a buffer keeps its tensor
  (each loop that does not index it reuses it for free, each loop that does grows it) until it outgrows half its
  buffer; from there on every outer loop refetches it. Outputs are partial sums of ``output_bits`` bits: they are
  written to DRAM and read back by every loop that revisits them.
* Cycles: compute cycles + max(0, DRAM cycles of the steady state - compute cycles) + the first fill and the last
  drain, which overlap nothing. DRAM moves ``interface_bits`` bits per cycle.
* Buffer accesses inside a tile follow the cheapest of input-, output- and weight-stationary orders (bits moved).
* Energy: the array's energy per busy cycle, each buffer's read and write energy per bit, DRAM energy per bit.

On the authors' 305 published per-layer rows (five arrays, eight networks) this reproduces their cycles, memory
wait cycles and DRAM bits exactly (``benchmarks/bench_bitfusion_authors.py``, ``tests/test_array_model.py``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from cptsim.errors import InputError

# Bumped whenever the search's results change, so that a cache of them (tiling_cache) is not reused.
MODEL_VERSION = "bitfusion-sim/2"

# The five tile loops, and which buffer each one indexes (True: a new tile of that tensor each iteration).
LOOPS = ("b", "ow", "oh", "ic", "oc")
_DEPS = {"wgt": (False, False, False, True, True),
         "act": (True, True, True, True, False),
         "out": (True, True, True, False, True)}
# Every loop order, outermost first; with square outputs the ow and oh loops are interchangeable (same counts, same
# buffers), so half the orders give the other half's results and are skipped.
_ORDERS = np.array(list(itertools.permutations(range(len(LOOPS)))), dtype=np.intp)
_ORDERS_SQUARE = _ORDERS[[list(o).index(1) < list(o).index(2) for o in _ORDERS]]


@dataclass(frozen=True)
class ArraySpec:
    """An accelerator's array, buffers and memory interface, in the units the search counts in (bits, cycles)."""

    rows: int                 # reduction lanes
    columns: int              # output-channel lanes
    windows: int              # output positions computed at once
    wbuf_bits: float          # whole weight buffer (the search uses half: double buffering)
    ibuf_bits: float
    obuf_bits: float
    interface_bits: float     # DRAM bits per cycle (already scaled by memory_efficiency)
    core_pj_per_cycle: float  # the whole array, per busy cycle
    wbuf_read_pj: float       # per bit
    wbuf_write_pj: float
    ibuf_read_pj: float
    ibuf_write_pj: float
    obuf_read_pj: float
    obuf_write_pj: float
    dram_pj: float            # per bit, read or written


class Problem(NamedTuple):
    """One phase of one layer as the array sees it: ``batch`` x (``out_h`` x ``out_w``) output positions of ``oc``
    output channels, each reducing ``ic`` x ``taps`` products; an input tile spans ``k_h + (oh - 1) * stride`` rows.
    ``pf``: reduction elements per row per cycle at these widths; ``ip``, ``wp``, ``op``: bits of the input, the
    weight-side operand and the (partial) outputs as they travel; ``im2col``: taps folded into the reduction."""

    batch: float
    out_h: float
    out_w: float
    k_h: float
    k_w: float
    stride: float
    taps: float
    ic: float
    oc: float
    pf: float
    ip: float
    wp: float
    op: float
    im2col: bool


class Access(NamedTuple):
    """The chosen tiling's counts (bits and cycles) and energy (J)."""

    cycles: float
    compute_cycles: float
    stall_cycles: float
    dram_read_bits: float
    dram_write_bits: float
    wbuf_read_bits: float
    wbuf_write_bits: float
    ibuf_read_bits: float
    ibuf_write_bits: float
    obuf_read_bits: float
    obuf_write_bits: float
    energy_j: float
    tile: tuple           # (b, ow, oh, ic, oc)
    order: tuple          # loop names, outermost first


def _pow2_tiles(n: float, unit: float = 1.0) -> np.ndarray:
    """Tile sizes unit * 2^i clipped at n, i = 0 .. ceil(log2(n / unit)), as the authors' search enumerates them."""
    steps = int(math.ceil(math.log2(math.ceil(n / unit)))) + 1 if n > unit else 1
    return np.unique(np.minimum(unit * (2.0 ** np.arange(steps)), n))


_DEP = np.array([_DEPS["wgt"], _DEPS["act"], _DEPS["out"]])  # (3 tensors, 5 loops)


def _traffic(tile_bits, counts, cap, orders):
    """Bits of each tensor (weights, inputs, outputs) moved from (or to) DRAM, and the largest block of it held at
    once, for every loop order: each (3, orders, T).

    ``tile_bits`` (3, T), ``counts`` (5, T) iterations of each loop; ``cap`` (3,): half of each buffer. Walks the
    loops from the innermost out (module docstring)."""
    size = np.broadcast_to(tile_bits[:, None, :], (3, len(orders), tile_bits.shape[1])).copy()
    held = size.copy()
    keeps = np.ones(size.shape, dtype=bool)
    cap = np.asarray(cap, dtype=np.float64)[:, None, None]
    for pos in range(len(LOOPS) - 1, -1, -1):
        loop = orders[:, pos]
        d = _DEP[:, loop][:, :, None]                   # (3, orders, 1)
        grown = size * counts[loop][None]
        size = np.where(~keeps | d, grown, size)
        grows = keeps & d
        over = grows & (size > cap)
        held = np.where(grows & ~over, size, held)
        keeps &= ~over
    return size, held


def search(p: Problem, s: ArraySpec) -> Access:
    """The fastest tiling of problem ``p`` on array ``s`` (module docstring); energy breaks ties."""
    # pf >= 1 packs pf reduction elements into a row per cycle; pf < 1 means each group of rows-many elements
    # takes 1/pf cycles (a bit-serial lane's P bits, a wide operand's passes)
    pack, passes = max(p.pf, 1.0), 1.0 / min(p.pf, 1.0)
    rows = s.rows * pack
    grid = np.meshgrid(_pow2_tiles(p.batch), _pow2_tiles(max(p.out_h, p.out_w)), _pow2_tiles(p.ic),
                       _pow2_tiles(p.oc, 1.0 if p.im2col else s.columns), indexing="ij")
    b, t, ic, oc = (g.ravel() for g in grid)
    ow, oh = np.minimum(t, p.out_w), np.minimum(t, p.out_h)
    ocp = np.ceil(oc / s.columns) * s.columns
    red = np.ceil(p.taps * ic / rows) * rows  # the reduction padded to whole rows (im2col and the weight tile)
    w0 = red * oc * p.wp
    if p.im2col:
        a0 = ow * oh * p.taps * ic * b * p.ip
    else:
        a0 = (p.k_w + (ow - 1) * p.stride) * (p.k_h + (oh - 1) * p.stride) * ic * b * p.ip
    o0 = ow * oh * ocp * b * p.op
    cap_w, cap_a, cap_o = s.wbuf_bits / 2, s.ibuf_bits / 2, s.obuf_bits / 2
    fits = (w0 <= cap_w) & (a0 <= cap_a) & (o0 <= cap_o)
    if not fits.any():  # a user's array whose buffers are smaller than one row's worth of one tile
        raise InputError(f"the array's buffers hold no tile of a layer ({p.ic:g} -> {p.oc:g} channels): the smallest "
                         f"needs {w0.min() / 8:g} B of weight buffer, {a0.min() / 8:g} B of input buffer and "
                         f"{o0.min() / 8:g} B of output buffer, twice over (double buffering)")
    b, ow, oh, ic, oc, ocp, red, w0, a0, o0 = (x[fits] for x in (b, ow, oh, ic, oc, ocp, red, w0, a0, o0))
    counts = np.stack([np.ceil(p.batch / b), np.ceil(p.out_w / ow), np.ceil(p.out_h / oh), np.ceil(p.ic / ic),
                       np.ceil(p.oc / oc)])
    tiles = counts.prod(axis=0)
    orders = _ORDERS_SQUARE if p.out_h == p.out_w else _ORDERS
    (wgt, act, out), (wgt_held, act_held, out_held) = _traffic(np.stack([w0, a0, o0]), counts,
                                                                (cap_w, cap_a, cap_o), orders)
    dram = wgt + act + 2 * out            # outputs: written, and read back by every revisit
    first = wgt_held + act_held + out_held
    last = out_held
    positions = b * np.ceil(ow * oh / s.windows)
    if p.im2col:
        per_tile = positions * (ocp / s.columns) * (red / rows) * passes
        stat_red = red
    else:
        per_tile = positions * (ocp / s.columns) * p.taps * np.ceil(ic / rows) * passes
        stat_red = np.ceil(ic / rows) * rows * p.taps
    compute = tiles * per_tile
    steady = np.ceil((dram - first - last) / s.interface_bits)
    stall = np.maximum(0.0, steady - compute) + np.ceil(first / s.interface_bits) + np.ceil(last / s.interface_bits)
    cycles = compute + stall

    # Inside a tile: the stationary order that moves the fewest bits between the buffers and the array.
    ws_loop = b * ow * oh
    is_e = stat_red * ws_loop * (p.ip + ocp * (p.wp + p.op))
    os_e = ocp * ws_loop * (p.op + stat_red * (p.ip + p.wp))
    ws_e = stat_red * ocp * (p.wp + ws_loop * (p.ip + p.op))
    pick_is = is_e <= np.minimum(os_e, ws_e)
    pick_os = ~pick_is & (os_e <= ws_e)
    red_el = p.taps * ic
    pos_el = ow * oh * b
    ibuf_r = tiles * red_el * pos_el * np.where(pick_is | pick_os, 1.0, oc) * p.ip
    ibuf_r = np.where(pick_os, tiles * oc * pos_el * red_el * p.ip, ibuf_r)
    obuf_inner = tiles * pos_el * oc * p.op * np.where(pick_os, 1.0, red_el)
    wbuf_r = tiles * red_el * oc * p.wp * np.where(pick_is | pick_os, pos_el, 1.0)

    pj = (compute * s.core_pj_per_cycle
          + wgt * s.wbuf_write_pj + wbuf_r * s.wbuf_read_pj
          + act * s.ibuf_write_pj + ibuf_r * s.ibuf_read_pj
          + (out + obuf_inner) * (s.obuf_read_pj + s.obuf_write_pj)
          + dram * s.dram_pj)
    best = np.lexsort((pj.ravel(), cycles.ravel()))[0]
    o, t = np.unravel_index(best, cycles.shape)
    return Access(
        cycles=float(cycles[o, t]), compute_cycles=float(compute[t]), stall_cycles=float(stall[o, t]),
        dram_read_bits=float(wgt[o, t] + act[o, t] + out[o, t]), dram_write_bits=float(out[o, t]),
        wbuf_read_bits=float(wbuf_r[t]), wbuf_write_bits=float(wgt[o, t]),
        ibuf_read_bits=float(ibuf_r[t]), ibuf_write_bits=float(act[o, t]),
        obuf_read_bits=float(out[o, t] + obuf_inner[t]), obuf_write_bits=float(out[o, t] + obuf_inner[t]),
        energy_j=float(pj[o, t]) * 1e-12,
        tile=(float(b[t]), float(ow[t]), float(oh[t]), float(ic[t]), float(oc[t])),
        order=tuple(LOOPS[i] for i in orders[o]),
    )

