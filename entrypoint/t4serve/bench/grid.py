"""The sweep's cells: (input length, concurrency, repeat) per model, the seed of each, and its prompt count.

The seed depends only on (input length, concurrency, repeat), never on the model, so every checkpoint is sent the
same random prompts in a cell while cells differ: seed = input_len * 10_000 + concurrency * 100 + repeat.
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


def prompts_per_cell(concurrency: int, override: int | None = None) -> int:
    """max(4c, 8): enough requests that c streams stay busy for several rounds (published-t4-run.md's sweep)."""
    return override if override is not None else max(4 * concurrency, 8)


def cells(inputs: list[int], concurrencies: list[int], repeats: int) -> list[Cell]:
    """Every cell in run order: input length, then concurrency, then repeat."""
    validate(inputs, concurrencies, repeats)
    return [Cell(i, c, r) for i in inputs for c in concurrencies for r in range(1, repeats + 1)]


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
