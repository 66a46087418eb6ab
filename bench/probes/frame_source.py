"""The Python the frame compiler generates for one of spy_workload's GPU workloads (to
read a profile's `<dcf root #N>:LINE` entries against): every compiled frame and root
of the workload's first step, with line numbers.

    python -m bench.probes.frame_source KIND [--ops]   # KIND as in spy_workload (dyn_64, ...)

--ops ends each line that runs a node with a comment naming it (type, name, device).
"""
import builtins
import sys

import dcf.frame_compiler as fc
from bench.probes.spy_workload import build

_SOURCES: list = []


def _capture(src, fname, mode):
    _SOURCES.append((fname, src))
    return builtins.compile(src, fname, mode)


def _emit_naming_nodes(emit):
    def emit_named(self, depth, text, node=None, frame_var=None):
        if node is not None:
            dev = getattr(self.cf.plan, "gpu_of", {}).get(node.id)
            text += f"    # {node.type} {node.name}" + (f" on {dev.name}" if dev is not None else "")
        emit(self, depth, text, node, frame_var)
    return emit_named


def main() -> None:
    fc.compile = _capture           # the compiler's `compile` is looked up in its module
    if "--ops" in sys.argv:
        fc._Codegen.emit = _emit_naming_nodes(fc._Codegen.emit)
    m, xv = build(sys.argv[1])
    m.step(xv)
    m.close()
    for fname, src in _SOURCES:
        print(f"===== {fname} ({len(src.splitlines())} lines)")
        for i, line in enumerate(src.splitlines(), 1):
            print(f"{i:5d} {line}")


if __name__ == "__main__":
    main()
