"""Two py-spy raw profiles of `bench.probes.spy_workload` compared line by line: each leaf
line's share of the samples inside `timed()` times its run's step time, so ms per step,
and the difference (B - A), largest first. The step times come from the command line (the
workloads' own printout, or `bench.probes.mp_small_batch`).

    python -m bench.probes.spy_diff A.txt A_STEP_MS B.txt B_STEP_MS [rows]
"""
import collections
import sys

from bench.probes.spy_summary import short, timed_samples


def per_line(path: str) -> tuple:
    lines, total = collections.Counter(), 0
    for frames, n in timed_samples(path):
        total += n
        lines[short(frames[-1])] += n
    return lines, total


def main() -> None:
    a_path, a_ms, b_path, b_ms = sys.argv[1], float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    rows = int(sys.argv[5]) if len(sys.argv) > 5 else 30
    (a, ta), (b, tb) = per_line(a_path), per_line(b_path)
    diff = sorted(((b[k] / tb * b_ms - a[k] / ta * a_ms, k) for k in set(a) | set(b)),
                  reverse=True)
    print(f"A {a_path}: {ta} samples, {a_ms} ms a step; B {b_path}: {tb} samples, {b_ms} ms")
    for d, k in diff[:rows]:
        print(f"{d:+7.2f} ms  A {a[k] / ta * a_ms:6.2f}  B {b[k] / tb * b_ms:6.2f}  {k}")
    print(f"... {len(diff) - rows} more lines; B's largest savings:")
    for d, k in diff[-5:]:
        print(f"{d:+7.2f} ms  A {a[k] / ta * a_ms:6.2f}  B {b[k] / tb * b_ms:6.2f}  {k}")


if __name__ == "__main__":
    main()
