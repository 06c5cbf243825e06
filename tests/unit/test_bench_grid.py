"""Seeds, prompt counts and cell order of the benchmark grid."""

from __future__ import annotations

import pytest

from t4serve.bench import grid
from t4serve.errors import ConfigError


def test_seed_depends_on_cell_and_repeat_only() -> None:
    assert grid.seed_for(512, 4, 2) == 5_120_402
    assert grid.Cell(4096, 16, 3).seed == 40_960_000 + 1_600 + 3


def test_seeds_are_distinct_across_the_published_grid() -> None:
    cells = grid.cells([512, 4096], [1, 4, 8, 16], 3)
    assert len(cells) == 24
    assert len({c.seed for c in cells}) == 24


def test_cells_run_input_then_concurrency_then_repeat() -> None:
    assert grid.cells([8, 16], [1, 2], 2)[:5] == [
        grid.Cell(8, 1, 1),
        grid.Cell(8, 1, 2),
        grid.Cell(8, 2, 1),
        grid.Cell(8, 2, 2),
        grid.Cell(16, 1, 1),
    ]


@pytest.mark.parametrize(("c", "expected", "warm"), [(1, 10, 2), (2, 20, 4), (4, 40, 8), (8, 80, 16), (16, 160, 32)])
def test_a_run_is_ten_requests_per_stream_and_a_warmup_two(c: int, expected: int, warm: int) -> None:
    assert grid.prompts_per_cell(c) == expected
    assert grid.prompts_per_cell(c, override=5) == 5
    assert grid.warmup_prompts(c) == warm
    assert grid.warmup_prompts(c, override=3) == min(warm, 3)  # never more than a recorded run sends
    assert grid.prompts_per_cell(c, waves=6) == 6 * c and grid.warmup_prompts(c, waves=1) == c


def order(steps: list[grid.Step]) -> list[str]:
    return [f"{s.model}{s.cell.concurrency}{'w' if s.warmup else s.cell.repeat}" for s in steps]


def test_resident_servers_run_each_pair_back_to_back_alternating_between_repeats() -> None:
    steps = grid.sweep_steps(["A", "B"], [512], [1, 4], 3, together=True)
    assert order(steps) == ["A11", "B11", "B12", "A12", "A13", "B13", "A41", "B41", "B42", "A42", "A43", "B43"]
    assert [s.cell.seed for s in steps[:2]] == [5_120_101] * 2  # a pair: the same prompts for both
    warm = grid.sweep_steps(["A", "B"], [512], [1], 2, together=True, warmup=True)
    assert order(warm) == ["A1w", "B1w", "A11", "B11", "B12", "A12"]
    assert warm[0].cell.repeat == 0
    assert order(grid.sweep_steps(["A", "B", "C"], [8], [1], 2, together=True)) == ["A11", "B11", "C11",
                                                                                   "C12", "B12", "A12"]
    # Cells by concurrency as listed, each through the inputs: the cells that decide first when listed first.
    cells = [(s.cell.concurrency, s.cell.input_len) for s in grid.sweep_steps(["A"], [512, 4096], [16, 8], 1,
                                                                               together=True)]
    assert cells == [(16, 512), (16, 4096), (8, 512), (8, 4096)]


def test_servers_started_one_at_a_time_run_rounds_the_last_server_of_a_round_beginning_the_next() -> None:
    steps = grid.sweep_steps(["A", "B"], [512], [1, 4], 3, together=False, warmup=True)
    # Round 1 A then B, round 2 B (still running) then A, round 3 A (still running) then B: 4 server starts.
    # Each server's life warms each cell once, before that life's first run of it.
    assert order(steps) == ["A1w", "A11", "A4w", "A41", "B1w", "B11", "B4w", "B41", "B12", "B42",
                            "A1w", "A12", "A4w", "A42", "A13", "A43", "B1w", "B13", "B4w", "B43"]
    recorded = [s for s in steps if not s.warmup]
    assert sorted((s.model, s.cell) for s in recorded) == sorted(
        (m, c) for m in "AB" for c in grid.cells([512], [1, 4], 3))


@pytest.mark.parametrize(
    ("inputs", "concurrencies", "repeats"),
    [([], [1], 1), ([512], [0], 1), ([512], [100], 1), ([512], [1], 0), ([512, 512], [1], 1)],
)
def test_invalid_grid_is_a_config_error(inputs: list[int], concurrencies: list[int], repeats: int) -> None:
    with pytest.raises(ConfigError) as err:
        grid.cells(inputs, concurrencies, repeats)
    assert err.value.fix is not None


def test_parse_int_list() -> None:
    assert grid.parse_int_list("1, 4,8,", "--concurrency") == [1, 4, 8]
    with pytest.raises(ConfigError, match="--inputs"):
        grid.parse_int_list("512,4k", "--inputs")
