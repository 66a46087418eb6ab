"""Host time of each line of the compiled frames (dcf's generated code), timed in place:
every line of a generated function that calls a kernel (`fN(...)`) gets a perf_counter
before and after it. `python -m bench.probes.line_costs KIND STEPS [ROWS]` with KIND as in
`spy_workload` (dyn_B, sta_B, mp1_B, mp2_B); prints us per step for the costliest lines
with their text (with $OUT set, the generated sources are written there).
The timers cost ~0.1 us per line; compare kinds, not absolute figures."""
import builtins, collections, os, re, sys, time

import dcf.frame_compiler as fc

_KERNEL_LINE = re.compile(r"^(\s+)(.*\bf\d+\(.*)$")
_SOURCES: dict[str, list[str]] = {}
_NAMESPACES: dict[str, dict] = {}
_CALL = re.compile(r"\b(f\d+)\(")


def _exec(code, ns, *a):
    builtins.exec(code, ns, *a)
    _NAMESPACES[code.co_filename] = ns


def label(fname: str, line: str) -> str:
    """What a line's kernel is: the fused call's class, the function's name."""
    m = _CALL.search(line)
    fn = _NAMESPACES.get(fname, {}).get(m.group(1)) if m else None
    if fn is None:
        return "?"
    for attr in ("__func__", "func"):
        fn = getattr(fn, attr, fn)
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    for var in ("typ", "name"):                 # the GPU kernel wrapper: its op
        if code is not None and var in code.co_freevars:
            op = cells[code.co_freevars.index(var)].cell_contents
            return "op " + re.sub(r"_\d+(?=/|$)", "", op)
    q = getattr(fn, "__qualname__", None)
    return q.replace("<locals>.", "") if q and "lambda" not in q else type(fn).__name__


def _instrument(src: str, fname: str, mode: str, *a, **k):
    out, lines = [], src.splitlines()
    _SOURCES[fname] = lines
    for i, line in enumerate(lines, 1):
        m = _KERNEL_LINE.match(line)
        if m and not line.lstrip().startswith(("if ", "while ", "for ", "def ", "return ")) \
                and not line.rstrip().endswith(":"):
            ind, body = m.groups()
            out.append(f"{ind}_t0_ = _pc(); {body}; _T[{fname!r}, {i}] += _pc() - _t0_")
        else:
            out.append(line)
    return builtins.compile("\n".join(out), fname, mode, *a, **k)


def main() -> None:
    kind, steps = sys.argv[1], int(sys.argv[2])
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    builtins._T = collections.defaultdict(float)
    fc.compile = _instrument
    fc.exec = _exec
    from bench.probes.spy_workload import build
    m, xv = build(kind)
    m.step(xv); m.step(xv)
    builtins._T.clear()
    t0 = time.perf_counter()
    for _ in range(steps):
        m.step(xv)
    wall = (time.perf_counter() - t0) / steps
    tot = sum(builtins._T.values()) / steps
    print(f"{kind}: {1e3 * wall:.2f} ms per step; kernel-call lines {1e3 * tot:.2f} ms")
    by_label: dict = collections.defaultdict(lambda: [0.0, 0])
    for (fname, i), t in builtins._T.items():
        e = by_label[label(fname, _SOURCES[fname][i - 1])]
        e[0] += t
        e[1] += 1
    print("-- by kernel (us per step, lines)")
    for k, (t, n) in sorted(by_label.items(), key=lambda kv: -kv[1][0]):
        print(f"{1e6 * t / steps:9.1f} us  {n:5d}  {k}")
    print("-- by line")
    for (fname, i), t in sorted(builtins._T.items(), key=lambda kv: -kv[1])[:rows]:
        text = _SOURCES[fname][i - 1].strip()
        print(f"{1e6 * t / steps:9.1f} us  {fname}:{i}  {label(fname, text)}  {text[:100]}")
    m.close()
    out = os.environ.get("OUT")
    if out:                                   # the generated sources, for reading the lines
        for fname, lines in _SOURCES.items():
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", fname).strip("_")
            with open(os.path.join(out, f"{kind}-{name}.py"), "w") as f:
                f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
