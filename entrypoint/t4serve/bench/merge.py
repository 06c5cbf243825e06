"""`bench merge`: runs from several sweeps as one result folder (a single card serves one configuration at a time,
so a comparison on a T4 may be two sweeps, one after the other)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from t4serve.bench.grid import Cell
from t4serve.bench.results import Run, RunsFile, _gathered, check_runs_file
from t4serve.errors import ConfigError


@dataclass(frozen=True)
class Source:
    """One folder a merge takes runs from: every model in it (`models` None), or only the named ones."""

    folder: Path
    runs_file: RunsFile
    models: tuple[str, ...] | None = None

    @property
    def wanted(self) -> list[str]:
        return list(self.models) if self.models is not None else list(self.runs_file.models)

    def taken(self) -> list[Run]:
        """The runs a merge takes from this folder."""
        wanted = self.wanted
        return [r for r in self.runs_file.runs if r.model in wanted]


def merge_runs(sources: list[Source]) -> RunsFile:
    """Runs from several sweeps as one: a single card can serve one configuration at a time, so a comparison on a T4
    is two sweeps, one after the other. A cell (model, input, c, repeat) must come from exactly one source, and every
    source must have used the same output length, or the rows would not be comparable."""
    taken: dict[tuple[str, Cell], Path] = {}
    runs: list[Run] = []
    models: list[str] = []
    ceilings: dict[str, float | None] = {}
    notes: list[str] = []
    output_lens: dict[int, Path] = {}
    objectives: dict[tuple[float | None, float | None], Path] = {}
    for source in sources:
        rf = source.runs_file
        wanted = source.wanted
        missing = [m for m in wanted if m not in rf.models]
        if missing:
            raise ConfigError(
                f"{source.folder} holds no runs of {', '.join(missing)}",
                found=f"models in {source.folder}: {', '.join(rf.models) or 'none'}",
                required="MODEL=FOLDER naming a model that folder's sweep ran",
                fix=f"use one of {', '.join(rf.models) or '(none)'}, or pass the folder alone to take every model",
            )
        output_lens.setdefault(rf.output_len, source.folder)
        if len(output_lens) > 1:
            lens = ", ".join(f"{n} tokens in {f}" for n, f in output_lens.items())
            raise ConfigError(
                "the sweeps generated different output lengths, so their throughput is not comparable",
                found=lens, required="one output length in every merged folder",
                fix="merge only sweeps made with the same --output-len",
            )
        if rf.slo_ttft_ms is not None or rf.slo_tpot_ms is not None:  # older folders counted no goodput
            objectives.setdefault((rf.slo_ttft_ms, rf.slo_tpot_ms), source.folder)
        if len(objectives) > 1:
            seen = ", ".join(f"TTFT {a} ms / TPOT {b} ms in {f}" for (a, b), f in objectives.items())
            raise ConfigError(
                "the sweeps counted goodput against different objectives, so their goodput is not comparable",
                found=seen, required="the same --slo-ttft-ms and --slo-tpot-ms in every merged folder",
                fix="merge only sweeps made with the same objectives",
            )
        from_here = source.taken()
        for run in from_here:
            key = (run.model, run.cell)
            if key in taken:
                raise ConfigError(
                    f"{run.model}, input {run.input_len}, c={run.concurrency}, repeat {run.repeat} is in two folders",
                    found=f"{taken[key]} and {source.folder}",
                    required="each model's cell in one merged folder only",
                    fix=f"take that model from one of them: MODEL=FOLDER (e.g. {run.model}={source.folder})",
                )
            taken[key] = source.folder
            runs.append(run)
        for model in wanted:
            if model not in models:
                models.append(model)
            if ceilings.get(model) is None:
                ceilings[model] = rf.ceilings.get(model)
        why = f"; {rf.interrupted}" if rf.interrupted else ""
        notes.append(f"{', '.join(wanted)}: {len(from_here)} run(s) from {source.folder} (started {rf.started}{why})")
        notes += [f"{source.folder}: {n}" for n in rf.notes]
    if not runs:
        raise ConfigError("nothing to merge", found="no runs in the folders given",
                          required="folders written by `t4serve bench --output DIR`",
                          fix="pass result folders that hold runs")
    starts = list(dict.fromkeys(s.runs_file.started for s in sources))
    slo_ttft_ms, slo_tpot_ms = next(iter(objectives), (None, None))
    merged = _gathered(models, runs, output_len=next(iter(output_lens)), started="; ".join(starts), ceilings=ceilings,
                       notes=notes, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)
    return check_runs_file(merged, "the merged runs")
