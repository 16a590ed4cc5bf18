"""Language models in the model registry: ``lstm-lm`` and ``transformer-lm``.

Both take token ids (B, T) and return logits laid out (B, V, T) - the class dimension second, as
``F.cross_entropy`` wants it for a sequence - so the training loop's ``cross_entropy(model(x), y)`` and
``argmax(1) == y`` work for them unchanged (the loss summed over the T·B tokens and divided by the batch B is
Zaremba et al.'s per-sequence loss). The registry's ``num_classes`` is the vocabulary size and ``input_shape`` is
``(T,)``, the sequence length (BPTT) of the text dataset. The output projection (``decoder`` / ``head``) is
quantized like every other layer by default (``LM_FP_LAYERS``, empty): the published LM savings count it quantized
(the cost of CPT 5-8/8 vs static 8 on PTB is 23.2% with it, 1.4% without), the successor suite's PTB code quantizes
its decoder, and on the embedded corpus quantizing it cost no perplexity (README, "Language models: the head");
``--fp-layers decoder`` (or ``head``) keeps it FP32. The embedding lookup is not a GEMM (0 MACs).

Options go after the name: ``lstm-lm:layers=2,hidden=650,dropout=0.5`` and
``transformer-lm:layers=2,width=128,heads=4,context=256,dropout=0.1``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from cptsim.errors import InputError
from cptsim.numerics.lm_layers import LSTMLayer, TransformerBlock
from .registry import FP_LAYERS_ATTR, _Entry, register_model, register_resolver

__all__ = ["LSTMLM", "TransformerLM", "LM_FAMILIES", "is_language_model"]


def _tokens(vocab: int, batch: int, shape, device) -> torch.Tensor:
    T = int(tuple(shape)[0]) if not isinstance(shape, int) else int(shape)
    return torch.randint(vocab, (batch, T), device=device)


class LSTMLM(nn.Module):
    """Zaremba et al. (2014): embedding -> dropout -> LSTM layers (dropout between) -> dropout -> decoder.

    "Medium" by default: 2 layers of 650, embedding 650, dropout 0.5, untied, weights uniform in [-0.05, 0.05].
    In training (grad on) the hidden state carries across calls, detached: the training data come as
    contiguous streams, row r of step i+1 continuing row r of step i (cptsim.data.text). It lives in the
    ``carry`` buffer, so a checkpoint holds it and a resumed run continues with exactly that state; the loop calls
    ``reset_state`` at the start of every epoch. Evaluation carries its own state (``forward_state``).
    """

    def __init__(self, vocab: int, hidden: int = 650, layers: int = 2, dropout: float = 0.5, init: float = 0.05):
        super().__init__()
        self.vocab = vocab
        self.embedding = nn.Embedding(vocab, hidden)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(LSTMLayer(hidden, hidden) for _ in range(layers))
        self.decoder = nn.Linear(hidden, vocab)
        for p in self.parameters():
            nn.init.uniform_(p, -init, init)
        self.register_buffer("carry", torch.zeros(0))
        self._register_load_state_dict_pre_hook(self._fit_carry)

    def example_input(self, batch: int, shape, device) -> torch.Tensor:
        return _tokens(self.vocab, batch, shape, device)

    def _fit_carry(self, state_dict, prefix, *args) -> None:
        saved = state_dict.get(prefix + "carry")
        if saved is not None:
            self.carry = torch.empty_like(saved, device=self.carry.device)  # its size is the batch's
        check_vocab(self, state_dict, prefix + "decoder.weight")

    def reset_state(self) -> None:
        self.carry = self.carry.new_zeros(0)

    def forward_state(self, x: torch.Tensor, state=None):
        """(logits (B, V, T), new state) from ids (B, T) and a state (list of (h, c) per layer, or None: zeros)."""
        e = self.drop(self.embedding(x.t()))  # time-major (T, B, E)
        new = []
        for i, layer in enumerate(self.layers):
            e, hc = layer(e, None if state is None else state[i])
            e = self.drop(e)
            new.append(hc)
        return self.decoder(e).permute(1, 2, 0), new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        carry = self.training and torch.is_grad_enabled()
        state = None
        B = x.shape[0]
        if carry and self.carry.dim() == 4 and self.carry.shape[2] >= B:
            state = [(self.carry[i, 0, :B], self.carry[i, 1, :B]) for i in range(len(self.layers))]
        logits, new = self.forward_state(x, state)
        if carry:
            self.carry = torch.stack([torch.stack(hc) for hc in new]).detach()
        return logits


class TransformerLM(nn.Module):
    """A small GPT: token + learned position embeddings, pre-LN blocks, final LayerNorm, untied FP32 ``head``."""

    def __init__(self, vocab: int, context: int, layers: int = 2, width: int = 128, heads: int = 4,
                 dropout: float = 0.1):
        super().__init__()
        self.vocab, self.context = vocab, context
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(TransformerBlock(width, heads, context, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        self._register_load_state_dict_pre_hook(
            lambda sd, prefix, *a: check_vocab(self, sd, prefix + "head.weight"))

    def example_input(self, batch: int, shape, device) -> torch.Tensor:
        return _tokens(self.vocab, batch, shape, device)

    def forward_state(self, x: torch.Tensor, state=None):
        return self.forward(x), None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        if T > self.context:
            raise InputError(f"transformer-lm: sequence length {T} exceeds its context {self.context}")
        h = self.drop(self.tok(x) + self.pos(torch.arange(T, device=x.device)))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h)).transpose(1, 2)


def check_vocab(model: nn.Module, state_dict: dict, key: str) -> None:
    """A checkpoint for another vocabulary cannot continue on this data: say so (exit 2), not a size mismatch."""
    w = state_dict.get(key)
    if w is not None and w.shape[0] != model.vocab:
        raise InputError(f"the checkpoint's vocabulary has {w.shape[0]} entries but the data now gives "
                         f"{model.vocab}: the text files changed since the run started")


def is_language_model(model: nn.Module) -> bool:
    return isinstance(model, (LSTMLM, TransformerLM))


# ---------------------------------------------------------------------------------------------- registry entries

_LSTM_OPTS = {"layers": int, "hidden": int, "dropout": float}
_GPT_OPTS = {"layers": int, "width": int, "heads": int, "context": int, "dropout": float}


# The language models' full-precision layers by default: none, the output head quantized too (module docstring).
LM_FP_LAYERS: tuple[str, ...] = ()


def _parse_opts(name: str, text: str, allowed: dict) -> dict:
    out = {}
    for part in filter(None, text.split(",")):
        key, eq, val = part.partition("=")
        key = key.strip()
        if not eq or key not in allowed:
            raise InputError(f"model {name!r}: unknown option {part!r}; options: "
                             f"{', '.join(k + '=' for k in allowed)}")
        try:
            v = allowed[key](val)
        except ValueError:
            raise InputError(f"model {name!r}: {key} must be a {allowed[key].__name__}, got {val!r}") from None
        if (key == "dropout" and not 0 <= v < 1) or (key != "dropout" and v < 1):
            raise InputError(f"model {name!r}: {key}={val} is out of range")
        out[key] = v
    return out


def _text_shape(name: str, num_classes: int, input_shape) -> int:
    if input_shape is None or len(tuple(input_shape)) != 1:
        raise InputError(f"{name} is a language model: it needs a text dataset (ptb, wikitext-2, wikitext-103, "
                         f"pydoc-chars), not one of input shape {tuple(input_shape) if input_shape else None}")
    return int(tuple(input_shape)[0])


def _lstm_entry(key: str, opts: str) -> _Entry:
    o = _parse_opts(key, opts, _LSTM_OPTS)

    def build(num_classes: int, in_channels: int, input_shape=None) -> nn.Module:
        _text_shape(key, num_classes, input_shape)
        model = LSTMLM(num_classes, **o)
        setattr(model, FP_LAYERS_ATTR, list(LM_FP_LAYERS))
        model.cptsim_grad_clip = 5.0  # Zaremba et al.'s max gradient norm; the training loop applies it
        return model

    h, n, p = o.get("hidden", 650), o.get("layers", 2), o.get("dropout", 0.5)
    return _Entry(key, build, family="lstm-lm", input="text",
                  description=f"LSTM language model (Zaremba et al. 2014 'medium' by default): {n} x {h} units, "
                              f"embedding {h}, dropout {p}, untied; options layers=,hidden=,dropout=")


def _gpt_entry(key: str, opts: str) -> _Entry:
    o = _parse_opts(key, opts, _GPT_OPTS)
    width, heads = o.get("width", 128), o.get("heads", 4)
    if width % heads:
        raise InputError(f"model {key!r}: width {width} is not a multiple of heads {heads}")

    def build(num_classes: int, in_channels: int, input_shape=None) -> nn.Module:
        T = _text_shape(key, num_classes, input_shape)
        context = o.get("context", T)
        if context < T:
            raise InputError(f"model {key!r}: context {context} is shorter than the dataset's sequence length {T}")
        model = TransformerLM(num_classes, context, layers=o.get("layers", 2), width=width, heads=heads,
                              dropout=o.get("dropout", 0.1))
        setattr(model, FP_LAYERS_ATTR, list(LM_FP_LAYERS))
        model.cptsim_grad_clip = 1.0  # GPT practice
        return model

    return _Entry(key, build, family="transformer-lm", input="text",
                  description=f"GPT-style decoder: {o.get('layers', 2)} pre-LN blocks, width {width}, {heads} heads, "
                              "context = the dataset's sequence length; options layers=,width=,heads=,context=,dropout=")


# name -> entry maker(full key, option text); cptsim.models resolves "name" and "name:options" through it
LM_FAMILIES = {"lstm-lm": _lstm_entry, "transformer-lm": _gpt_entry}


def _register() -> None:
    """Each language model under its name, and its "name:options" form through a resolver."""
    for name, make in LM_FAMILIES.items():
        entry = make(name, "")
        register_model(name, family=entry.family, input=entry.input, description=entry.description)(entry.builder)
        register_resolver(lambda raw, make=make: make(raw.lower(), raw.lower().partition(":")[2]), prefix=name)


_register()
