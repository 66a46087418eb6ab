"""Where the in-graph DQN agent's step goes (bench/NOTES.md, "dqn, session 16"): every
simple statement of its compiled root timed in place (the timers' own cost measured and
subtracted), then the kernels only the in-graph agent runs (the explore draw, scalar
casts and comparisons, the reshapes of the environment's outputs, the py_func wrapper)
timed alone. Learning regime: learn_start 500, epsilon decayed over 500 steps, 700
steps of warm-up. CPU only.

    python -m bench.probes.dqn_step_costs [ROWS]
"""
import builtins
import collections
import os
import re
import sys
import time
import timeit

import numpy as np

import dcf.frame_compiler as fc

_SRC: dict = {}
_NS: dict = {}
_LINE = re.compile(r"^(\s+)(\S.*)$")
_COMPOUND = ("if ", "elif ", "else", "while ", "for ", "def ", "return ", "yield", "try",
             "except", "finally", "with ")


def _instrument(src, fname, mode, *a, **k):
    out, lines = [], src.splitlines()
    _SRC[fname] = lines
    for i, line in enumerate(lines, 1):
        m = _LINE.match(line)
        s = line.strip()
        if m and not s.startswith(_COMPOUND) and not s.endswith(":") and "yield" not in s:
            ind, body = m.groups()
            out.append(f"{ind}_t0_ = _pc(); {body}; _T[{fname!r}, {i}] += _pc() - _t0_")
        else:
            out.append(line)
    return builtins.compile("\n".join(out), fname, mode, *a, **k)


def _exec(code, ns, *a):
    builtins.exec(code, ns, *a)
    _NS[code.co_filename] = ns


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import dqn_cartpole as ex

    builtins._T = collections.defaultdict(float)
    fc.compile, fc.exec = _instrument, _exec
    agent = ex.InGraphAgent(ex.CartPole(0), ex.DQNConfig(learn_start=500, eps_decay_steps=500))
    agent.run_steps(700)
    T = builtins._T
    T.clear()
    n = 3000
    t0 = time.perf_counter()
    agent.run_steps(n)
    wall = (time.perf_counter() - t0) / n
    for _ in range(100_000):
        _t0_ = time.perf_counter()
        T["timer", 0] += time.perf_counter() - _t0_
    timer = T.pop(("timer", 0)) / 100_000
    print(f"{1e6 * wall:.1f} us per step with the timers; {len(T)} timed lines, "
          f"{1e6 * sum(T.values()) / n:.1f} us; a timer costs {1e6 * timer:.3f} us")
    for (fname, i), t in sorted(T.items(), key=lambda kv: -kv[1])[:rows]:
        print(f"{1e6 * (t / n - timer):7.2f} us  {fname}:{i}  {_SRC[fname][i - 1].strip()[:100]}")
    root = next(ns for f, ns in _NS.items() if "root" in f and "f43" in ns)
    i32, f32 = np.int32(700), np.float32(0.5)

    def alone(what, fn, *args, number=20000):
        dt = min(timeit.repeat(lambda: fn(*args), number=number, repeat=5)) / number
        print(f"  {what:34s} {1e6 * dt:6.2f} us")
    print("-- alone (the in-graph agent's own kernels; names as in the root of this dcf)")
    alone("explore draw (RandomUniform)", root["f10"])
    alone("Cast int32 -> float32", root["f11"], i32)
    alone("Minimum (float32 scalars)", root["f15"], f32, np.float32(1))
    alone("Reshape (4, 1) -> (-1,)", root["f44"], np.zeros((4, 1), np.float32))
    alone("Reshape (1,) -> ()", root["f46"], np.zeros(1, np.float32))
    alone("env.step called directly", agent.env.step, np.int32(0), number=5000)
    alone("env.step through the py_func", root["f43"], np.int32(0), number=5000)
    alone("numpy Generator.random()", np.random.default_rng(0).random)
    agent.close()


if __name__ == "__main__":
    main()
