"""`lstm_gradients`: the gradients of a small LSTM's loss, for the tests that compare a
GPU's fused paths with the CPU (tests/core, tests/gpu)."""

from __future__ import annotations

from typing import Any

import numpy as np

import dcf


def lstm_gradients(devs: Any, xv: np.ndarray, units: int, *, layers: int = 1,
                   kind: str = "dynamic", loss: str = "sum", with_x: bool = False,
                   runs: int = 1, parallel_iterations: int = 32) -> list:
    """Gradients of `loss` of the squared outputs ("sum" or "mean") of a `layers`-deep
    LSTM (`units` each; dynamic_rnn, time-major, or static_rnn over the unstacked steps)
    over its variables -- and the input first with `with_x` -- computed `runs` times in
    one session. `devs`: one device for everything, or one per layer (the input, the
    gradients' bookkeeping on the first, the loss on the last). Returns one list of
    values per run."""
    devs = [devs] * layers if isinstance(devs, str) else list(devs)
    g = dcf.Graph()
    with g.as_default():
        with dcf.device(devs[0]):
            x = dcf.placeholder(dcf.float32, list(xv.shape))
        out = x if kind == "dynamic" else dcf.unstack(x, axis=0)
        for k, dev in enumerate(devs):
            with dcf.device(dev):
                cell = dcf.nn.LSTMCell(units, name=f"l{k}")
                if kind == "dynamic":
                    out, _ = dcf.nn.dynamic_rnn(cell, out, dtype=dcf.float32, time_major=True,
                                                parallel_iterations=parallel_iterations,
                                                scope=f"rnn{k}")
                else:
                    out, _ = dcf.nn.static_rnn(cell, out, dtype=dcf.float32, scope=f"rnn{k}")
        with dcf.device(devs[-1]):
            sq = dcf.square(out if kind == "dynamic" else dcf.stack(out, axis=0))
            y = dcf.reduce_sum(sq) if loss == "sum" else dcf.reduce_mean(sq)
        with dcf.device(devs[0]):
            gs = dcf.gradients(y, ([x] if with_x else []) + dcf.trainable_variables())
        init = dcf.global_variables_initializer()
    with dcf.Session(g) as s:
        s.run(init)
        return [s.run(gs, {x: xv}) for _ in range(runs)]


def layers_in_one_loop(devices: list, xv: np.ndarray, units: int) -> list:
    """LSTM layers stepped together in one while loop (as bench.model_parallel's model),
    layer k on devices[k]: [loss, dkernel_0, dbias_0, ...] of sum(h_top(T)^2)."""
    from dcf import nn

    steps, batch, depth = xv.shape
    g = dcf.Graph()
    with g.as_default():
        with dcf.device(devices[0]):
            x = dcf.constant(xv)
            ta = dcf.TensorArray(dcf.float32, size=steps, element_shape=(batch, depth)
                                 ).unstack(x)
        cells, state0 = [], []
        for k, dev in enumerate(devices):
            with dcf.device(dev):
                cells.append(nn.LSTMCell(units, name=f"layer{k}"))
                state0 += [dcf.zeros([batch, units]), dcf.zeros([batch, units])]

        def body(t, *flat):
            with dcf.device(devices[0]):
                inp = ta.read(t)
            new = []
            for k, dev in enumerate(devices):
                with dcf.device(dev):
                    h, st = cells[k](inp, nn.LSTMStateTuple(flat[2 * k], flat[2 * k + 1]))
                    new += [st.c, st.h]
                    inp = h
            return (t + 1,) + tuple(new)
        out = dcf.while_loop(lambda t, *_: t < steps, body, (0,) + tuple(state0))
        with dcf.device(devices[-1]):
            loss = dcf.reduce_sum(dcf.square(out[-1]))
        params = [v for c in cells for v in (c.kernel, c.bias)]
        grads = dcf.gradients(loss, params)
        init = dcf.global_variables_initializer()
    with dcf.Session(g) as sess:
        sess.run(init)
        return sess.run([loss] + grads)
