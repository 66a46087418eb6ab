"""Host us per iteration of the dynamic LSTM's compiled loops with every kernel a no-op:
what the loops' own bookkeeping (predicates, dead-value tests, exits, counters, stack
pushes and pops, marks) costs, apart from the kernels (bench/NOTES.md, "GPU, session 16").

    DCF_FAKE_GPUS=1 DCF_PROBE_UNITS=64 python -m bench.probes.frame_source dyn_64 > SRC
    python -m bench.probes.loop_skeleton SRC

SRC is frame_source's listing; the forward frame is the one named rnn/while, the backward
one gradients/rnn/while_grad. Each runs 200 iterations: the counters start where the
listing reads them (`_enter[K]` assigned to the m-variable the loop's predicate tests)
and every stack a forward iteration pushes to is the one the backward pops."""
import collections
import re
import sys
import time

import numpy as np

DEAD = object()
N = 200


class Stack:
    def __init__(self):
        self.items = []


class Value:
    pass


def frames(path: str) -> dict:
    """Frame name -> its generated source, from frame_source's listing."""
    out, name, lines = {}, None, []
    for line in open(path):
        m = re.match(r"===== <dcf frame (\S+) #\d+>", line)
        if m or line.startswith("====="):
            if name:
                out[name] = "\n".join(lines) + "\n"
            name, lines = (m.group(1) if m else None), []
        elif name:
            lines.append(line.rstrip("\n")[6:])
    if name:
        out[name] = "\n".join(lines) + "\n"
    return out


def compiled(src: str, consts: dict):
    v = Value()
    env = {"DEAD": DEAD, "_HS": (int, float, np.int32, np.int64, np.bool_, bool),
           "_NPA": np.ndarray, "_SS": Stack, "_GSS": Stack, "_HELD": (np.ndarray,),
           "_deque": collections.deque, "_pc": time.perf_counter, "_YIELD_S": 1.0,
           "_err": RuntimeError, "_I0": np.int32(0), "_I1": np.int32(1)}
    arity = {m.group(2): m.group(1).count(",") + 1
             for m in re.finditer(r"((?:v\d+_\d+, )+v\d+_\d+) = (f\d+)\(", src)}
    for nm in set(re.findall(r"\b(f\d+|_C\d+|_X\d+|_mark\w+|_swt\w+)\b", src)):
        if nm.startswith("_C"):
            env[nm] = consts.get(nm, 1)
        elif nm.startswith("_X"):
            env[nm] = nm
        elif nm.startswith("_mark"):
            env[nm] = lambda: []
        elif nm.startswith("_swt"):
            env[nm] = lambda: None
        else:
            k = arity.get(nm, 1)
            env[nm] = (lambda *a: v) if k == 1 else (lambda *a, k=k: (v,) * k)
    ns: dict = {}
    exec(compile(src, "<skeleton>", "exec"), env, ns)
    return ns["frame"], v


def drive(frame, enter) -> float:
    t0 = time.perf_counter()
    for _ in frame(enter):
        pass
    return time.perf_counter() - t0


def main() -> None:
    fs = frames(sys.argv[1])
    fwd_src = fs["rnn/while"]
    bwd_src = fs["gradients/rnn/while_grad"]
    # the predicate: v{a} = ((M < C) ...) in the forward, (M > C) in the backward, M the
    # counter's merge (v{m}_0, a copy of m{m}, or since session 17 m{m} itself), C the
    # bound's variable (v{c}_0 = _C{k}) or, since session 17, the hoisted _C{k}
    fm, fc = re.search(r"\(\([vm](\d+)(?:_0)? < (v\d+_0|_C\d+)\)", fwd_src).groups()
    bm, bc = re.search(r"\(\([vm](\d+)(?:_0)? > (v\d+_0|_C\d+)\)", bwd_src).groups()
    def const_of(src, ref):
        return ref if ref.startswith("_C") else re.search(rf"{ref} = (_C\d+)", src).group(1)

    def slot_of(src, m):
        return int(re.search(rf"m{m} = _enter\[(\d+)\]", src).group(1))
    fwd, _ = compiled(fwd_src, {const_of(fwd_src, fc): N})
    bwd, _ = compiled(bwd_src, {const_of(bwd_src, bc): 0})
    pushes = [int(k) for k in re.findall(r"\(type\(v(\d+)_0\) is _SS or type\(v\d+_0\) is "
                                         r"_GSS\) and not v\d+_0\.items\.append", fwd_src)]
    pops = [int(k) for k in re.findall(r"v(\d+)_0\.items\.pop\(\)", bwd_src)]
    def enter_slot(src, v):
        return int(re.search(rf"v{v}_0 = _enter\[(\d+)\]", src).group(1))
    for rep in range(5):
        ef = collections.defaultdict(Value)
        ef[slot_of(fwd_src, fm)] = 0
        stacks = [Stack() for _ in pushes]
        for v, s in zip(pushes, stacks):
            ef[enter_slot(fwd_src, v)] = s
        # any other counter the forward keeps (the gradient's) starts at 0 too
        for m in re.findall(r"v(\d+)_0 \+ (?:v\d+_0|_C\d+)\) if type", fwd_src):
            mm = re.search(rf"v{m}_0 = \([vm](\d+)(?:_0)? if", fwd_src)
            if mm and re.search(rf"m{mm.group(1)} = _enter", fwd_src):
                ef[slot_of(fwd_src, mm.group(1))] = 0
        tf = drive(fwd, ef)
        eb = collections.defaultdict(Value)
        eb[slot_of(bwd_src, bm)] = N
        for v, s in zip(pops, reversed(stacks)):
            eb[enter_slot(bwd_src, v)] = s
        tb = drive(bwd, eb)
        print(f"forward {1e6 * tf / N:.2f} us per iteration, backward {1e6 * tb / N:.2f}")


if __name__ == "__main__":
    main()
