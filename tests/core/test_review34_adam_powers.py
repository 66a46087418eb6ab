"""Review 34: Adam's bias-correction powers of float16 variables are kept in float32 (as
TF's), not in the variables' float16, where beta2^t drifts far from its value."""

from __future__ import annotations

import numpy as np

import dcf


def test_adam_keeps_the_powers_of_float16_variables_in_float32():
    steps = 3000
    g = dcf.Graph()
    with g.as_default():
        x = dcf.Variable(np.full(4, 0.5, np.float16), name="x")
        loss = dcf.reduce_sum(x * x)
        opt = dcf.train.AdamOptimizer(1e-3)
        train = opt.minimize(loss)
        b1p, b2p = opt._powers[g]
        with dcf.Session() as sess:
            sess.run(dcf.global_variables_initializer())
            for _ in range(steps):
                sess.run(train)
            p1, p2, xv = sess.run([b1p, b2p, x])
    assert p1.dtype == p2.dtype == np.float32
    # beta^t by float32 products, as the powers are updated one step at a time
    want1, want2 = np.float32(1.0), np.float32(1.0)
    for _ in range(steps):
        want1, want2 = want1 * np.float32(0.9), want2 * np.float32(0.999)
    np.testing.assert_allclose([p1, p2], [want1, want2], rtol=1e-6)
    np.testing.assert_allclose(p2, 0.999 ** steps, rtol=1e-3)       # 0.0497, not 0.0667
    assert xv.dtype == np.float16 and np.all(np.abs(xv) < 0.5)
