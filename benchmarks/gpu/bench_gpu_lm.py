"""The GPU time model on language models: cptsim's transformer-lm and lstm-lm against published training throughput.

    python benchmarks/gpu/bench_gpu_lm.py            # model vs published tokens/s, per row, with the source
    python benchmarks/gpu/bench_gpu_lm.py --json
    python benchmarks/gpu/bench_gpu_lm.py --reprofile   # profile the stand-in models afresh (minutes on a CPU)

Nobody publishes the training throughput of cptsim's own LMs, so each published network gets the closest cptsim
model (a "stand-in"), priced by the shipped GPU profiles exactly as ``cptsim cost`` prices it (one training step,
q = g = the step's width: 16 for AMP, 32 for FP32/TF32), at the published run's tokens per step. What differs is
said per stand-in (``STANDINS[...].differs``); both stand-ins do within 5% of the published network's MACs per
token. The profiles (one training step counted on the CPU) are cached in benchmarks/data/lm-profiles.json.gz.

Published rows (single GPU, tokens per second):

* Transformer-XL base on WikiText-103 (16 layers, d_model 512, 8 heads, d_inner 2048, 192 target + 192 memory
  tokens, adaptive softmax): NVIDIA DeepLearningExamples PyTorch/LanguageModeling/Transformer-XL README,
  "Training performance results", 1 GPU rows (pytorch-20.06 NGC; A100 40GB and V100 16GB); and Lambda's
  deeplearning-benchmark (DeepLearningExamples' code in pytorch:22.09), 'transformerxlbase' column.
* GNMT v2 (LSTM encoder-decoder, 4 + 4 layers of 1024, WMT16 en-de, 32k BPE vocabulary): Lambda's
  deeplearning-benchmark 'gnmt' column (DeepLearningExamples PyTorch/Translation/GNMT, pytorch:22.09).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CACHE = HERE.parent / "data" / "lm-profiles.json.gz"

SOURCES = {
    "nvidia-txl": "NVIDIA DeepLearningExamples, PyTorch/LanguageModeling/Transformer-XL/README.md, 'Training "
                  "performance results', base model, 1 GPU (pytorch-20.06-py3 NGC; DGX A100 40GB: TF32 and mixed "
                  "precision, batch 32; DGX-1 V100 16GB: FP32 and mixed precision, batch 16 and 32); tokens/s = "
                  "target tokens (batch x 192) per second",
    "lambda": "Lambda deeplearning-benchmark (github.com/lambdal/deeplearning-benchmark), pytorch/pytorch-train-"
              "throughput-{fp16,fp32}.csv (columns 'transformerxlbase', 'gnmt'), 1 GPU; DeepLearningExamples' code "
              "in the pytorch:22.09 NGC container; batch from pytorch-train-bs-{fp16,fp32}.csv and scripts/config_v1/"
              "config_pytorch_{24GB,16GB,80GB}.sh (H100 SXM5: the 80GB template's batch)",
}


@dataclass(frozen=True)
class Standin:
    model: str            # the cptsim model
    seq: int              # its sequence length T
    vocab: int
    optimizer: str
    seqs_per_published_seq: float  # cptsim sequences per published batch element (equal tokens per step)
    published_tokens_per_seq: int  # tokens the published throughput counts per batch element
    differs: str


STANDINS = {
    "txl-base": Standin(
        "transformer-lm:layers=16,width=512,heads=8,context=384,dropout=0.1", 384, 20000, "adam", 0.5, 192,
        "Transformer-XL base attends each of its 192 target tokens to 384 keys (192 cached from the previous "
        "segment); the stand-in is a GPT of the same depth and widths over 384 tokens, every one a target, so a "
        "published batch of B segments is B/2 stand-in sequences and both do 384 keys per query. It leaves out "
        "XL's relative-position score term (a second q-sized matmul, ~6% of the MACs), the K/V projections of the "
        "cached tokens (forward only, ~3%) and the adaptive softmax's tail clusters (the head cluster, 20000 "
        "entries, is the stand-in's vocabulary; the tails, for the ~10% of rarer tokens, add up to ~5%); it has "
        "pre-LN blocks and learned positions; Adam (XL base trains with LAMB: the same traffic per parameter)"),
    "gnmt": Standin(
        "lstm-lm:layers=4,hidden=1024,dropout=0.2", 28, 32320, "adam", 2.0, 56,
        "GNMT v2 is an encoder-decoder (4 encoder LSTM layers of 1024, the first bidirectional; 4 decoder layers "
        "fed the attention context; a 32k classifier on target tokens) with Bahdanau attention; the stand-in is "
        "an LSTM LM of 4 layers of 1024 and a 32320-word decoder on every token: 66.7 M MACs per token against "
        "GNMT's 63.5 M per (source or target) token, by the layer sizes. Published tokens/s count source and "
        "target tokens (DeepLearningExamples' GNMT logs both); one sentence pair = two stand-in sequences of 28 "
        "tokens (an assumed mean BPE sentence length; GNMT trains on pairs of up to 50). The largest difference "
        "is the implementation: GNMT runs cuDNN's fused LSTM, cptsim's lstm-lm steps through time with one GEMM "
        "and a few element-wise kernels per step and layer, which is what the model prices"),
}


@dataclass(frozen=True)
class Row:
    standin: str
    gpu: str
    source: str
    precision: str        # AMP, TF32, FP32
    batch: int            # published batch (segments or sentence pairs) per GPU
    tok_s: float
    tf32_matmul: bool = False   # FP32 matmuls ran on TF32 (NGC 20.06 on an A100: TF32 on by default)
    bandwidth_gb_s: float | None = None  # a variant of the profile's memory (A100 40GB: 1555 GB/s)
    note: str = ""

    @property
    def bits(self) -> int:
        return 16 if self.precision == "AMP" else 32


ROWS = (
    Row("txl-base", "a100", "nvidia-txl", "TF32", 32, 41527.0, tf32_matmul=True, bandwidth_gb_s=1555,
        note="A100 40GB (DGX A100)"),
    Row("txl-base", "a100", "nvidia-txl", "AMP", 32, 59961.0, bandwidth_gb_s=1555, note="A100 40GB (DGX A100)"),
    Row("txl-base", "v100", "nvidia-txl", "FP32", 16, 13981.0, note="V100 16GB (DGX-1)"),
    Row("txl-base", "v100", "nvidia-txl", "AMP", 16, 26639.0, note="V100 16GB (DGX-1)"),
    Row("txl-base", "v100", "nvidia-txl", "AMP", 32, 36692.0, note="V100 16GB (DGX-1)"),
    Row("txl-base", "rtx3090", "lambda", "AMP", 24, 22863.0),
    Row("txl-base", "rtx3090", "lambda", "FP32", 14, 12101.0),
    Row("txl-base", "rtx4090", "lambda", "AMP", 24, 40427.0),
    Row("txl-base", "rtx4090", "lambda", "FP32", 14, 22750.0),
    Row("txl-base", "a100", "lambda", "AMP", 104, 43078.0, note="A100 80GB SXM4"),
    Row("txl-base", "a100", "lambda", "FP32", 52, 30462.0, note="A100 80GB SXM4"),
    Row("txl-base", "v100", "lambda", "AMP", 12, 18493.0, note="LambdaCloud V100 16GB"),
    Row("txl-base", "v100", "lambda", "FP32", 8, 6920.0, note="LambdaCloud V100 16GB"),
    Row("txl-base", "h100", "lambda", "AMP", 104, 62259.0, note="H100 80GB SXM5"),
    Row("txl-base", "h100", "lambda", "FP32", 52, 45697.0, note="H100 80GB SXM5"),
    Row("gnmt", "rtx3090", "lambda", "AMP", 464, 86080.0),
    Row("gnmt", "rtx3090", "lambda", "FP32", 288, 44869.0),
    Row("gnmt", "rtx4090", "lambda", "AMP", 464, 159511.0),
    Row("gnmt", "rtx4090", "lambda", "FP32", 288, 84598.0),
    Row("gnmt", "a100", "lambda", "AMP", 1520, 243500.0, note="A100 80GB SXM4"),
    Row("gnmt", "a100", "lambda", "FP32", 1024, 129911.0, note="A100 80GB SXM4"),
    Row("gnmt", "v100", "lambda", "AMP", 256, 79111.0, note="LambdaCloud V100 16GB"),
    Row("gnmt", "v100", "lambda", "FP32", 128, 24109.0, note="LambdaCloud V100 16GB"),
    Row("gnmt", "h100", "lambda", "AMP", 1520, 467071.0, note="H100 80GB SXM5"),
    Row("gnmt", "h100", "lambda", "FP32", 1024, 220229.0, note="H100 80GB SXM5"),
)


def _key(s: Standin) -> str:
    return f"{s.model}|T={s.seq}|V={s.vocab}|{s.optimizer}"


def profiles(reprofile: bool = False) -> dict:
    """{standin name: LayerProfile}, from the cache or counted afresh (and cached)."""
    from cptsim.measure.profiler import LayerProfile, profile_named_model

    cache = {}
    if CACHE.is_file() and not reprofile:
        cache = json.loads(gzip.decompress(CACHE.read_bytes()))
    out, changed = {}, False
    for name, s in STANDINS.items():
        if _key(s) not in cache:
            print(f"profiling {s.model} (T={s.seq}, vocab {s.vocab}) ...", file=sys.stderr)
            cache[_key(s)] = profile_named_model(s.model, (s.seq,), s.vocab, optimizer=s.optimizer).to_json()
            changed = True
        out[name] = LayerProfile.from_json(cache[_key(s)])
    if changed:
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        keep = {_key(s): cache[_key(s)] for s in STANDINS.values()}
        CACHE.write_bytes(gzip.compress(json.dumps(keep, sort_keys=True).encode(), mtime=0))
    return out


def hardware(row: Row):
    from cptsim.cost.hardware import load_profile

    hw = load_profile(row.gpu)
    if row.bandwidth_gb_s is not None:
        hw = dataclasses.replace(hw, params={**hw.params, "bandwidth_gb_s": row.bandwidth_gb_s})
    if row.tf32_matmul:
        hw = hw.allow_tf32_matmul()
    return hw


def predicted_tok_s(prof, row: Row) -> float:
    """Tokens per second the cost model gives for one training step at the published run's tokens per step."""
    from cptsim.calibration import gpu_fit as F

    s = STANDINS[row.standin]
    seqs = row.batch * s.seqs_per_published_seq
    assert float(seqs).is_integer(), (row, seqs)
    per_s = F.predicted_img_s(hardware(row), prof, F.Row(s.model, row.standin, int(seqs), 1.0, False), bits=row.bits)
    return per_s * s.seq


def table(profs=None) -> list[dict]:
    profs = profiles() if profs is None else profs
    out = []
    for r in ROWS:
        p = predicted_tok_s(profs[r.standin], r)
        out.append({"network": r.standin, "standin": STANDINS[r.standin].model, "gpu": r.gpu, "source": r.source,
                    "precision": r.precision, "batch": r.batch, "published_tok_s": r.tok_s, "modelled_tok_s": p,
                    "error": p / r.tok_s - 1.0, "note": r.note})
    return out


def summary(rows: list[dict]) -> dict:
    out = {}
    for net in STANDINS:
        e = np.abs([r["error"] for r in rows if r["network"] == net])
        signed = [r["error"] for r in rows if r["network"] == net]
        out[net] = {"n": int(e.size), "median_abs_error": float(np.median(e)), "worst_abs_error": float(e.max()),
                    "median_error": float(np.median(signed))}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--reprofile", action="store_true", help="count the stand-ins' training steps afresh")
    args = ap.parse_args(argv)
    profs = profiles(args.reprofile)
    rows = table(profs)
    s = summary(rows)
    if args.json:
        print(json.dumps({"sources": SOURCES, "standins": {k: dataclasses.asdict(v) for k, v in STANDINS.items()},
                          "rows": rows, "summary": s}, indent=1))
        return 0
    print("Language models on GPUs: published training throughput vs the cost model (tokens/s, one GPU)")
    for net, st in STANDINS.items():
        macs = profs[net].totals()["fwd"] / st.seq
        print(f"\n{net}: cptsim stand-in {st.model}, T = {st.seq}, vocabulary {st.vocab}, {st.optimizer} "
              f"({macs / 1e6:.1f} M forward MACs per token; op mix {', '.join(profs[net].op_mix())})")
        print(f"  what differs: {st.differs}")
        print(f"  {'gpu':8} {'source':10} {'prec':4} {'batch':>5} {'published':>10} {'modelled':>10} {'error':>7}  note")
        for r in rows:
            if r["network"] == net:
                print(f"  {r['gpu']:8} {r['source']:10} {r['precision']:4} {r['batch']:>5} "
                      f"{r['published_tok_s']:>10.0f} {r['modelled_tok_s']:>10.0f} {100 * r['error']:>+6.1f}%  "
                      f"{r['note']}")
        v = s[net]
        print(f"  n={v['n']}: median |error| {100 * v['median_abs_error']:.1f}%, worst {100 * v['worst_abs_error']:.1f}%,"
              f" median signed {100 * v['median_error']:+.1f}%")
    print("\nsources:")
    for k, v in SOURCES.items():
        print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
