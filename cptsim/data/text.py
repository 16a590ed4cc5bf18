"""Text datasets for language models, in cptsim.data's registry. Nothing is downloaded.

* ``ptb``: ``--data-dir`` holding the Mikolov files ``ptb.train.txt``, ``ptb.valid.txt``, ``ptb.test.txt``
  (one sentence per line, ``<unk>`` already in, 10k words); word level, ``<eos>`` added per line.
* ``wikitext-2``, ``wikitext-103``: ``--data-dir`` holding ``wiki.train.tokens``, ``wiki.valid.tokens``,
  ``wiki.test.tokens``; word level, ``<eos>`` per line (as PyTorch's word_language_model example reads them).
* ``pydoc-chars``: the embedded default - the English documentation text CPython ships in ``pydoc_data.topics``
  (~465k characters; on every machine with Python), character level, split 90/5/5 in order.

The vocabulary is the training split's words in order of first appearance (plus ``<unk>`` if the training split
lacks it); a valid/test word outside it reads as ``<unk>``. A sample is one sequence of T tokens (``input_shape``
is ``(T,)``: 35 for word level, Zaremba's BPTT; 64 for characters) and its target is the same shifted by one.

Batching is the standard contiguous-stream BPTT layout: the N = (tokens - 1) // T sequences of the training
split are cut into B rows of consecutive sequences, and step i takes sequence i of every row, so row r of step
i + 1 continues row r of step i and an LSTM's hidden state carries over (``TextStream.stream_order``). The rows
are near-equal (the first ones one sequence longer), so every step but the last has B samples and an epoch is
ceil(N / B) steps, exactly as for image data. With several processes each rank keeps its own rows of the streams
(and their carried state) every step, the short last step included (``TextStream.rank_share``).

``dataset_info`` reads the files when ``--data-dir`` holds them (vocabulary size and size), and otherwise gives
the published figures, so profile/cost/plan work without the files.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import Dataset

from cptsim.errors import InputError

from .registry import DataInfo, nominal_info, register_dataset

__all__ = ["TextStream", "TEXT_DATASETS", "text_info", "evaluate_lm", "lm_metrics", "pack_window_losses",
           "unpack_window_losses", "EOS", "UNK"]

EOS, UNK = "<eos>", "<unk>"
WORD_BPTT, CHAR_BPTT = 35, 64
EMBEDDED = "pydoc-chars"

# name -> (file names per split, nominal DataInfo: vocabulary, train sequences, test sequences)
_FILES = {
    "ptb": ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"),
    "wikitext-2": ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens"),
    "wikitext-103": ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens"),
}
# Tokens (with <eos>) per split and vocabulary, as the standard readers count them (Mikolov's PTB; Merity et
# al. 2016 for WikiText, counted the word_language_model way: every line, blank ones too, ends in <eos>).
_NOMINAL = {
    "ptb": (10000, 929589, 82430),
    "wikitext-2": (33278, 2088628, 245569),
    "wikitext-103": (267735, 103227021, 245569),
}


class TextStream(Dataset):
    """One split as a token stream, read as N = (len - 1) // T sequences of T tokens (x) and their next tokens (y).

    ``char_level`` says what a token is (bits per character is reported then). ``vocab`` is shared by the splits.
    """

    is_text = True

    def __init__(self, ids: torch.Tensor, seq_len: int, vocab: list[str], char_level: bool, name: str):
        self.ids, self.seq_len, self.vocab, self.char_level, self.name = ids, seq_len, vocab, char_level, name
        self.n = (len(ids) - 1) // seq_len
        self.valid: "TextStream | None" = None  # the training split carries its validation split

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int):
        s = int(k) * self.seq_len
        return self.ids[s:s + self.seq_len], self.ids[s + 1:s + self.seq_len + 1]

    def stream_order(self, rows: int) -> torch.Tensor:
        """Sample indices so that order[i*rows + r] is row r's sequence at step i (rows of consecutive sequences).

        Row lengths: S = ceil(N / rows) for the first N - (S-1)*rows rows, S - 1 for the rest; so step i < S-1 is
        a full batch and the last step has the first rows only, as a plain slice of the order expects."""
        n, S = self.n, math.ceil(self.n / rows)
        full = n - (S - 1) * rows  # rows of length S
        starts = [r * S - max(0, r - full) for r in range(rows)]
        order = [starts[r] + i for i in range(S) for r in range(rows) if i < S - 1 or r < full]
        return torch.tensor(order, dtype=torch.long)

    @staticmethod
    def rank_share(step: torch.Tensor, rank: int, world: int, rows: int) -> torch.Tensor:
        """This rank's part of one step of ``stream_order(rows)`` with ``world`` processes: the same rows every step.

        Rank k owns rows ``tensor_split(arange(rows), world)[k]`` of the streams for the whole epoch, and carries
        their hidden state. At a full step that is the plain contiguous split of the batch; the epoch's last step
        holds only its first n < rows rows, and a plain split of those n would hand rank k rows whose state
        another rank carries (rank 1 of 2 with rows=64 and n=40: rows 20-39, with the state of rows 32-51). Here
        rank k gets the rows it owns below n: a prefix of its own rows, whose state is the first rows of the state
        it carries (the rows the LSTM keeps when a batch shrinks: cptsim.models.text), maybe none."""
        own = torch.tensor_split(torch.arange(rows), world)[rank]
        return step[own[own < len(step)]]


# ---------------------------------------------------------------------------------------------- reading


def _read_words(path: Path, name: str) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{name}: {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise InputError(f"{name}: cannot read {path}: {e.strerror or e}") from None
    words = []
    for line in text.splitlines():
        words += line.split()
        words.append(EOS)
    if not text.strip():
        raise InputError(f"{name}: {path} is empty")
    return words


_CACHE: dict = {}


def _corpus(name: str, root: Path | None):
    """(train, valid, test) id tensors and the vocabulary, read once per (dataset, folder, file times)."""
    if name == EMBEDDED:
        key = (name,)
    else:
        files = [root / f for f in _FILES[name]]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise InputError(f"{name}: {root} lacks {', '.join(missing)} (expected {', '.join(_FILES[name])})")
        key = (name, str(root.resolve()), tuple(os.stat(f).st_mtime_ns for f in files))
    if key in _CACHE:
        return _CACHE[key]
    if name == EMBEDDED:
        from pydoc_data.topics import topics

        text = "\n\n".join(topics[k].strip() for k in sorted(topics))
        vocab = sorted(set(text))
        index = {ch: i for i, ch in enumerate(vocab)}
        ids = torch.tensor([index[ch] for ch in text], dtype=torch.long)
        a, b = int(len(ids) * 0.90), int(len(ids) * 0.95)
        splits = (ids[:a], ids[a:b], ids[b:])
    else:
        words = [_read_words(f, name) for f in files]
        vocab, index = [], {}
        for w in words[0]:
            if w not in index:
                index[w] = len(vocab)
                vocab.append(w)
        if UNK not in index:
            index[UNK] = len(vocab)
            vocab.append(UNK)
        unk = index[UNK]
        splits = tuple(torch.tensor([index.get(w, unk) for w in ws], dtype=torch.long) for ws in words)
    _CACHE.clear()  # one corpus at a time: WikiText-103 is large
    _CACHE[key] = (splits, vocab)
    return _CACHE[key]


def text_info(name: str, data_dir) -> DataInfo:
    """DataInfo from the files (vocabulary size, sequences per split) when they are there, else the nominal one."""
    info = nominal_info(name)
    if name != EMBEDDED:
        if data_dir is None or str(data_dir) == "" or not Path(data_dir).expanduser().is_dir():
            return info
        root = Path(data_dir).expanduser()
        if not all((root / f).is_file() for f in _FILES[name]):
            return info
    (train, _, test), vocab = _corpus(name, None if name == EMBEDDED else Path(data_dir).expanduser())
    T = info.input_shape[0]
    return replace(info, num_classes=len(vocab), train_size=(len(train) - 1) // T, test_size=(len(test) - 1) // T)


def _loader(name: str):
    def load(root, augment):
        (train, valid, test), vocab = _corpus(name, root)
        T = nominal_info(name).input_shape[0]
        char = name == EMBEDDED
        streams = [TextStream(ids, T, vocab, char, name) for ids in (train, valid, test)]
        for split, s in zip(("train", "valid", "test"), streams):
            if len(s) < 1:
                raise InputError(f"{name}: the {split} split has {len(s.ids)} tokens, fewer than one sequence of "
                                 f"{T + 1}")
        streams[0].valid = streams[1]
        return streams[0], streams[2]

    return load


def _size(name: str):
    def size(root: Path) -> int | None:
        try:
            return text_info(name, root).train_size if all((root / f).is_file() for f in _FILES[name]) else None
        except InputError:
            return None

    return size


TEXT_DATASETS = (EMBEDDED, "ptb", "wikitext-2", "wikitext-103")


def _register() -> None:
    T = WORD_BPTT
    for name, (vocab, train_tokens, test_tokens) in _NOMINAL.items():
        info = DataInfo(name, (T,), vocab, (train_tokens - 1) // T, (test_tokens - 1) // T)
        needs = f"a folder holding {', '.join(_FILES[name])}"
        register_dataset(info, _loader(name), needs_dir=needs, size=_size(name),
                         info_from_files=lambda data_dir, name=name: text_info(name, data_dir))
    # The embedded corpus's figures are computed (cheaply: ~0.1 s) the first time they are asked for.
    register_dataset(DataInfo(EMBEDDED, (CHAR_BPTT,), 0, None, None), _loader(EMBEDDED),
                     info_from_files=lambda data_dir: text_info(EMBEDDED, data_dir))


_register()


# ---------------------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate_lm(model, stream: TextStream, device: str, rows: int = 10,
                windows: list | None = None) -> tuple[float, float]:
    """(mean NLL per token in nats, next-token accuracy) over a split, read as ``rows`` contiguous streams with the
    state carried from one sequence to the next (the way the model was trained to be used).

    ``windows``: a list that receives one float64 tensor, each sequence's (BPTT window's) mean NLL per token, in
    the order of the text (sequence k of the split at k). Their mean is the split's loss; the planner's pilot
    takes its standard error from them (``cptsim.planner.pilot.window_se``: batch means over the windows)."""
    import torch.nn.functional as F

    order = stream.stream_order(min(rows, len(stream)))
    state, loss_sum, correct, n = None, 0.0, 0, 0
    per_window = torch.zeros(len(stream), dtype=torch.float64) if windows is not None else None
    for i in range(0, len(order), rows):
        idx = order[i:i + rows]
        x = torch.stack([stream[k][0] for k in idx.tolist()]).to(device)
        y = torch.stack([stream[k][1] for k in idx.tolist()]).to(device)
        if state is not None and state[0][0].shape[0] != x.shape[0]:
            state = [(h[:x.shape[0]], c[:x.shape[0]]) for h, c in state]
        logits, state = model.forward_state(x, state)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        if per_window is not None:
            per_window[idx] = F.cross_entropy(logits, y, reduction="none").double().mean(1).cpu()
        correct += (logits.argmax(1) == y).sum().item()
        n += y.numel()
    if windows is not None:
        windows.append(per_window)
    return loss_sum / n, correct / n


def pack_window_losses(windows) -> str:
    """Per-window mean losses (tensors or arrays, concatenated) as base64 of little-endian float32: what
    metrics.jsonl records as ``val_window_loss`` (about 5.3 characters a window: 363 for pydoc-chars' validation
    split, 2107 for PTB's)."""
    import base64

    import numpy as np

    parts = [np.asarray(w.cpu() if hasattr(w, "cpu") else w, dtype="<f4").ravel() for w in windows]
    return base64.b64encode(np.concatenate(parts).tobytes() if parts else b"").decode("ascii")


def unpack_window_losses(text: str):
    """The per-window losses ``pack_window_losses`` packed (a float64 numpy array)."""
    import base64

    import numpy as np

    return np.frombuffer(base64.b64decode(text), dtype="<f4").astype(np.float64)


def lm_metrics(rec: dict, seq_len: int, char_level: bool) -> dict:
    """Turn a metrics record of a language model into per-token figures: the loop sums the loss and the correct
    count per sequence (train_loss / train_acc), evaluation already gives them per token; add perplexity, and bits
    per character for character-level data."""
    rec["train_loss"] = rec["train_loss"] / seq_len
    rec["train_acc"] = rec["train_acc"] / seq_len
    for split in ("train", "val", "test"):
        loss = rec.get(f"{split}_loss")
        if isinstance(loss, (int, float)):
            rec[f"{split}_ppl"] = math.exp(min(loss, 700.0))
            if char_level:
                rec[f"{split}_bpc"] = loss / math.log(2)
    rec["tokens"] = "characters" if char_level else "words"
    return rec
