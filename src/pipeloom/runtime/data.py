"""Training data for ``pipeloom run --data FILE``: a flat file of token ids (no torch).

The format nanoGPT's ``prepare.py`` scripts write: the token ids of a corpus back to back as
unsigned integers (``uint16`` for vocabularies up to 65536, else ``uint32``), native byte order,
no header. :class:`TokenFile` maps it (``numpy.memmap``, nothing read up front) and samples
``(inputs, targets)`` rows of ``seq`` tokens at seeded random offsets; targets are the inputs
shifted by one token.
"""
from __future__ import annotations

import os

import numpy as np

DTYPES = ("uint16", "uint32")


class TokenFile:
    """A token file; :meth:`check` refuses, in one line, one that cannot feed a model."""

    def __init__(self, path: str, dtype: str = "uint16") -> None:
        if dtype not in DTYPES:
            raise ValueError(f"--data-dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        if not os.path.isfile(path):
            raise ValueError(f"--data {path}: no such file (a flat array of {dtype} token ids)")
        size = os.path.getsize(path)
        item = np.dtype(dtype).itemsize
        if size % item:
            raise ValueError(f"--data {path}: {size} bytes is not a whole number of {dtype} tokens "
                             f"({item} bytes each); wrong --data-dtype?")
        self.path, self.dtype, self.n = path, dtype, size // item

    def tokens(self) -> np.ndarray:
        if self.n == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode="r")

    def check(self, vocab: int, seq: int) -> None:
        """The file holds at least one row of ``seq`` tokens plus its target, all ids < ``vocab``."""
        if self.n < seq + 1:
            raise ValueError(f"--data {self.path}: {self.n} tokens, too short for one sequence of --seq-len {seq} "
                             f"(needs {seq + 1}: the inputs and the targets shifted by one)")
        top = int(self.tokens().max())
        if top >= vocab:
            raise ValueError(f"--data {self.path}: token id {top} >= the model's vocabulary of {vocab} "
                             f"(wrong --data-dtype, or a file made for another tokenizer?)")

    def batch(self, rows: int, seq: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` sequences at offsets drawn from ``seed``: (inputs, targets), int64 arrays (rows, seq)."""
        data = self.tokens()
        starts = np.random.default_rng(seed % (1 << 63)).integers(0, self.n - seq, size=rows)
        x = np.stack([np.asarray(data[s:s + seq + 1], dtype=np.int64) for s in starts])
        return x[:, :-1], x[:, 1:]


__all__ = ["DTYPES", "TokenFile"]
