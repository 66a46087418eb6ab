"""`gru_reference`: a GRU over time-major inputs with per-example sequence lengths, in
numpy (TF1's GRUCell: gates [r, u] from [x, h], candidate from [x, r * h]; outputs past a
sequence's length are zero and its state stays), for the tests that check dcf.nn's GRU."""

from __future__ import annotations

import numpy as np


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def gru_reference(w, x_tm, seq):
    """(outputs [T, B, units], final state [B, units]) of a GRU with weights
    w = (gates kernel, gates bias, candidate kernel, candidate bias) over x_tm [T, B, depth]."""
    gk, gb, ck, cb = w
    h = np.zeros((x_tm.shape[1], ck.shape[1]))
    outs = []
    for t, x in enumerate(x_tm):
        r, u = np.split(_sigmoid(np.concatenate([x, h], 1) @ gk + gb), 2, 1)
        c = np.tanh(np.concatenate([x, r * h], 1) @ ck + cb)
        hn = u * h + (1 - u) * c
        keep = (t < np.asarray(seq))[:, None]
        outs.append(np.where(keep, hn, 0.0))
        h = np.where(keep, hn, h)
    return np.stack(outs), h
