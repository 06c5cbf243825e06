"""The sweep's cells: (input length, concurrency, repeat) per model, the seed of each, its prompt count, and the order
the runs are made in.

The seed depends only on (input length, concurrency, repeat), never on the model, so every checkpoint is sent the
same random prompts in a cell while cells differ: seed = input_len * 10_000 + concurrency * 100 + repeat.

The order (`sweep_steps`) interleaves the models: a cell's repeat is a pair (one run of each model), the order within
a pair alternating between repeats (A B, then B A), so host drift falls on both sides of a pair and cancels over the
pairs, and a sweep cut short holds complete pairs. With the servers all resident (`together`) a pair's runs are back
to back. Started one at a time, a server runs a whole round (every cell once, one repeat) between two starts, the
rounds alternating the same way (A B, B A, A B): the server that ends a round begins the next, so 3 repeats cost 4
starts instead of 2 per pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from t4serve.errors import ConfigError
from t4serve.untrusted import Untrusted, parse_int

# The seed formula stays collision-free while concurrency and repeat each fit in two decimal digits.
MAX_CONCURRENCY = 99
MAX_REPEATS = 99
# Longer prompts than any model t4serve serves takes (a typo, or arithmetic that overflows further on).
MAX_INPUT_LEN = 1 << 24
# Goodput's default objectives: MLPerf Inference's server scenario for Llama 3.1 8B (a model class one card serves):
# time to first token within 2 s, time per output token within 100 ms (10 tokens a second, above reading speed).
DEFAULT_SLO_TTFT_MS = 2000.0
DEFAULT_SLO_TPOT_MS = 100.0


@dataclass(frozen=True, order=True)
class Cell:
    input_len: int
    concurrency: int
    repeat: int  # 1-based

    @property
    def seed(self) -> int:
        return seed_for(self.input_len, self.concurrency, self.repeat)


def seed_for(input_len: int, concurrency: int, repeat: int) -> int:
    return input_len * 10_000 + concurrency * 100 + repeat


# Requests per stream in a run: ten waves at c streams, so the ramp (the first wave's prefills together) and the
# drain (the last wave finishing alone) are a small part of what is measured: a steady state.
STEADY_WAVES = 10
# The warm-up run before a cell's first pair: two waves, so every batch size up to c has run prefill and decode.
WARMUP_WAVES = 2


def prompts_per_cell(concurrency: int, override: int | None = None, waves: int = STEADY_WAVES) -> int:
    """`waves` x c (10 by default, STEADY_WAVES): c streams busy for that many requests each; or `override`."""
    return override if override is not None else waves * concurrency


def warmup_prompts(concurrency: int, override: int | None = None, waves: int = STEADY_WAVES) -> int:
    """A warm-up run's requests: 2 x c (WARMUP_WAVES), never more than the recorded runs send."""
    return min(WARMUP_WAVES * concurrency, prompts_per_cell(concurrency, override, waves))


def cells(inputs: list[int], concurrencies: list[int], repeats: int) -> list[Cell]:
    """Every cell in run order: input length, then concurrency, then repeat."""
    validate(inputs, concurrencies, repeats)
    return [Cell(i, c, r) for i in inputs for c in concurrencies for r in range(1, repeats + 1)]


@dataclass(frozen=True)
class Step:
    """One run of the sweep: a model's run of a cell, or (`warmup`) its unrecorded warm-up run before it."""

    model: str
    cell: Cell
    warmup: bool = False


def pair_order(models: list[str], repeat: int) -> list[str]:
    """The models' order in a cell's pair (or a round): as given in odd repeats, reversed in even ones."""
    return list(models) if repeat % 2 else list(reversed(models))


def sweep_steps(models: list[str], inputs: list[int], concurrencies: list[int], repeats: int, *, together: bool,
                warmup: bool = False) -> list[Step]:
    """Every run in the order the sweep makes it (the module's docstring says why). Cells go in the order of
    `concurrencies`, each through `inputs` (a sweep cut short has done the first: list the deciding one first).

    together: per cell, the warm-ups (with `warmup`), then each repeat's pair back to back. Otherwise rounds: per
    repeat, each model in pair_order runs every cell; with `warmup`, a cell's warm-up precedes its first run in each
    server's life (a server lives from a change of model to the next)."""
    validate(inputs, concurrencies, repeats)
    keys = [(i, c) for c in concurrencies for i in inputs]
    steps: list[Step] = []
    if together:
        for i, c in keys:
            if warmup:
                steps += [Step(m, Cell(i, c, 0), warmup=True) for m in pair_order(models, 1)]
            for r in range(1, repeats + 1):
                steps += [Step(m, Cell(i, c, r)) for m in pair_order(models, r)]
        return steps
    current: str | None = None
    warmed: set[tuple[int, int]] = set()
    for r in range(1, repeats + 1):
        for m in pair_order(models, r):
            if m != current:
                current, warmed = m, set()
            for i, c in keys:
                if warmup and (i, c) not in warmed:
                    steps.append(Step(m, Cell(i, c, 0), warmup=True))
                    warmed.add((i, c))
                steps.append(Step(m, Cell(i, c, r)))
    return steps


def validate(inputs: list[int], concurrencies: list[int], repeats: int) -> None:
    problems = []
    if not inputs or any(i < 1 for i in inputs):
        problems.append(f"--inputs {inputs}: need one or more positive token counts")
    if not concurrencies or any(not 1 <= c <= MAX_CONCURRENCY for c in concurrencies):
        problems.append(f"--concurrency {concurrencies}: need values from 1 to {MAX_CONCURRENCY}")
    if not 1 <= repeats <= MAX_REPEATS:
        problems.append(f"--repeats {repeats}: need 1 to {MAX_REPEATS}")
    if len(set(inputs)) != len(inputs) or len(set(concurrencies)) != len(concurrencies):
        problems.append("a value is listed twice in --inputs or --concurrency")
    if problems:
        raise ConfigError(
            "the benchmark grid is invalid",
            found="; ".join(problems),
            required=f"distinct positive input lengths, concurrency 1..{MAX_CONCURRENCY}, repeats 1..{MAX_REPEATS}",
            fix="e.g. --inputs 512,4096 --concurrency 1,4,8,16 --repeats 3",
        )


def parse_int_list(raw: str, flag: str, hi: int = MAX_INPUT_LEN) -> list[int]:
    """Whole numbers from 1 to `hi`, comma-separated."""
    try:
        return [parse_int(part, 1, hi) for part in raw.split(",") if part.strip()]
    except Untrusted as exc:
        raise ConfigError(
            f"{flag} {raw[:200]!r} is not a comma-separated list of whole numbers from 1 to {hi:,}",
            found=f"{raw[:200]!r}: a value {exc.reason}",
            required=f"integers from 1 to {hi:,} separated by commas",
            fix=f"e.g. {flag} " + ("512,4096" if flag == "--inputs" else "1,4,8,16"),
        ) from None
