"""Quickstart: a while_loop with a cond inside, its gradient, and a tiny training loop.

Run: python examples/quickstart.py   (CPU, in-process devices, numpy)

Collatz-style stepping decides its trip count at run time; the gradient of a
data-dependent recurrence flows back through every iteration and branch.
"""

import argparse
import sys

import numpy as np

import dcf


def main() -> None:
    # 1. Data-dependent control flow: count Collatz steps of n, inside the graph.
    n = dcf.placeholder(dcf.int32, (), name="n")
    steps, _ = dcf.while_loop(
        lambda i, x: x > 1,
        lambda i, x: (i + 1, dcf.cond(dcf.equal(x % 2, 0),
                                      lambda: x // 2, lambda: 3 * x + 1)),
        (0, n))

    # 2. Differentiate through a loop whose body branches.
    w = dcf.Variable(np.float32(0.5), name="w")
    x0 = dcf.placeholder(dcf.float32, (), name="x0")

    def body(i, x):
        return i + 1, dcf.cond(x < 10.0, lambda: x * w + 1.0, lambda: x * 0.5)

    _, y = dcf.while_loop(lambda i, x: i < 8, body, (0, x0))
    loss = dcf.square(y - 3.0)
    step = dcf.train.GradientDescentOptimizer(0.01).minimize(loss)

    with dcf.Session() as sess:
        print("Collatz steps of 27:", sess.run(steps, {n: 27}))
        sess.run(dcf.global_variables_initializer())
        for k in range(60):
            l, _ = sess.run([loss, step], {x0: 1.0})
            if k % 20 == 0:
                print(f"step {k:2d}  loss {l:.5f}")
        print(f"trained w = {sess.run(w):.4f}, y = {sess.run(y, {x0: 1.0}):.4f} (target 3)")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()   # --help
    try:
        main()
    except KeyboardInterrupt:       # Ctrl-C: the session closes on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
