"""Record a timeline of a loop whose body is split over two devices, and draw it.

Run: python examples/trace_timeline.py [out.png]

Each slice is one op firing, named by op, frame and iteration; the two device tracks
show iterations overlapping (parallel_iterations) and Send/Recv between them.
"""

import argparse

import numpy as np

import dcf


DEFAULT_OUT = "bench/results/trace-split-loop.png"


def main(path: str = DEFAULT_OUT) -> None:
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
    md.write_trace(path.replace(".png", ".json"))
    dcf.trace.plot(md, path, title="while_loop split over /cpu:0 and /cpu:1 (6 iterations)")
    print(f"wrote {path} and the Perfetto/Chrome JSON next to it ({len(md.trace)} events)")


def cli(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", nargs="?", default=DEFAULT_OUT, metavar="out.png",
                   help="the picture to write; the Perfetto/Chrome JSON goes next to it "
                        "(.png replaced by .json) (default: %(default)s)")
    main(p.parse_args(argv).out)


if __name__ == "__main__":
    cli()
