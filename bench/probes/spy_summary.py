"""Summary of a py-spy raw profile of `bench.probes.spy_workload` (samples inside its
`timed()` only): the share of samples by leaf line (a native call is charged to the
Python line that makes it) and by the first function a compiled dcf frame calls (kernel
wrappers skipped). `python -m bench.probes.spy_summary OUT.txt [rows]`."""
import collections, re, sys


def short(frame):
    m = re.match(r"(.*) \((.*)\)$", frame)
    if not m:
        return frame
    name, where = m.groups()
    return f"{name} ({where.split('site-packages/')[-1].split('/bench/')[-1]})"


def without_line(frame):
    return re.sub(r":\d+\)$", ")", frame)


def timed_samples(path):
    """(frames, count) of each stack of the raw profile at `path` sampled inside
    spy_workload's `timed()`."""
    for rec in open(path):
        stack, _, n = rec.rstrip().rpartition(" ")
        frames = stack.split(";")
        if any(f.startswith(("timed (", "main.<locals>.timed (")) for f in frames):
            yield frames, int(n)


def main():
    path, rows = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    lines, callee, total, compiled = collections.Counter(), collections.Counter(), 0, 0
    for frames, n in timed_samples(path):
        total += n
        if "<dcf " in frames[-1]:
            compiled += n
        else:
            lines[short(frames[-1])] += n
        for i, f in enumerate(frames):
            if "<dcf " in f and i + 1 < len(frames) and "<dcf " not in frames[i + 1]:
                j = i + 1
                while j + 1 < len(frames) and ("_kernel_fn" in frames[j] or
                                               "run_dev" in frames[j]):
                    j += 1
                callee[short(without_line(frames[j]))] += n
                break
    print(f"{path}: {total} samples in timed(); the compiled frames' own code "
          f"{100 * compiled / max(total, 1):.1f} %")
    for title, c in (("by line", lines), ("by what a compiled frame calls", callee)):
        print(f"-- {title}")
        for k, v in c.most_common(rows):
            print(f"  {100 * v / total:5.1f}%  {k}")


if __name__ == "__main__":
    main()
