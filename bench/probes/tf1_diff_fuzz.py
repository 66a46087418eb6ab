"""Random small float64 programs built the same way in dcf and in TF1 (control flow v1,
`tf.gradients`): forward values, first-order gradients w.r.t. x, y, a scalar s and a
variable v (sometimes with grad_ys) and sometimes second order (the gradient of
<d out/dx, u>) must agree at rtol 1e-9. dcf runs each program twice, with compiled frames
(the default) and on the tagged-token executor (`compile_frames=False`).

What nest_fuzz_gpu (dcf against itself) does not cover: an outside reference, and the
grammar's other ops: elementwise (tanh, sigmoid, exp of a clipped value, square, multiply,
add, maximum, where), matmul, reductions, reshape/transpose, slicing, gather,
concat/stack; `cond` (one or two results) and `case` on data or on a loop counter;
`while_loop` with data-dependent trip counts (a float threshold or an int limit cast from
data), maximum_iterations and parallel_iterations 1/10, loop variables of several kinds
(int counter, [2,3], scalar, [3], a TensorArray written each iteration, one read each
iteration); a TensorArray of data-dependent size written in one loop and gathered or
read back to front (twice, with clear_after_read=False) in another; map_fn, scan
(also reversed), foldl, foldr; stop_gradient; a variable read anywhere; nesting 2-3 deep.

A program is Python source over a module `T` (dcf or tensorflow.compat.v1), so the same
text runs on both and is its own repro. On a disagreement the probe takes float64 central
finite differences of the disagreeing gradient, to say which side is wrong. TF1 refuses
most second orders through loops ("Second-order gradient for while loops not
supported"): then it compares first order with TF1 and checks dcf's second order against
a directional central difference of dcf's own first order. A program with stop_gradient
has no finite-difference reference (a difference sees through it).

--wide adds the rest of API.md's ops as leaves (WIDE_LEAVES: softmax, log_softmax, both
cross-entropies with labels from argmax, gather_nd/scatter_nd with repeated indices,
one_hot, reduce_prod through zeros, reduce_max/min with ties, pow with non-integer
exponents, sqrt/rsqrt/log/log1p, abs/sign, divide, floordiv/mod on ints, softplus,
sin/cos, expand_dims/squeeze, split/unstack, fill/zeros_like/ones_like, casts through
int32 and float32, range, eye), runs a quarter of the programs in float32 (compared at
rtol 1e-5; finite differences then take the float64 program) and gives x a partly unknown
static shape in some. --devices builds leaves and control-flow constructs under
`T.device("/cpu:0")` or `"/cpu:1"` at random (TF1 gets two CPU devices, soft placement),
and dcf runs such programs also unfused (`fuse_devices=False`), so values cross device
boundaries inside loops and conds on every executor. Where TF1 refuses a program dcf's
first order is checked by finite differences alone; where TF1 disagrees and finite
differences side with dcf, the line says "TF1 wrong" and the seed counts as agreeing.

    python -m bench.probes.tf1_diff_fuzz --seeds A:B [--depth D] [--show] [--no-tf]
                                         [--wide] [--devices]

prints one line per seed (OK, or BAD with what differs, the finite-difference verdict and
the program's source) and a count at the end. About 2 s a program on one core; bugs found
are in tests/autodiff/test_review6_fuzz_found.py and test_review6b_fuzz_found.py.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import traceback

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import dcf  # noqa: E402

RTOL, ATOL = 1e-9, 1e-11
RTOL32, ATOL32 = 1e-5, 1e-6     # a float32 program's
SHAPES = {"x": (2, 3), "y": (2, 3), "s": ()}


# ------------------------------------------------------------------ programs
# Leaves: format strings over two [2,3] operands A, B, a constant c, a loop counter ctr,
# a non-integer exponent p and clip bounds lo < hi; each gives a [2,3] value of dtype F.
BASIC_LEAVES = {
    "tanh": "T.tanh({A} * {c} + {B})",
    "sigmoid": "T.sigmoid({A}) * {B}",
    "exp": "T.exp(T.clip_by_value({A}, -2.0, 2.0)) * {c}",
    "square": "T.square({A}) * {c} + {B}",
    "mul": "T.multiply({A}, {B}) * {c}",
    "add": "T.add({A}, {B} * {c})",
    "max": "T.maximum({A}, {B} * {c})",
    "where": "T.where({A} > {B}, {A} * {c}, T.tanh({B}))",
    "matmul": "T.matmul(T.matmul({A}, T.transpose({B})), {A}) * 0.2",
    "rsum": "{A} * T.reduce_sum({B}, axis=1, keepdims=True) * {c}",
    "rmax": "{A} + T.reduce_max({B}, axis=0) * {c}",
    "rmean": "{A} * T.reduce_mean({B}) + {B} * {c}",
    "reshape": "T.reshape(T.transpose({A}), [2, 3]) * {B}",
    "reshape2": "T.transpose(T.reshape({A}, [3, 2])) + {B} * {c}",
    "concat": "T.concat([{A}[:, 1:], {B}[:, :1]], axis=1)",
    "concat0": "T.concat([{A}[1:], {B}[:1] * {c}], 0)",
    "gather": "T.gather({A}, [1, 0]) * {c} + {B}",
    "gather1": "T.gather({A}, [2, 0, 1], axis=1) * {B}",
    "stack": "T.stack([{A}[1], {B}[0] * {c}])",
    "slice": "{A}[:, 0:1] * {B} + {A}[1] * {c}",
    "var": "{A} * v + T.tanh(v * {B}) * {c}",
}
CTR_LEAF = "{A} * (T.cast({ctr}, F) * {c} + 1.0) + {B} * 0.1"
# --wide: the rest of API.md's differentiable ops (and int paths the gradient stops at).
WIDE_LEAVES = {
    "softmax": "T.nn.softmax({A} * {c} + {B})",
    "softmax0": "T.nn.softmax({A}, axis=0) * {B}",
    "logsoftmax": "T.nn.log_softmax({A}) * {c} + {B}",
    "xent": "{A} * T.expand_dims(T.nn.softmax_cross_entropy_with_logits("
            "labels=T.nn.softmax({B}), logits={A} * {c}), 1)",
    "sxent": "{B} + T.expand_dims(T.nn.sparse_softmax_cross_entropy_with_logits("
             "labels=T.argmax({B}, axis=1), logits={A}), 1) * {c}",
    "gather_nd": "T.gather_nd({A}, [[1], [0]]) * {B}",
    "gather_nd2": "T.reshape(T.gather_nd({A}, [[1, 2], [0, 0], [1, 2], [0, 1], [1, 0], "
                  "[1, 2]]), [2, 3]) + {B} * {c}",
    "scatter_nd": "T.scatter_nd([[0, 1], [1, 2], [0, 1]], {A}[0] * {c}, [2, 3]) + {B}",
    "scatter_nd2": "T.scatter_nd([[1], [0]], {A}, [2, 3]) * {B}",
    "one_hot": "T.one_hot(T.argmax({A}, axis=1), 3, dtype=F) * {B} + {A} * {c}",
    "prod": "{A} * T.reduce_prod({B}, axis=1, keepdims=True) * {c}",
    "prod0": "{A} + T.reduce_prod(T.where({B} > 0.3, T.zeros_like({B}), {B} + 0.2), axis=0)",
    "prodall": "{B} + T.reduce_prod(T.where(T.abs({A}) < 0.2, T.zeros_like({A}), {A})) * {c}",
    "maxtie": "{B} + T.reduce_max(T.concat([{A}, {A}], 1), axis=1, keepdims=True)",
    "mintie": "{B} * T.reduce_min(T.stack([{A}, {A} * 1.0, {B}]), axis=0)",
    "maxclip": "{A} + T.reduce_max(T.minimum({B}, 0.1), axis=0) * {c}",
    "pow": "T.pow(T.abs({A}) + 0.5, {p}) * {B}",
    "pow2": "T.pow(T.sigmoid({A}) + 0.2, {B} * 0.5)",
    "sqrt": "T.sqrt(T.square({A}) + 0.1) * {c} + {B}",
    "rsqrt": "T.rsqrt(T.exp(T.clip_by_value({A}, -2.0, 2.0))) * {B}",
    "log": "T.log(T.sigmoid({A})) + {B} * {c}",
    "log1p": "T.log1p(T.square({A}) + 0.1) * {c} + {B}",
    "abs": "T.abs({A}) * {B} + T.sign({B}) * {c}",
    "divide": "T.divide({A}, T.square({B}) + 0.5)",
    "divide2": "{A} / (1.0 + T.exp(T.clip_by_value({B}, -2.0, 2.0)))",
    "floordiv": "T.cast(T.floordiv(T.cast({A} * 10.0, T.int32), 3), F) * {B}",
    "mod": "T.cast(T.mod(T.cast({A} * 10.0, T.int32) + 20, 3), F) * {B} + {A}",
    "softplus": "T.softplus({A}) * {c} + {B}",
    "sincos": "T.sin({A}) * T.cos({B})",
    "expand": "T.squeeze(T.expand_dims({A}, 1), [1]) * {B}",
    "expand0": "T.squeeze(T.expand_dims({A}, 0)) + {B} * {c}",
    "split": "T.concat(T.split({A}, 3, axis=1)[::-1], 1) * {B}",
    "split2": "T.split({A}, [1, 2], axis=1)[0] * {B}",
    "unstack": "T.stack(T.unstack({A})[::-1]) * {c} + {B}",
    "unstack1": "T.stack(T.unstack({A}, axis=1)[1:] + [{B}[:, 0]], axis=1)",
    "clip": "T.clip_by_value({A}, {lo}, {hi}) * {B}",
    "fill": "{A} * T.fill([2, 3], T.reduce_sum({B}) * {c}) + T.ones_like({B}) * {c}",
    "zeros": "T.zeros_like({A}) + T.ones_like({A}) * {B}",
    "castint": "T.cast(T.cast({A} * 3.0, T.int32), F) * {B} + {A} * {c}",
    "cast32": "T.cast(T.cast({A}, T.float32), F) * {B}",
    "range": "T.reshape(T.cast(T.range(6), F), [2, 3]) * {A} * {c} + {B}",
    "range2": "{A} * T.cast(T.range(1, 7, 2), F) + {B}",
    "eye": "T.matmul({A}, T.eye(3, dtype=F) * {c} + T.ones([3, 3], dtype=F) * 0.1) + {B}",
    "where2": "T.where({A} * {B} > 0.1, T.sqrt(T.abs({A}) + 0.1), {B} * {c})",
}


class Gen:
    """Writes one program's source: `def model(T, x, y, s, v):` returning a [2,3] tensor.
    Every value in `env` is a [2,3] float64 tensor; `ctrs` are int32 loop counters."""

    def __init__(self, rng: random.Random, wide=False, devices=False):
        self.rng, self.lines, self.n = rng, [], 0
        self.wide, self.devices = wide, devices

    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def emit(self, ind: int, line: str) -> None:
        self.lines.append("    " * ind + line)

    def emit_placed(self, ind: int, line: str, p: float = 0.4) -> None:
        """`line` under a random `T.device` scope (with --devices, at probability p)."""
        if self.devices and self.rng.random() < p:
            self.emit(ind, f'with T.device("/cpu:{self.rng.randint(0, 1)}"):')
            ind += 1
        self.emit(ind, line)

    def c(self, lo=-0.9, hi=0.9) -> float:
        return round(self.rng.uniform(lo, hi), 2)

    def two(self, env):
        """Two different operands, the first most often one of the newest."""
        a = self.rng.choice(env[-2:] if self.rng.random() < 0.6 else env)
        others = [e for e in env if e != a]
        return a, (self.rng.choice(others) if others else f"({a} * 0.5 + 0.3)")

    def expr(self, depth: int, env: list, ind: int, ctrs: list) -> str:
        r = self.rng.random()
        if depth == 0 or r < 0.3:
            return self.leaf(env, ind, ctrs)
        kind = self.rng.choice(["cond", "cond2", "case", "while", "while", "while_ta", "map",
                                "scan", "foldl", "foldr", "ta2", "sg", "chain"])
        return getattr(self, "k_" + kind)(depth, env, ind, ctrs)

    def leaf(self, env, ind, ctrs) -> str:
        rng, name = self.rng, self.fresh("e")
        A, B = self.two(env)
        c = self.c()
        kinds = list(BASIC_LEAVES) + (list(WIDE_LEAVES) if self.wide else [])
        if ctrs:
            kinds += ["ctr", "ctr"]
        k = rng.choice(kinds)
        ctr = rng.choice(ctrs) if ctrs else None
        expr = (WIDE_LEAVES.get(k) or BASIC_LEAVES.get(k) or CTR_LEAF).format(
            A=A, B=B, c=c, ctr=ctr, p=rng.choice([1.7, 0.5, -0.6, 2.3]),
            lo=self.c(-0.9, 0.0), hi=self.c(0.1, 0.9))
        self.emit_placed(ind, f"{name} = {expr}", 0.6)
        return name

    def sub(self, depth, env, ind, ctrs, n=None) -> str:
        """One to three statements; the last one's name (each joins env)."""
        env = list(env)
        for _ in range(n or self.rng.randint(1, 2)):
            env.append(self.expr(depth, env, ind, ctrs))
        return env[-1]

    def pred(self, env, ctrs) -> str:
        if ctrs and self.rng.random() < 0.3:
            return f"T.equal({self.rng.choice(ctrs)} % 2, 0)"
        return f"T.reduce_sum({self.rng.choice(env)}) > {self.c(-1.5, 1.5)}"

    def k_chain(self, depth, env, ind, ctrs):
        return self.sub(depth - 1, env, ind, ctrs, 2)

    def k_sg(self, depth, env, ind, ctrs):
        name = self.fresh("g")
        self.emit(ind, f"{name} = T.stop_gradient({self.rng.choice(env)})")
        return self.expr(depth - 1, env + [name], ind, ctrs)

    def k_cond(self, depth, env, ind, ctrs):
        t, f, name = self.fresh("t"), self.fresh("f"), self.fresh("c")
        for fn in (t, f):
            self.emit(ind, f"def {fn}():")
            self.emit(ind + 1, f"return {self.sub(depth - 1, env, ind + 1, ctrs)}")
        self.emit_placed(ind, f"{name} = T.cond({self.pred(env, ctrs)}, {t}, {f})")
        return name

    def k_cond2(self, depth, env, ind, ctrs):
        """A cond returning a pair."""
        t, f, name = self.fresh("t"), self.fresh("f"), self.fresh("c")
        for fn in (t, f):
            self.emit(ind, f"def {fn}():")
            a = self.sub(depth - 1, env, ind + 1, ctrs)
            self.emit(ind + 1, f"return ({a}, {self.leaf(env + [a], ind + 1, ctrs)})")
        self.emit_placed(ind, f"{name}p = T.cond({self.pred(env, ctrs)}, {t}, {f})")
        self.emit(ind, f"{name} = {name}p[0] * {name}p[1] * {self.c()} + {name}p[0]")
        return name

    def trip_limit(self, env, ind):
        """A loop's int limit from data (0..4), or a constant."""
        if self.rng.random() < 0.5:
            return str(self.rng.randint(1, 4))
        lim = self.fresh("lim")
        self.emit(ind, f"{lim} = T.cast(T.clip_by_value(T.reduce_sum({self.rng.choice(env)})"
                       f" * {self.c()} + {self.c(1.5, 3.5)}, 0.0, 4.0), T.int32)")
        return lim

    def k_while(self, depth, env, ind, ctrs, with_ta=False):
        rng = self.rng
        cn, bn, name = self.fresh("cw"), self.fresh("bw"), self.fresh("w")
        A, B = self.two(env)
        lim = self.trip_limit(env, ind)
        extra = rng.choice(["scalar", "vec", "none"])
        read_ta = with_ta and rng.random() < 0.5
        write_ta = with_ta
        if read_ta:
            tr = self.fresh("tr")
            self.emit_placed(ind, f"{tr} = T.TensorArray(F, size=4).unstack("
                           f"T.stack([{A}, {B}, {A} * {B}, T.tanh({A})]))")
        args = ["i", "a"] + (["b"] if extra != "none" else []) + (["ta"] if write_ta else [])
        i, a = self.fresh("i"), self.fresh("a")
        names = {"i": i, "a": a, "b": self.fresh("b"), "ta": self.fresh("ta")}
        params = ", ".join(names[k] for k in args)
        self.emit(ind, f"def {cn}({params}):")
        test = f"{i} < {lim}"
        if rng.random() < 0.4:
            test = f"T.logical_and({test}, T.reduce_sum({a}) < {self.c(0.5, 3.0)})"
        self.emit(ind + 1, f"return {test}")
        self.emit(ind, f"def {bn}({params}):")
        inner = env + [a]
        if read_ta:
            e = self.fresh("r")
            self.emit(ind + 1, f"{e} = {tr}.read({i})")
            inner.append(e)
        s = self.sub(depth - 1, inner, ind + 1, [i] + ctrs)
        na = self.fresh("n")
        self.emit(ind + 1, f"{na} = T.tanh({s}) * 0.9")
        outs = [f"{i} + 1", na]
        b = names["b"]
        if extra == "scalar":
            outs.append(f"{b} * 0.8 + T.reduce_mean({na} * {a})")
        elif extra == "vec":
            outs.append(f"T.sin({b}) + {na}[0] * {self.c()}")
        if write_ta:
            outs.append(f"{names['ta']}.write({i}, {na} * {a})")
        self.emit(ind + 1, f"return ({', '.join(outs)})")
        init = ["T.constant(0)", A]
        if extra == "scalar":
            init.append(f"T.reduce_sum({B}) * 0.1")
        elif extra == "vec":
            init.append(f"{B}[1]")
        if write_ta:
            init.append("T.TensorArray(F, size=0, dynamic_size=True, "
                        "element_shape=[2, 3])")
        mi = rng.choice([None, None, rng.randint(1, 3)])
        pi = rng.choice([1, 10])
        kw = f", parallel_iterations={pi}" + (f", maximum_iterations={mi}" if mi else "")
        self.emit_placed(ind, f"{name}r = T.while_loop({cn}, {bn}, ({', '.join(init)},){kw})")
        res = f"{name}r[1]"
        if extra == "scalar":
            res += f" * (1.0 + {name}r[2] * 0.3)"
        elif extra == "vec":
            res += f" + {name}r[2] * {self.c()}"
        if write_ta:
            res += f" + T.reduce_sum({name}r[-1].stack(), axis=0) * {self.c()}"
        self.emit(ind, f"{name} = {res}")
        return name

    def k_while_ta(self, depth, env, ind, ctrs):
        return self.k_while(depth, env, ind, ctrs, with_ta=True)

    def k_map(self, depth, env, ind, ctrs):
        fn, name, r = self.fresh("m"), self.fresh("mp"), self.fresh("row")
        self.emit(ind, f"def {fn}({r}):")
        e = self.fresh("st")
        self.emit(ind + 1, f"{e} = T.stack([{r}, {r} * {self.c()}])")
        s = self.sub(depth - 1, env + [e], ind + 1, ctrs)
        self.emit(ind + 1, f"return T.reduce_mean({s}, axis=0)")
        self.emit_placed(ind, f"{name} = T.map_fn({fn}, {self.rng.choice(env)})")
        return name

    def k_scan(self, depth, env, ind, ctrs, fold=False):
        fn, name, acc, r = self.fresh("sc"), self.fresh("sn"), self.fresh("acc"), \
            self.fresh("row")
        A, B = self.two(env)
        self.emit(ind, f"def {fn}({acc}, {r}):")
        e = self.fresh("st")
        self.emit(ind + 1, f"{e} = T.stack([{acc}, {r}])")
        s = self.sub(depth - 1, env + [e], ind + 1, ctrs)
        self.emit(ind + 1, f"return T.tanh(T.reduce_mean({s}, axis=0))")
        how = "foldl" if fold else "scan"
        self.emit_placed(ind, f"{name}r = T.{how}({fn}, {A}, initializer={B}[0])")
        if fold:
            self.emit(ind, f"{name} = T.stack([{name}r, {name}r * {self.c()}])")
        else:
            self.emit(ind, f"{name} = {name}r")
        return name

    def k_foldl(self, depth, env, ind, ctrs):
        return self.k_scan(depth, env, ind, ctrs, fold=True)

    def k_foldr(self, depth, env, ind, ctrs):
        """foldr, or a reversed scan."""
        fn, name, acc, r = self.fresh("fr"), self.fresh("fo"), self.fresh("acc"), \
            self.fresh("row")
        A, B = self.two(env)
        self.emit(ind, f"def {fn}({acc}, {r}):")
        e = self.fresh("st")
        self.emit(ind + 1, f"{e} = T.stack([{r}, {acc} * {self.c()}])")
        s = self.sub(depth - 1, env + [e], ind + 1, ctrs)
        self.emit(ind + 1, f"return T.sin(T.reduce_sum({s}, axis=0) * 0.5)")
        if self.rng.random() < 0.5:
            self.emit_placed(ind, f"{name}r = T.foldr({fn}, {A}, initializer={B}[1])")
            self.emit(ind, f"{name} = T.stack([{name}r * {self.c()}, {name}r])")
        else:
            self.emit_placed(ind, f"{name} = T.scan({fn}, {A}, initializer={B}[1], reverse=True)")
        return name

    def k_case(self, depth, env, ind, ctrs):
        fns = [self.fresh("k") for _ in range(3)]
        name = self.fresh("cs")
        for fn in fns:
            self.emit(ind, f"def {fn}():")
            self.emit(ind + 1, f"return {self.sub(depth - 1, env, ind + 1, ctrs)}")
        p1, p2 = self.pred(env, ctrs), self.pred(env, ctrs)
        self.emit_placed(ind, f"{name} = T.case([({p1}, {fns[0]}), ({p2}, {fns[1]})], "
                       f"default={fns[2]})")
        return name

    def k_ta2(self, depth, env, ind, ctrs):
        """A TensorArray written in one loop and read in another (gathered, read twice
        with clear_after_read=False, or read back to front), of a data-dependent size."""
        rng = self.rng
        A, B = self.two(env)
        n, name, ta = self.fresh("n"), self.fresh("tw"), self.fresh("ta")
        self.emit(ind, f"{n} = T.cast(T.clip_by_value(T.reduce_sum({A}) * {self.c()} + "
                       f"{self.c(1.5, 3.5)}, 1.0, 4.0), T.int32)")
        cw, bw, i, a, t = (self.fresh(p) for p in ("cw", "bw", "i", "a", "t"))
        self.emit(ind, f"def {cw}({i}, {a}, {t}):")
        self.emit(ind + 1, f"return {i} < {n}")
        self.emit(ind, f"def {bw}({i}, {a}, {t}):")
        sub = self.sub(depth - 1, env + [a], ind + 1, [i] + ctrs)
        na = self.fresh("na")
        self.emit(ind + 1, f"{na} = T.tanh({sub}) * 0.8")
        self.emit(ind + 1, f"return ({i} + 1, {na}, {t}.write({i}, {na} * {B}))")
        clear = rng.random() < 0.5
        self.emit_placed(ind, f"{ta} = T.while_loop({cw}, {bw}, (T.constant(0), {A}, "
                       f"T.TensorArray(F, size={n}, clear_after_read={clear}, "
                       f"element_shape=[2, 3])))[2]")
        how = rng.choice(["gather", "loop"])
        if how == "gather":
            self.emit_placed(ind, f"{name} = T.reduce_sum({ta}.gather(T.range({n} - 1, -1, -1)) "
                           f"* {self.c()}, axis=0) + {A}")
            return name
        cr, br, j, acc = (self.fresh(p) for p in ("cr", "br", "j", "acc"))
        self.emit(ind, f"def {cr}({j}, {acc}):")
        self.emit(ind + 1, f"return {j} < {n}")
        self.emit(ind, f"def {br}({j}, {acc}):")
        first = f"{ta}.read({n} - 1 - {j})"
        twice = "" if clear else f" + T.square({ta}.read({n} - 1 - {j})) * {self.c()}"
        self.emit(ind + 1, f"return ({j} + 1, {acc} * 0.7 + T.tanh({first}){twice})")
        self.emit_placed(ind, f"{name} = T.while_loop({cr}, {br}, (T.constant(0), {B}))[1]")
        return name


def gen(seed: int, depth: int = 3, wide: bool = False, devices: bool = False) -> dict:
    """Program source and its run settings for one seed. `wide`: also the WIDE_LEAVES ops,
    and a quarter of the programs in float32, and x of a partly unknown static shape in some;
    `devices`: ops placed on /cpu:0 or /cpu:1."""
    rng = random.Random(seed)
    g = Gen(rng, wide, devices)
    dtype = "float32" if wide and rng.random() < 0.25 else "float64"
    g.emit(1, f"F = T.{dtype}")
    g.emit(1, "xs = x * s")
    env = ["x", "y", "xs"]
    for _ in range(rng.randint(1, 2)):
        env.append(g.expr(depth, env, 1, []))
    g.emit(1, f"return {env[-1]}")
    src = "def model(T, x, y, s, v):\n" + "\n".join(g.lines) + "\n"
    nrng = np.random.default_rng(seed)
    return {
        "src": src, "dtype": dtype,
        "feeds": {"x": nrng.normal(0, 0.8, (2, 3)), "y": nrng.normal(0, 0.8, (2, 3)),
                  "s": np.float64(nrng.uniform(0.5, 1.5))},
        "v0": nrng.normal(0, 0.5, (2, 3)),
        "grad_ys": nrng.normal(0, 1, (2, 3)) if rng.random() < 0.4 else None,
        "second": rng.random() < 0.5,
        "u": nrng.normal(0, 1, (2, 3)),
        "xshape": rng.choice([(None, 3), (2, None)]) if wide and rng.random() < 0.3 else (2, 3),
    }


def as_float64(prog: dict) -> dict:
    """The same program in float64, float32 casts included: the finite-difference
    reference (a float32 rounding would swamp a difference over eps)."""
    return dict(prog, dtype="float64", src=prog["src"].replace("T.float32", "T.float64"))


# ------------------------------------------------------------------ running
def dense(T, t):
    """TF1's gradient of a gather is IndexedSlices: as a tensor."""
    return T.convert_to_tensor(t) if type(t).__name__ == "IndexedSlices" else t


def build(T, prog, second=True):
    """The program's graph on T (dcf or TF1): placeholders, outputs and the fetch list."""
    ns: dict = {}
    exec(prog["src"], ns)
    F = getattr(T, prog.get("dtype", "float64"))
    x = T.placeholder(F, prog.get("xshape", (2, 3)), name="x")
    y = T.placeholder(F, (2, 3), name="y")
    s = T.placeholder(F, (), name="s")
    v = T.Variable(prog["v0"].astype(prog.get("dtype", "float64")), name="v")
    out = ns["model"](T, x, y, s, v)
    wrt = [x, y, s, v]
    gy = None if prog["grad_ys"] is None else T.constant(prog["grad_ys"], dtype=F)
    grads = [dense(T, gr) for gr in T.gradients(out, wrt, grad_ys=gy)]
    fetch = {"out": out}
    for k, gr in zip("xysv", grads):
        if gr is not None:
            fetch["d" + k] = gr
    if second and prog["second"] and grads[0] is not None:
        hs = T.gradients(T.reduce_sum(grads[0] * T.constant(prog["u"], dtype=F)), wrt)
        for k, h in zip("xysv", hs):
            if h is not None:
                fetch["h" + k] = dense(T, h)
    return {"x": x, "y": y, "s": s}, fetch


def feed_dict(prog, ph, feeds):
    dtype = np.dtype(prog.get("dtype", "float64"))
    return {ph[k]: np.asarray(val, dtype) for k, val in (feeds or prog["feeds"]).items()}


def run_dcf(prog, compile_frames=True, feeds=None, second=True, fuse_devices=True):
    g = dcf.Graph()
    with g.as_default():
        ph, fetch = build(dcf, prog, second)
        init = dcf.global_variables_initializer()
    config = dcf.SessionConfig(compile_frames=compile_frames, fuse_devices=fuse_devices)
    with dcf.Session(g, config=config) as sess:
        sess.run(init)
        return sess.run(fetch, feed_dict(prog, ph, feeds),
                        options=dcf.RunOptions(timeout_s=60))


_TF = None


def tf1():
    global _TF
    if _TF is None:
        import tensorflow.compat.v1 as tf
        tf.disable_v2_behavior()
        tf.disable_control_flow_v2()
        tf.get_logger().setLevel("ERROR")
        # dcf follows API.md: top-level softplus, and cross-entropy that differentiates
        # its labels too (TF1's v1 op stops them; its _v2 is the same op as dcf's)
        tf.softplus = tf.nn.softplus
        tf.nn.softmax_cross_entropy_with_logits = tf.nn.softmax_cross_entropy_with_logits_v2
        _TF = tf
    return _TF


def run_tf(prog, feeds=None, second=True):
    tf = tf1()
    g = tf.Graph()
    with g.as_default():
        ph, fetch = build(tf, prog, second)
        init = tf.global_variables_initializer()
    config = tf.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1,
                            device_count={"CPU": 2}, allow_soft_placement=True)
    with tf.Session(graph=g, config=config) as sess:
        sess.run(init)
        return sess.run(fetch, feed_dict(prog, ph, feeds))


def close(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    single = np.float32 in (a.dtype, b.dtype)
    return a.shape == b.shape and np.allclose(a, b, rtol=RTOL32 if single else RTOL,
                                              atol=ATOL32 if single else ATOL)


def differ(r1: dict, r2: dict) -> list:
    """Keys whose values disagree (a key only one side has counts if its value is nonzero)."""
    bad = []
    for k in sorted(set(r1) | set(r2)):
        a, b = r1.get(k), r2.get(k)
        if a is None or b is None:
            if np.any(np.asarray(a if b is None else b) != 0):
                bad.append(k + "(None)")
        elif not close(a, b):
            bad.append(k)
    return bad


# ------------------------------------------------------------------ finite differences
def loss_fn(prog, runner, key):
    """A scalar function of the feeds whose gradient is fetch `key` ("dx": out's
    weighted sum; "hx": <dx, u>), computed by `runner` (run_dcf or run_tf)."""
    if key.startswith("d"):
        w = np.ones((2, 3)) if prog["grad_ys"] is None else prog["grad_ys"]
        return lambda f: float(np.sum(runner(prog, feeds=f, second=False)["out"] * w))
    return lambda f: float(np.sum(runner(prog, feeds=f, second=False).get(
        "dx", np.zeros((2, 3))) * prog["u"]))


def finite_diff(prog, runner, key, eps=1e-6):
    """d loss / d feed by central differences (the variable's by its initial value)."""
    name = key[1]

    def at(d):
        if name == "v":
            return loss_fn(dict(prog, v0=prog["v0"] + d), runner, key)(prog["feeds"])
        feeds = dict(prog["feeds"])
        feeds[name] = feeds[name] + d
        return loss_fn(prog, runner, key)(feeds)

    base = np.asarray(prog["v0"] if name == "v" else prog["feeds"][name], dtype=np.float64)
    out = np.zeros(base.shape)
    for idx in np.ndindex(base.shape):
        d = np.zeros(base.shape)
        d[idx] = eps
        out[idx] = (at(d) - at(-d)) / (2 * eps)
    return out


def verdict(prog, key, rd, rt):
    """Which side finite differences agree with, for a gradient fetch `key`."""
    key = key.split("(")[0]
    if key == "out":
        return ""
    if "stop_gradient" in prog["src"]:
        return "no finite-difference reference (stop_gradient)"
    prog = as_float64(prog)
    try:
        fd = finite_diff(prog, run_tf if rt is not None else run_dcf, key)
    except Exception:  # TF refusing: take dcf's forward values instead
        fd = finite_diff(prog, run_dcf, key)
    tol = dict(rtol=1e-4, atol=1e-6)
    d_ok = np.allclose(rd.get(key, 0), fd, **tol)
    t_ok = rt is not None and np.allclose(rt.get(key, 0), fd, **tol)
    who = {(True, False): "dcf right", (False, True): "TF1 right", (True, True): "both ~fd",
           (False, False): "neither ~fd"}[(d_ok, t_ok)]
    return f"{who}: fd {np.round(fd, 7).tolist()}"


# ------------------------------------------------------------------ main
def hvp_check(prog, rd, eps=1e-5):
    """dcf's second order against a directional central difference of its own first
    order (for programs where TF1 refuses second order): None when they agree."""
    if "stop_gradient" in prog["src"]:
        return None    # no reference: a difference sees through it, gradients do not
    rng = np.random.default_rng(7)
    dirs = {k: rng.normal(0, 1, np.shape(prog["feeds"][k])) for k in "xys"}
    dirs["v"] = rng.normal(0, 1, (2, 3))

    def at(t):
        feeds = {k: prog["feeds"][k] + t * dirs[k] for k in "xys"}
        p = dict(prog, v0=prog["v0"] + t * dirs["v"])
        return float(np.sum(run_dcf(p, feeds=feeds, second=False).get("dx", 0) * prog["u"]))

    rtol = 1e-3 if prog["dtype"] == "float32" else 1e-5
    prog = as_float64(prog)
    fd = (at(eps) - at(-eps)) / (2 * eps)
    got = sum(float(np.sum(rd.get("h" + k, 0) * dirs[k])) for k in "xysv")
    if np.isclose(got, fd, rtol=rtol, atol=1e-7):
        return None
    return f"dcf second order along a direction {got!r}, central difference {fd!r}"


def other_paths(prog: dict, rd: dict, devices: bool) -> list:
    """dcf's other executors against the default (compiled, devices fused): the tagged-token
    executor and, for programs placed on two devices, compiled partitions exchanging
    values (`fuse_devices=False`)."""
    notes = []
    paths = {"tagged": dict(compile_frames=False)}
    if devices:
        paths["unfused"] = dict(fuse_devices=False)
    for what, kw in paths.items():
        try:
            rx = run_dcf(prog, **kw)
        except Exception as e:
            notes.append(f"{what} run failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        bad = differ(rd, rx)
        if bad:
            notes.append(f"fused compiled vs {what} differ in {bad}: "
                         + "; ".join(f"{k}: {rd.get(k)} vs {rx.get(k)}" for k in bad
                                     if "(" not in k))
    return notes


def fd_only(prog: dict, rd: dict, refused: str, info: list) -> list:
    """dcf's first-order gradients against finite differences alone (TF1 refused the
    program): the notes of those that disagree."""
    if "stop_gradient" in prog["src"]:
        return [f"TF1 refused ({refused}); no finite-difference reference (stop_gradient)"]
    bad = [f"TF1 refused ({refused}); d{k}: dcf {rd.get('d' + k)}; {why}"
           for k in "xysv" for why in [verdict(prog, "d" + k, rd, None)]
           if not why.startswith("dcf right")]
    info.append(f"TF1 refused ({refused[:60]}), first order checked by finite differences")
    return bad


def check(seed: int, depth: int, use_tf: bool, wide: bool = False,
          devices: bool = False) -> tuple[bool, str, str]:
    """(agree, what differs, notes that are not disagreements)."""
    prog = gen(seed, depth, wide, devices)
    notes, info = [], [prog["dtype"], f"x {prog['xshape']}"] if wide else []
    try:
        rd = run_dcf(prog)
    except Exception as e:
        why = f"{type(e).__name__}: {str(e)[:400]}"
        try:
            run_tf(prog) if use_tf else None
        except Exception as e2:    # a program neither builds (an unstack of an unknown dim)
            return True, "", f"both refuse: dcf {why[:150]}; TF1 {str(e2).splitlines()[0][:150]}"
        return False, f"dcf failed: {why}", ""
    notes += other_paths(prog, rd, devices and "T.device" in prog["src"])
    if not use_tf:
        return not notes, "\n    ".join(notes), ""
    rt, tf_second = None, prog["second"]
    try:
        rt = run_tf(prog)
    except Exception as e:
        first = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        try:  # TF1's gaps are mostly second order: compare the rest
            rt, tf_second = run_tf(prog, second=False), False
            info.append(f"TF1 refused second order ({first})")
        except Exception as e2:
            refused = f"{type(e2).__name__}: {str(e2).splitlines()[0][:120]}"
            notes += fd_only(prog, rd, refused, info)
    if rt is not None:
        mine = rd if tf_second else {k: val for k, val in rd.items() if k[0] != "h"}
        for k in differ(mine, rt):
            key, why = k.split("(")[0], verdict(prog, k, rd, rt)
            if why.startswith("dcf right"):    # TF1's bug (often a dropped second order)
                info.append(f"TF1 wrong in {k}, dcf ~fd")
                continue
            notes.append(f"dcf vs TF1 differ in {k}: dcf {rd.get(key)} TF1 {rt.get(key)}; "
                         f"{why}")
    if prog["second"] and not tf_second and "dx" in rd:
        bad = hvp_check(prog, rd)
        if bad and hvp_check(prog, rd, eps=1e-7):  # not a branch flipping at eps
            notes.append(bad)
        info.append("" if bad else "no second-order reference (stop_gradient)"
                    if "stop_gradient" in prog["src"] else
                    "second order checked by finite differences")
    return not notes, "\n    ".join(notes), "; ".join(i for i in info if i)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0:50", help="A:B, the half-open range")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--show", action="store_true", help="print every program")
    ap.add_argument("--no-tf", action="store_true", help="dcf's paths only")
    ap.add_argument("--wide", action="store_true",
                    help="also softmax, cross-entropy, gather_nd, scatter_nd, reduce_prod, pow, "
                         "int paths, ... (WIDE_LEAVES), and float32 programs")
    ap.add_argument("--devices", action="store_true",
                    help="place ops on /cpu:0 and /cpu:1 (dcf also runs unfused)")
    args = ap.parse_args()
    first, last = (int(t) for t in args.seeds.split(":"))
    nbad = 0
    for seed in range(first, last):
        try:
            ok, note, info = check(seed, args.depth, not args.no_tf, args.wide, args.devices)
        except Exception:
            ok, note, info = False, traceback.format_exc()[-800:], ""
        nbad += not ok
        print(f"{'OK ' if ok else 'BAD'} seed {seed}" + (f" ({info})" if info else "")
              + ("" if ok else f"\n    {note}"), flush=True)
        if args.show or not ok:
            print(gen(seed, args.depth, args.wide, args.devices)["src"], flush=True)
    print(f"{last - first - nbad} of {last - first} programs agree")
    sys.exit(1 if nbad else 0)


if __name__ == "__main__":
    main()
