"""Random nested control-flow programs (cond, case, while with fixed / outer-dependent trip
counts, maximum_iterations and parallel_iterations 1 or 32, map_fn, scan, foldl, foldr,
TensorArrays, loops writing TensorArrays, stop_gradient; depth 2-3), each run with every
op on the CPU and again with every op on /gpu:0: values, gradients and Hessian-vector
products must agree. The programs come from session 30's review by use, where their CPU
values and gradients matched TF1 and their HVPs matched finite differences.

    python -m bench.probes.nest_fuzz_gpu [FIRST_SEED] [LAST_SEED] [DEPTH]
"""
import random
import sys

import numpy as np

import dcf


def gen(rng, depth):
    """A random program: f(env, ctrs) -> a (4,) float64 tensor, and its description."""
    kinds = ["leaf"] if depth == 0 else [
        "leaf", "cond", "case", "while", "map", "scan", "foldl", "foldr", "ta", "while_ta", "sg"]
    k = rng.choice(kinds)
    a, b, c = rng.randrange(99), rng.randrange(99), rng.randrange(99)
    s = round(rng.uniform(0.2, 0.9), 2)
    if k == "leaf":
        op = rng.choice(["sin", "tanh", "mul", "sq", "exp"])

        def leaf(env, ctrs):
            A, B, C = env[a % len(env)], env[b % len(env)], env[c % len(env)]
            return {"sin": lambda: dcf.sin(A) * s + B * 0.5,
                    "tanh": lambda: dcf.tanh(A * B) + C * s,
                    "mul": lambda: A * B * s + C * 0.1,
                    "sq": lambda: (A * s) ** 2 - B * 0.3,
                    "exp": lambda: dcf.exp(dcf.tanh(A) * s) * 0.5 - C * 0.2}[op]()
        return leaf, f"{op}({a},{b},{c})"
    sub1, d1 = gen(rng, depth - 1)
    sub2, d2 = gen(rng, depth - 1)
    if k == "sg":
        return (lambda env, ctrs: sub1([dcf.stop_gradient(env[a % len(env)])] + env, ctrs),
                f"sg[{d1}]")
    if k == "cond":
        usectr = rng.random() < 0.5

        def cond(env, ctrs):
            if usectr and ctrs:
                p = dcf.equal(ctrs[a % len(ctrs)] % 2, 0)
            else:
                p = dcf.reduce_sum(env[a % len(env)]) > s - 0.5
            return dcf.cond(p, lambda: sub1(env, ctrs), lambda: sub2(env, ctrs))
        return cond, f"cond({d1} | {d2})"
    if k == "case":
        sub3, d3 = gen(rng, depth - 1)

        def case(env, ctrs):
            A = env[a % len(env)]
            return dcf.case([(A[0] > 0.2, lambda: sub1(env, ctrs)),
                             (A[1] < 0.1, lambda: sub2(env, ctrs))],
                            default=lambda: sub3(env, ctrs))
        return case, f"case({d1} | {d2} | {d3})"
    if k == "while":
        trips, dep = rng.randrange(1, 4), rng.random() < 0.5
        mi, pi = rng.choice([None, None, 2]), rng.choice([1, 32])

        def loop(env, ctrs):
            lim = (ctrs[b % len(ctrs)] + 1) if (dep and ctrs) else dcf.constant(trips)
            return dcf.while_loop(
                lambda i, v: i < lim,
                lambda i, v: (i + 1, dcf.tanh(sub1([v] + env, [i] + ctrs))),
                (dcf.constant(0), env[a % len(env)]),
                maximum_iterations=mi, parallel_iterations=pi)[1]
        return loop, f"while{trips}{'d' if dep else ''}{mi or ''}p{pi}[{d1}]"
    if k == "map":
        def mapped(env, ctrs):
            one = dcf.ones((4,), dcf.float64)
            r = dcf.map_fn(lambda e: dcf.reduce_sum(sub1([e * one] + env, ctrs)) * 0.25,
                           env[a % len(env)])
            return dcf.reshape(r, (4,))
        return mapped, f"map[{d1}]"
    if k in ("scan", "foldl", "foldr"):
        def folded(env, ctrs):
            one = dcf.ones((4,), dcf.float64)
            r = getattr(dcf, k)(lambda acc, e: dcf.tanh(sub1([acc, e * one] + env, ctrs)),
                                env[a % len(env)], initializer=env[b % len(env)])
            return dcf.reduce_mean(r, axis=0) if k == "scan" else r
        return folded, f"{k}[{d1}]"
    if k == "ta":
        def arr(env, ctrs):
            ta = dcf.TensorArray(dcf.float64, size=4).unstack(
                dcf.reshape(sub1(env, ctrs), (4, 1)) * env[b % len(env)])
            return dcf.reduce_sum(ta.stack(), axis=0) * 0.3
        return arr, f"ta[{d1}]"
    trips = rng.randrange(1, 4)

    def loop_ta(env, ctrs):
        def body(i, v, ta):
            nv = dcf.tanh(sub1([v] + env, [i] + ctrs))
            return i + 1, nv, ta.write(i, nv * s)
        _, v, ta = dcf.while_loop(lambda i, v, ta: i < trips, body,
                                  (dcf.constant(0), env[a % len(env)],
                                   dcf.TensorArray(dcf.float64, size=trips)))
        return dcf.reduce_sum(ta.stack(), axis=0) + v * 0.1
    return loop_ta, f"whileTA{trips}[{d1}]"


def run(f, X, V, device):
    g = dcf.Graph()
    with g.as_default(), dcf.device(device):
        x = dcf.placeholder(dcf.float64, (4,))
        w = dcf.constant([1.0, -0.5, 0.25, 2.0], dcf.float64)
        y = dcf.reduce_sum(f([x, dcf.sin(x) * 0.7], []) * w)
        (gx,) = dcf.gradients(y, [x])
        (hv,) = dcf.gradients(dcf.reduce_sum(gx * V), [x])
        if hv is None:
            hv = dcf.zeros_like(x)
    with dcf.Session(g) as sess:
        return sess.run([y, gx, hv], {x: X}, options=dcf.RunOptions(timeout_s=60))


def main() -> None:
    first = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    last = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    depth = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    bad = 0
    for seed in range(first, last):
        rng = random.Random(seed)
        f, desc = gen(rng, depth)
        X = np.array([0.31, -0.72, 1.13, 0.46]) * rng.uniform(0.5, 1.5)
        V = np.array([0.3, -1.1, 0.7, 0.2])
        try:
            cpu = run(f, X, V, "/cpu:0")
            gpu = run(f, X, V, "/gpu:0")
            ok = all(np.allclose(a, b, rtol=1e-9, atol=1e-11) for a, b in zip(cpu, gpu))
            note = "" if ok else f"\n    cpu {cpu}\n    gpu {gpu}"
        except Exception as e:  # report and go on: one program's failure is one finding
            ok, note = False, f"\n    {type(e).__name__}: {str(e)[:300]}"
        bad += not ok
        print(f"{'OK ' if ok else 'BAD'} seed {seed}: {desc}{note}", flush=True)
    print(f"{last - first - bad} of {last - first} programs agree on CPU and GPU")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
