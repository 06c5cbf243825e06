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


@pytest.mark.parametrize(("c", "expected"), [(1, 8), (2, 8), (4, 16), (8, 32), (16, 64)])
def test_prompts_per_cell_is_max_of_4c_and_8(c: int, expected: int) -> None:
    assert grid.prompts_per_cell(c) == expected
    assert grid.prompts_per_cell(c, override=5) == 5


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
