"""numerics/: how a number is quantized, and the layers that do it (the first stage of the data flow).

- ``quant``: the quantizer primitives (min/max ranges, round to nearest, stochastic rounding) as plain functions;
- ``ckernels`` (+ ``_qkernels.c``): the CPU kernels behind them, compiled on first use;
- ``layers``: quantized Conv2d / Linear, ``PrecisionState``, ``quantize_model`` and the full-precision-layer
  convention (``declared_fp_layers``);
- ``lm_layers``: the quantized LSTM and attention (matmul) layers of the language models;
- ``graph_layers``: the message-passing aggregation of graph models at the shared precision (``quant_agg``);
- ``formats``: the number-format registry (int, FP8/FP6/FP4, MX, NVFP4, bf16/fp16) with exact quantize functions,
  and what the layers call at a float format's width (``QuantFormatSTE``, ``quantize_error``);
- ``families``: a format family (``--number-format int|fp|mx|nvfp``) maps the schedule's widths to formats; the
  layers run them when ``quantize_model(model, number_format=...)`` put the map on the PrecisionState.

Exact low-precision GEMMs land here next.
May import: ``cptsim.errors``, ``cptsim.fileio``. Nothing else of cptsim: models, measurement and cost build on this.
"""
