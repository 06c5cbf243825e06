"""t4serve.config.compilation: the ladder per T4SERVE_COMPILE, and the user's own compile flags that take it over."""

from __future__ import annotations

import pytest

from t4serve.config.compilation import RUNGS_BY_NAME, ladder_for, user_controls_compilation


@pytest.mark.parametrize(
    "args",
    [["--enforce-eager"], ["--enforce_eager"], ["--compilation-config", "{}"], ["--compilation-config.level=1"],
     ["-O1"], ["-O", "0"], ["-cc.mode=0"], ["--compilation_config={}"]],
)
def test_user_compile_flags_take_over(args: list[str]) -> None:
    assert user_controls_compilation(args)
    assert ladder_for("auto", args) == () and ladder_for("full", args) == ()


def test_other_flags_leave_the_ladder() -> None:
    assert not user_controls_compilation(["--max-model-len", "4096", "--seed", "1"])
    assert [r.name for r in ladder_for("auto", [])] == ["full", "lean", "o1", "eager"]
    assert ladder_for("o1", []) == (RUNGS_BY_NAME["o1"],)
