"""Units, each defined once: byte sizes (binary, as vLLM and nvidia-smi count; decimal GB as disk and checkpoint
sizes are published) and the way a duration is written for a person."""

from __future__ import annotations

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4
# Decimal gigabytes (a float, as the figures divided by it are): checkpoint sizes, bandwidth, published-t4-run.md's RAM.
GB = 1e9


def fmt_duration(seconds: float) -> str:
    """`42s`, `3m05s`, `1h02m`: whole seconds under a minute, then minutes and seconds, then hours and minutes.
    A negative span (a clock that stepped back) reads as 0s."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
