"""Device specs: parse, format and merge strings like "/job:worker/task:3/gpu:0"."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PART = re.compile(r"^(job|task|replica|device|(?i:cpu|gpu))(?::(.*))?$")
_TYPES = ("cpu", "gpu")


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
            raise TypeError(_not_a_string(spec))
        job = task = dtype = index = None
        for part in spec.strip("/").split("/"):
            m = _PART.match(part)
            if not m:
                raise ValueError(f"invalid device spec {spec!r}: cannot parse {part!r}")
            key, val = m.group(1).lower(), m.group(2)
            if key == "job":
                if not val:
                    raise ValueError(f"invalid device spec {spec!r}: the job has no name")
                job = val
            elif key == "task":
                task = _int(spec, val)
            elif key == "replica":
                if _int(spec, val) != 0:
                    raise ValueError(f"invalid device spec {spec!r}: dcf runs one replica "
                                     "per task (replica:0)")
            else:
                if dtype is not None:
                    raise ValueError(f"invalid device spec {spec!r}: it names two devices")
                dtype, index = _device(spec, key, val)
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


def _not_a_string(spec: object) -> str:
    msg = (f"a device is a string such as '/gpu:0' or '/job:worker/task:1/cpu:0' (or None), "
           f"not {type(spec).__name__} {spec!r}")
    if callable(spec):
        msg += ("; device functions (TF's tf.device(fn)) are not supported: place ops with "
                "nested dcf.device scopes")
    return msg


def _device(spec: str, key: str, val: str | None) -> tuple[str, int | None]:
    """(type, index) of "cpu:1", "GPU", "cpu:*" or "device:GPU:0"; a missing or "*"
    index is unspecified (an enclosing scope's index, else 0), as in TensorFlow."""
    if key == "device":
        key, _, val = (val or "").partition(":")
        key = key.lower()
        if key not in _TYPES:
            raise ValueError(f"invalid device spec {spec!r}: unknown device type "
                             f"{key!r}; dcf has CPU and GPU devices")
        val = val or None
    return key, None if val in (None, "*") else _int(spec, val)


def _int(spec: str, val: str | None) -> int:
    try:
        n = int(val)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"invalid device spec {spec!r}: {val!r} is not an index") from None
    if n < 0:
        raise ValueError(f"invalid device spec {spec!r}: {val!r} is not an index (indices "
                         "count from 0)")
    return n


def canonical(spec: str | None) -> str:
    """Canonical string form of a device spec ("" when unspecified)."""
    return DeviceSpec.parse(spec).to_string()
