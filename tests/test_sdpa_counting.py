"""Issue 25 item 10: attention inside torchvision / timm models (F.scaled_dot_product_attention, nn.MultiheadAttention)
is counted per layer, checked against torch.utils.flop_counter, and priced without counting a GPU's fused kernel twice.

FlopCounterMode has no formula for the CPU's fused kernel (aten._scaled_dot_product_flash_attention_for_cpu), so the
comparisons run SDPA on its math backend, whose bmm's it counts; the counter's numbers do not depend on the backend
(checked below)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from cptsim.cost.model import estimate, fused_attention_share, step_cost
from cptsim.errors import InputError
from cptsim.measure.profiler import LayerProfile, MacCounter, profile_model, sdpa_macs

BUILTIN_SDPA = F.scaled_dot_product_attention


def _tiny_timm_vit():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", depth=2, img_size=32, patch_size=8, num_classes=10)


def _tiny_torchvision_vit():
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return tv.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64,
                                       mlp_dim=128, num_classes=10)


def _flops(fn):
    """(MACs, MACs per module) that FlopCounterMode counts for fn(), SDPA on its math backend (bmm's it counts)."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as f:
        fn()
    by_module = {k: sum(v.values()) // 2 for k, v in f.get_flop_counts().items()}
    return f.get_total_flops() // 2, by_module


def _entries(counter):
    return {n: acc for n, acc in zip(counter._names, counter._acc)}


def _check_against_flop_counter(model, x, attention_modules):
    """Total forward and backward MACs, and each attention module's forward MACs (its entries: its sublayers',
    the projections nn.MultiheadAttention runs with F.linear, scores and mix), equal FlopCounterMode's / 2."""
    model.train()
    with MacCounter(model) as counter:
        holder = {}
        fwd, by_module = _flops(lambda: holder.setdefault("out", model(x)))
        macs = counter.step_macs()
        assert macs["fwd"] == fwd > 0
        prefix = type(model).__name__
        rows = _entries(counter)
        for name in attention_modules:
            assert rows[f"{name}.scores"][0] > 0 and rows[f"{name}.mix"][0] > 0
            mine = sum(acc[0] for n, acc in rows.items() if n.startswith(f"{name}."))
            assert mine == by_module[f"{prefix}.{name}"], name
        # every counted entry has its own module's count where it is a module (Linear, Conv2d)
        for name, acc in rows.items():
            if f"{prefix}.{name}" in by_module and not name.endswith((".scores", ".mix")):
                assert acc[0] == by_module[f"{prefix}.{name}"], name
        bwd, _ = _flops(lambda: holder["out"].float().sum().backward())
        assert macs == counter.step_macs()  # the backward adds nothing: known at forward time
        assert bwd == macs["dgrad"] + macs["wgrad"]
        return counter, macs


# -- per layer and in total, against FlopCounterMode ---------------------------------------------------------------


def test_timm_vit_attention_is_counted_per_layer_as_flop_counter_counts_it():
    model = _tiny_timm_vit()
    counter, macs = _check_against_flop_counter(model, torch.randn(2, 3, 32, 32), ["blocks.0.attn", "blocks.1.attn"])
    names = counter._names
    # listed after the module's own sublayers, as cptsim's attention entries are named: <module>.scores / .mix
    assert names.index("blocks.0.attn.proj") < names.index("blocks.0.attn.scores") < names.index("blocks.0.attn.mix") \
        < names.index("blocks.0.mlp.fc1")
    # 17 tokens (16 patches + cls), 3 heads of 64: scores and mix each 2 x 3 x 17 x 17 x 64 per batch of 2
    prof = counter.layer_profile(2, (3, 32, 32))
    r = {x.name: x for x in prof.layers}
    for part in ("scores", "mix"):
        rec = r[f"blocks.0.attn.{part}"]
        assert rec.type == "Matmul" and rec.sdpa and not rec.quantized and rec.numel["weight"] == 0
        assert rec.macs == {"fwd": 3 * 17 * 17 * 64, "dgrad": 3 * 17 * 17 * 64, "wgrad": 3 * 17 * 17 * 64}
        assert rec.operand == 3 * 17 * 64  # K (scores) or V (mix), per sample
        assert rec.calls == 1
    assert r["blocks.0.attn.scores"].numel == {"weight": 0, "input": 3 * 17 * 64, "output": 3 * 17 * 17}
    assert r["blocks.0.attn.mix"].numel == {"weight": 0, "input": 3 * 17 * 17, "output": 3 * 17 * 64}
    assert r["blocks.0.attn.scores"].gemm == {"groups": 1, "n": 17, "k": 64, "rows": 3 * 17, "rows_per_gemm": 17}
    assert r["blocks.0.attn.mix"].gemm == {"groups": 1, "n": 64, "k": 17, "rows": 3 * 17, "rows_per_gemm": 17}
    assert "attention" in prof.op_mix()


def test_torchvision_vit_attention_and_multihead_projections_are_counted_as_flop_counter_counts_them():
    from cptsim.numerics.layers import quantize_model

    model = _tiny_torchvision_vit()
    quantize_model(model, fp_layers=[])  # at 32 bits, as the profile runs: the same MACs
    mods = [f"encoder.layers.encoder_layer_{i}.self_attention" for i in (0, 1)]
    counter, _ = _check_against_flop_counter(model, torch.randn(2, 3, 32, 32), mods)
    prof = counter.layer_profile(2, (3, 32, 32))
    r = {x.name: x for x in prof.layers}
    att = mods[0]
    # nn.MultiheadAttention runs its projections with F.linear: in_proj is its own entry, out_proj's entry is filled,
    # and both run at full precision whatever out_proj's class
    assert r[f"{att}.in_proj"].type == "Linear" and r[f"{att}.in_proj"].numel["weight"] == 3 * 64 * 64
    assert r[f"{att}.in_proj"].macs["fwd"] == 17 * 3 * 64 * 64 and not r[f"{att}.in_proj"].quantized
    assert r[f"{att}.out_proj"].macs["fwd"] == 17 * 64 * 64 and not r[f"{att}.out_proj"].quantized
    assert r[f"{att}.scores"].sdpa and r[f"{att}.mix"].macs["fwd"] == 17 * 17 * 64  # 4 heads of 16
    assert r["encoder.layers.encoder_layer_0.mlp.0"].quantized and r["heads.head"].quantized


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_either_path_as_flop_counter_counts_it(need_weights, batch_first):
    """need_weights=True (nn.MultiheadAttention's default) computes attention with bmm, not SDPA: the same entries,
    the same MACs, marked sdpa False (a plain GEMM on every hardware)."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.att = nn.MultiheadAttention(32, 4, batch_first=batch_first)
            self.fc = nn.Linear(32, 5)

        def forward(self, x):
            y, _ = self.att(x, x, x, need_weights=need_weights)
            return self.fc(y.mean(1 if batch_first else 0))

    torch.manual_seed(0)
    x = torch.randn(2, 7, 32) if batch_first else torch.randn(7, 2, 32)
    counter, macs = _check_against_flop_counter(Net(), x, ["att"])
    prof = counter.layer_profile(2, (7, 32))
    r = {x.name: x for x in prof.layers}
    assert r["att.scores"].sdpa is (not need_weights) and r["att.scores"].macs["fwd"] == 7 * 7 * 32
    assert r["att.in_proj"].macs["dgrad"] == 0  # the data needs no gradient


def test_cross_attention_with_other_key_and_value_widths_as_flop_counter_counts_it():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.att = nn.MultiheadAttention(32, 4, kdim=24, vdim=40, bias=False, add_bias_kv=True)
            self.fc = nn.Linear(32, 5)

        def forward(self, inputs):
            q, k, v = inputs
            return self.fc(self.att(q, k, v, need_weights=False)[0].mean(0))

    torch.manual_seed(0)
    q = torch.randn(6, 2, 32, requires_grad=True)
    k, v = torch.randn(9, 2, 24), torch.randn(9, 2, 40)
    model = Net().train()
    with MacCounter(model) as counter:
        holder = {}
        fwd, _ = _flops(lambda: holder.setdefault("out", model((q, k, v))))
        assert counter.step_macs()["fwd"] == fwd
        bwd, _ = _flops(lambda: holder["out"].sum().backward())
        m = counter.step_macs()
        assert m["dgrad"] + m["wgrad"] == bwd
        r = _entries(counter)
        assert r["att.in_proj"][0] == 2 * (6 * 32 * 32 + 9 * 32 * 24 + 9 * 32 * 40)
        assert r["att.in_proj"][1] == 2 * 6 * 32 * 32  # only the query needs a gradient
        assert r["att.scores"][0] == 2 * 6 * 10 * 32  # 9 keys + bias_k


@pytest.mark.parametrize("case", ["plain", "causal", "mask", "gqa", "3d", "cross"])
def test_sdpa_calls_of_any_shape_as_flop_counter_counts_them(case):
    """Each call: forward = flop_counter's sdpa_flop_count / 2 (the full L x S matrix, masked or not), backward = the
    4 gradient GEMMs the math backend runs; the fused kernels' backward formula adds the recomputed scores (5)."""
    torch.manual_seed(0)
    B, H, L, S, E, Ev = 2, 4, 6, 6, 8, 8
    kw, hk = {}, H
    if case == "causal":
        kw["is_causal"] = True
    elif case == "gqa":
        hk, kw["enable_gqa"] = 2, True
    elif case == "cross":
        S, Ev = 9, 12
    shape_q = (B * H, L, E) if case == "3d" else (B, H, L, E)
    shape_k = (B * H, S, E) if case == "3d" else (B, hk, S, E)
    shape_v = (B * H, S, Ev) if case == "3d" else (B, hk, S, Ev)
    q, k, v = (torch.randn(s, requires_grad=True) for s in (shape_q, shape_k, shape_v))
    mask = torch.randn(L, S, requires_grad=True) if case == "mask" else None

    class Core(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)

    core = Core()
    with MacCounter(core) as counter:
        holder = {}
        fwd, _ = _flops(lambda: holder.setdefault("out", core(q, k, v)))
        bwd, _ = _flops(lambda: holder["out"].sum().backward())
        m = counter.step_macs()
        r = _entries(counter)
    assert set(r) == {"scores", "mix"}
    assert m["fwd"] == fwd
    assert m["dgrad"] + m["wgrad"] == bwd
    if case != "3d":
        assert m["fwd"] == sdpa_flop_count(shape_q, shape_k, shape_v) // 2
        fused_bwd = sdpa_backward_flop_count(shape_q[:3] + (Ev,), shape_q, shape_k, shape_v) // 2
        assert fused_bwd == m["dgrad"] + m["wgrad"] + r["scores"][0]  # + the recomputed scores


def test_counts_do_not_depend_on_the_backend_and_follow_the_gradients():
    model = _tiny_timm_vit().train()
    x = torch.randn(2, 3, 32, 32)
    with MacCounter(model) as counter:
        model(x)  # the CPU's fused kernel
        fused = counter.step_macs()
        counter.reset()
        with sdpa_kernel(SDPBackend.MATH):
            model(x)
        assert counter.step_macs() == fused
        counter.reset()
        with torch.no_grad():
            model(x)
        r = _entries(counter)
        assert r["blocks.0.attn.scores"][:3] == [3 * 17 * 17 * 64 * 2, 0, 0]
        counter.reset()
        for m in (model.patch_embed, model.blocks[0].norm1, model.blocks[0].attn.qkv):
            for p in m.parameters():
                p.requires_grad_(False)
        model.pos_embed.requires_grad_(False)
        model.cls_token.requires_grad_(False)
        model(x)  # nothing before blocks.0.attn's q, k, v needs a gradient: no backward through its attention
        r = _entries(counter)
        assert r["blocks.0.attn.scores"][1:3] == [0, 0] and r["blocks.0.attn.mix"][1:3] == [0, 0]
        assert r["blocks.1.attn.scores"][1] > 0


# -- the deit_tiny figure ----------------------------------------------------------------------------------------


def test_deit_tiny_attention_is_178_8m_macs_per_image_at_224():
    """2 matmuls x 197 tokens² x 192 wide x 12 layers = 178,831,872 MACs per image, ~14% of the forward."""
    pytest.importorskip("timm")
    from cptsim.models import create_model

    model = create_model("timm:deit_tiny_patch16_224", num_classes=1000, in_channels=3, input_shape=(3, 224, 224))
    model.eval()
    with MacCounter(model) as counter, torch.no_grad():
        model(torch.randn(1, 3, 224, 224))
        prof = counter.layer_profile(1, (3, 224, 224))
    att = [r for r in prof.layers if r.sdpa]
    assert len(att) == 24 and all(r.type == "Matmul" and not r.quantized for r in att)
    assert sum(r.macs["fwd"] for r in att) == 2 * 197 ** 2 * 192 * 12 == 178_831_872
    share = sum(r.macs["fwd"] for r in att) / sum(r.macs["fwd"] for r in prof.layers)
    assert 0.14 < share < 0.145


# -- the mechanism ------------------------------------------------------------------------------------------------


def test_the_wrapper_lives_while_a_counter_is_open_and_counts_only_its_models_calls():
    import gc

    # An earlier test's counter left open and still alive (in a reference cycle the collector has not reached)
    # keeps the wrapper installed, by design: collect it, and let one open-and-close prune the dead references
    # (which restores the function when no live counter remains) before checking the starting state.
    gc.collect()
    with MacCounter(nn.Linear(2, 2)):
        pass
    model = _tiny_timm_vit().train()
    other = copy.deepcopy(model)  # another model: its calls are not ours
    x = torch.randn(1, 3, 32, 32)
    assert F.scaled_dot_product_attention is BUILTIN_SDPA
    a = MacCounter(model)
    b = MacCounter(other)
    assert F.scaled_dot_product_attention is not BUILTIN_SDPA
    model(x)
    ra, rb = _entries(a), _entries(b)
    assert ra["blocks.0.attn.scores"][0] > 0 and "blocks.0.attn.scores" not in rb
    copy.deepcopy(model)(x)  # a deepcopy carries the hooks along; its calls are not counted
    q = torch.randn(1, 2, 4, 8)
    F.scaled_dot_product_attention(q, q, q)  # outside any module: nobody's
    assert _entries(a)["blocks.0.attn.scores"][3] == 1
    a.enabled = False
    model(x)
    assert _entries(a)["blocks.0.attn.scores"][3] == 1
    a.close()
    assert F.scaled_dot_product_attention is not BUILTIN_SDPA  # b is still open
    b.close()
    b.close()  # idempotent
    assert F.scaled_dot_product_attention is BUILTIN_SDPA
    out = F.scaled_dot_product_attention(q, q, q)
    assert torch.equal(out, BUILTIN_SDPA(q, q, q))


def test_a_counter_never_closed_keeps_no_model_alive():
    import gc
    import weakref

    model = _tiny_timm_vit()
    MacCounter(model)  # never closed
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None
    q = torch.randn(1, 2, 4, 8)
    assert torch.equal(F.scaled_dot_product_attention(q, q, q), BUILTIN_SDPA(q, q, q))
    with MacCounter(nn.Linear(2, 2)):
        pass
    assert F.scaled_dot_product_attention is BUILTIN_SDPA  # the last open counter closed: the function is back


def test_innermost_module_gets_the_call_helpers_and_several_calls_included():
    def helper(q, k, v):  # a function a module calls: its caller is the module
        return F.scaled_dot_product_attention(q, k, v)

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.scores = nn.Linear(8, 8)  # a sublayer named like the entry: the entries say sdpa

        def forward(self, x):
            y = helper(x, x, x)
            return F.scaled_dot_product_attention(self.scores(y), y, y)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = Attn()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(self.attn(x))

    net = nn.Sequential(Block(), nn.Linear(8, 3))
    with MacCounter(net) as counter:
        net(torch.randn(2, 5, 8))
        names = list(counter._names)
        r = _entries(counter)
    assert names == ["0.attn.scores", "0.attn.sdpa.scores", "0.attn.sdpa.mix", "0.fc", "1"]
    assert r["0.attn.sdpa.scores"][3] == 2 and r["0.attn.sdpa.scores"][0] == 2 * 2 * 5 * 5 * 8


def test_the_sdpa_flag_round_trips_through_json():
    model = _tiny_timm_vit()
    prof = profile_model(model, (3, 32, 32), batch_size=2, model_name="tiny-vit")
    back = LayerProfile.from_json(json.loads(json.dumps(prof.to_json())))
    assert [r.sdpa for r in back.layers] == [r.sdpa for r in prof.layers] and sum(r.sdpa for r in back.layers) == 4
    assert back.arrays().sdpa.tolist() == prof.arrays().sdpa.tolist()
    doc = prof.to_json()
    doc["layers"][3]["sdpa"] = "yes"
    with pytest.raises(InputError, match="sdpa"):
        LayerProfile.from_json(doc)
    assert all("sdpa" not in d for d in doc["layers"] if d["type"] != "Matmul")  # absent where False


def test_macs_formula_by_hand():
    q, k, v = torch.zeros(2, 3, 5, 8), torch.zeros(2, 3, 7, 8), torch.zeros(2, 3, 7, 4)
    c = sdpa_macs(q, k, v, torch.zeros(2, 3, 5, 4), grad=False)
    assert c["scores"]["fwd"] == 2 * 3 * 5 * 7 * 8 and c["mix"]["fwd"] == 2 * 3 * 5 * 7 * 4
    assert c["scores"]["dgrad"] == c["mix"]["wgrad"] == 0
    assert sdpa_macs(q.to_sparse(), k, v, None) is None


# -- pricing: BitOPs at 32 x 32; a GPU's fused kernels priced once ------------------------------------------------


@pytest.fixture(scope="module")
def vit_profile():
    return profile_model(_tiny_timm_vit(), (3, 32, 32), batch_size=2, model_name="tiny-vit")


def _without_sdpa(prof):
    return LayerProfile(prof.model, list(prof.input_shape), [r for r in prof.layers if not r.sdpa], ops=prof.ops)


def test_op_list_and_entries_hold_the_same_attention(vit_profile):
    att = [r for r in vit_profile.layers if r.sdpa]
    s = vit_profile.ops.summary()
    fwd = sum(r.macs["fwd"] for r in att)
    assert s["fwd"]["attention_macs_per_sample"] == fwd > 0  # the CPU ran the fused kernel
    # its backward formula: the 4 gradient GEMMs of the entries + the scores recomputed (2.5 x the forward)
    assert s["bwd"]["attention_macs_per_sample"] == sum(r.macs["dgrad"] + r.macs["wgrad"] for r in att) + fwd / 2
    assert fused_attention_share(vit_profile.arrays()) == 1.0
    no_ops = vit_profile.arrays()
    no_ops.ops = None
    assert fused_attention_share(no_ops) == 0.0


def test_attention_is_priced_at_32_bits_and_the_gpus_fused_kernels_once(vit_profile):
    sched = {"batch_size": [64], "bits": [6], "grad_bits": [8]}
    att = [r for r in vit_profile.layers if r.sdpa]
    att_macs = 64 * sum(sum(r.macs.values()) for r in att)
    lean = _without_sdpa(vit_profile)
    # BitOPs: every attention MAC at 32 x 32, whatever the schedule's bits
    full, base = estimate(vit_profile, sched), estimate(lean, sched)
    assert full.bitops["total"] - base.bitops["total"] == pytest.approx(att_macs * 32 * 32, rel=1e-12)
    rows = {r["name"]: r for r in full.per_layer}
    r = att[0]
    assert rows[r.name]["bitops"]["fwd"] == pytest.approx(64 * r.macs["fwd"] * 1024)
    # a GPU prices the fused kernels from the op list: the entries add no time or energy there (not counted twice)
    for hw in ("h100", "a100"):
        with_rows, without = estimate(vit_profile, sched, hw), estimate(lean, sched, hw)
        assert with_rows.latency_s["total"] == pytest.approx(without.latency_s["total"], rel=1e-12)
        assert with_rows.energy_j["total"] == pytest.approx(without.energy_j["total"], rel=1e-12)
        assert with_rows.latency_s["total"] > 0
    # ... and as GEMMs where no op list prices them: an accelerator, or a GPU given no op list
    assert estimate(vit_profile, sched, "bitfusion").latency_s["total"] > estimate(lean, sched, "bitfusion").latency_s[
        "total"]
    bare, bare_lean = copy.copy(vit_profile), copy.copy(lean)
    bare.ops = bare_lean.ops = None
    assert estimate(bare, sched, "h100").latency_s["total"] > estimate(bare_lean, sched, "h100").latency_s["total"]


def test_executed_equals_estimated_with_attention(vit_profile):
    """The training loop's trace (the counter's step) and the planner (the profile) count the same attention."""
    model = _tiny_timm_vit().train()
    x = torch.randn(4, 3, 32, 32)
    with MacCounter(model) as counter:
        out = model(x)
        F.cross_entropy(out, torch.randint(10, (4,))).backward()
        executed = step_cost(counter.step_arrays(), 5, 8, batch=1)
    assert executed == step_cost(vit_profile.arrays(), 5, 8, batch=4)
    assert math.isclose(executed["bitops"]["fwd"], estimate(vit_profile, {"batch_size": [4], "bits": [5],
                                                                          "grad_bits": [8]}).bitops["fwd"])
    assert np.any(counter.step_arrays().sdpa)
