"""Record a timeline of a loop whose body is split over two devices, and draw it.

Run: python examples/trace_timeline.py [out.png]
     (default ./trace-split-loop.png; the README's picture is regenerated with
     python examples/trace_timeline.py bench/results/trace-split-loop.png)

Writes the picture (PNG, or the format its extension names, e.g. .svg; a name without
one gets .png) and the Perfetto/Chrome trace JSON beside it (out.json). In the picture
each slice is one op firing, coloured by op type, on one track per device; the op names,
frames and iterations are in the JSON. Both in-process devices share the session's one
thread, so the two tracks never run at the same time; they take turns: /cpu:0 with the
loop's control ops and tanh(a @ w), /cpu:1 with tanh(b @ w), the values crossing by
Send/Recv. parallel_iterations=4 lets up to four iterations be in flight, so one turn
may hold ops of several iterations (the first turn of /cpu:0 runs the loop's control
ahead for four).
"""

import argparse
import os
import sys

import numpy as np

import dcf


DEFAULT_OUT = "trace-split-loop.png"        # in the current directory


def json_path(path: str) -> str:
    """The trace JSON's name: the picture's with its extension replaced by .json."""
    return os.path.splitext(path)[0] + ".json"


def main(path: str = DEFAULT_OUT) -> tuple[str, str]:
    """Run the loop with tracing on; write the picture to `path` and the trace JSON
    beside it (creating the folder). Returns (picture path, JSON path)."""
    x0 = dcf.placeholder(dcf.float32, (64, 64))
    w = dcf.constant(np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32) / 8)

    def body(i, a, b):
        with dcf.device("/cpu:1"):
            b = dcf.tanh(b @ w)
        return i + 1, dcf.tanh(a @ w) + 0.0 * b, b

    out = dcf.while_loop(lambda i, a, b: i < 6, body, (0, x0, x0), parallel_iterations=4)
    md = dcf.RunMetadata()
    with dcf.Session(config=dcf.SessionConfig(compile_frames=False)) as sess:
        sess.run(out, {x0: np.ones((64, 64), np.float32)},
                 options=dcf.RunOptions(trace=True), run_metadata=md)
    if not os.path.splitext(path)[1]:
        path += ".png"
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    trace_json = json_path(path)
    md.write_trace(trace_json)
    dcf.trace.plot(md, path, title="while_loop split over /cpu:0 and /cpu:1 (6 iterations)")
    print(f"wrote {path} and {trace_json} (Perfetto/Chrome trace, {len(md.trace)} events)")
    return path, trace_json


def cli(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default=DEFAULT_OUT, metavar="out.png",
                   help="the picture to write (its folder is created); the Perfetto/Chrome "
                        "trace JSON goes beside it, its extension replaced by .json "
                        "(default: %(default)s)")
    out = p.parse_args(argv).out
    if json_path(out) == out:
        p.error(f"{out!r} would be overwritten by the trace JSON: give the picture another "
                "extension (.png, .svg, ...)")
    main(out)


if __name__ == "__main__":
    try:
        cli()
    except KeyboardInterrupt:       # Ctrl-C: the session closes on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
