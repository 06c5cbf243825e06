"""PNG plots of a result folder: throughput and per-stream rate against concurrency, TTFT against input length.

matplotlib is imported only here, inside `write_plots`, so the rest of t4serve never pays for it; a missing
matplotlib is a ConfigError that names the package to install.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from t4serve.bench.results import CellSummary, RunsFile, summarize
from t4serve.errors import ConfigError

PLOTS = ("throughput_vs_concurrency.png", "per_stream_vs_concurrency.png", "ttft_vs_input.png")


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display in a container
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError(
            "cannot draw the benchmark plots: matplotlib is not installed",
            found=f"ImportError: {exc}",
            required="matplotlib in the Python that runs `t4serve bench`",
            fix="pip install matplotlib (the tables, CSV and raw JSON are already written)",
        ) from None
    return plt


def write_plots(folder: Path, runs_file: RunsFile) -> list[str]:
    """Write the three plots into `folder`; returns their file names. Failed cells are left out of the lines."""
    plt = _pyplot()
    summaries = [s for s in summarize(runs_file.runs) if not s.failed]
    names = []
    for name, ylabel, attr in (
        (PLOTS[0], "output tokens/s (all streams)", "throughput"),
        (PLOTS[1], "tokens/s per stream (1000 / median TPOT)", "per_stream"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for model in runs_file.models:
            for input_len in runs_file.inputs:
                points = _points(summaries, model, input_len, attr)
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, marker="o", label=f"{model}, input {input_len}")
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.set_xticks(runs_file.concurrencies)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(folder / name, dpi=100)
        plt.close(fig)
        names.append(name)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for model in runs_file.models:
        for c in runs_file.concurrencies:
            points = [
                (s.input_len, s.ttft_ms)
                for s in summaries
                if s.model == model and s.concurrency == c and s.ttft_ms is not None
            ]
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                ax.plot(xs, ys, marker="o", label=f"{model}, c={c}")
    ax.set_xlabel("input tokens")
    ax.set_ylabel("median TTFT (ms)")
    ax.set_xticks(runs_file.inputs)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / PLOTS[2], dpi=100)
    plt.close(fig)
    names.append(PLOTS[2])
    return names


def _points(summaries: list[CellSummary], model: str, input_len: int, attr: str) -> list[tuple[int, float]]:
    points = []
    for s in summaries:
        value = getattr(s, attr)
        if s.model == model and s.input_len == input_len and value is not None:
            points.append((s.concurrency, float(value)))
    return sorted(points)
