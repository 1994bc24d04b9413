"""Token files for run --data: windows of the file at seeded offsets, one-line refusals (no processes)."""
from __future__ import annotations

import numpy as np
import pytest

from pipeloom.runtime.data import TokenFile


def test_rows_are_windows_of_the_file_and_targets_the_next_token(tmp_path):
    f = tmp_path / "t.bin"
    np.arange(1000, dtype=np.uint32).tofile(f)  # token i at position i: a row starting at s is s, s+1, ...
    tf = TokenFile(str(f), "uint32")
    assert tf.n == 1000
    x, y = tf.batch(6, 16, seed=3)
    assert x.shape == y.shape == (6, 16) and x.dtype == np.int64
    assert (x == x[:, :1] + np.arange(16)).all() and (y == x + 1).all()
    assert (y[:, -1] <= 999).all()
    x2, _ = tf.batch(6, 16, seed=3)
    x3, _ = tf.batch(6, 16, seed=4)
    assert (x2 == x).all() and not (x3 == x).all()


def test_refusals(tmp_path):
    f = tmp_path / "t.bin"
    np.array([1, 2, 3, 70000 % 65536], dtype=np.uint16).tofile(f)
    with pytest.raises(ValueError, match="too short"):
        TokenFile(str(f)).check(vocab=10, seq=4)
    np.array([1, 2, 3, 9, 10], dtype=np.uint16).tofile(f)
    with pytest.raises(ValueError, match="token id 10"):
        TokenFile(str(f)).check(vocab=10, seq=4)
    TokenFile(str(f)).check(vocab=11, seq=4)
    with pytest.raises(ValueError, match="whole number"):
        TokenFile(str(f), "uint32")
    with pytest.raises(ValueError, match="data-dtype"):
        TokenFile(str(f), "int8")
