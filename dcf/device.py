"""Device specs: parse, format and merge strings like "/job:worker/task:3/gpu:0"."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PART = re.compile(r"^(job|task|replica|device|cpu|gpu|CPU|GPU)(?::(.*))?$")


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """A (possibly partial) device name. None fields are unspecified."""

    job: str | None = None
    task: int | None = None
    device_type: str | None = None  # "cpu" or "gpu"
    index: int | None = None

    @staticmethod
    def parse(spec: str | DeviceSpec | None) -> DeviceSpec:
        if spec is None or spec == "":
            return DeviceSpec()
        if isinstance(spec, DeviceSpec):
            return spec
        if not isinstance(spec, str):
            raise TypeError(
                f"a device is a string such as '/gpu:0' or '/job:worker/task:1/cpu:0' (or "
                f"None), not {type(spec).__name__} {spec!r}; device functions (TF's "
                "tf.device(fn)) are not supported: place ops with nested dcf.device scopes")
        job = task = dtype = index = None
        for part in spec.strip("/").split("/"):
            m = _PART.match(part)
            if not m:
                raise ValueError(f"invalid device spec {spec!r}: cannot parse {part!r}")
            key, val = m.group(1).lower(), m.group(2)
            if key == "job":
                job = val
            elif key == "task":
                task = _int(spec, val)
            elif key == "replica":
                continue
            elif key == "device":
                dt, _, ix = (val or "").partition(":")
                dtype, index = dt.lower(), _int(spec, ix or "0")
            else:
                dtype, index = key, _int(spec, val if val not in (None, "") else "0")
        return DeviceSpec(job, task, dtype, index)

    def merged_over(self, outer: DeviceSpec) -> DeviceSpec:
        """Fill this spec's unspecified fields from `outer` (inner scopes win)."""
        return DeviceSpec(
            self.job if self.job is not None else outer.job,
            self.task if self.task is not None else outer.task,
            self.device_type if self.device_type is not None else outer.device_type,
            self.index if self.index is not None else outer.index,
        )

    def to_string(self) -> str:
        parts = []
        if self.job is not None:
            parts.append(f"job:{self.job}")
        if self.task is not None:
            parts.append(f"task:{self.task}")
        if self.device_type is not None:
            parts.append(f"{self.device_type}:{self.index if self.index is not None else 0}")
        return "/" + "/".join(parts) if parts else ""

    def __str__(self) -> str:
        return self.to_string()


def _int(spec: str, val: str | None) -> int:
    try:
        return int(val)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"invalid device spec {spec!r}: {val!r} is not an index") from None


def canonical(spec: str | None) -> str:
    """Canonical string form of a device spec ("" when unspecified)."""
    return DeviceSpec.parse(spec).to_string()
