"""numerics/: how a number is quantized, and the layers that do it (the first stage of the data flow).

- ``quant``: the quantizer primitives (min/max ranges, round to nearest, stochastic rounding) as plain functions;
- ``ckernels`` (+ ``_qkernels.c``): the CPU kernels behind them, compiled on first use;
- ``layers``: quantized Conv2d / Linear, ``PrecisionState``, ``quantize_model`` and the full-precision-layer
  convention (``declared_fp_layers``);
- ``lm_layers``: the quantized LSTM and attention (matmul) layers of the language models.

Number formats (FP8, MX, NVFP4) and exact low-precision GEMMs land here next.
May import: ``cptsim.errors``, ``cptsim.fileio``. Nothing else of cptsim: models, measurement and cost build on this.
"""
