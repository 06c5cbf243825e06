"""A T4SERVE_* variable that is neither a setting nor one of the other names t4serve reads is refused (exit 2) by
every command, naming the closest known name (issue 45: `T4SERVE_MAX_MODELLEN=4096` used to exit 0 with 16,384 kept).
The known names are the settings table plus t4serve.config.names.OTHER_VARIABLES, and every T4SERVE_ name the
repository spells is one of them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from t4serve.cli import COMMANDS, main
from t4serve.config import names
from t4serve.config.settings import VARIABLES

REPO = Path(__file__).resolve().parents[2]
# Names the tests spell on purpose as ones t4serve must not know.
DELIBERATE_TYPOS = {"T4SERVE_MAX_MODELLEN", "T4SERVE_SHUTDOWN_TIMOUT", "T4SERVE_NOT_A_THING", "T4SERVE_GPU_MEMORY",
                    "T4SERVE_MAX_MODEL_LENGTH", "T4SERVE_PREFLIGTH", "T4SERVE_XYZZY", "T4SERVE_",
                    "T4SERVE_GPU_MEMORY_UTILISATION"}  # fmt: skip


@pytest.fixture(autouse=True)
def clean_env(settings_free_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("T4SERVE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))


def test_a_mistyped_setting_is_refused_with_the_setting_it_meant(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("T4SERVE_MAX_MODELLEN", "4096")
    assert main(["plan", "--gpu", "t4"]) == 2
    captured = capsys.readouterr()
    assert "T4SERVE_MAX_MODELLEN is not a t4serve variable (did you mean T4SERVE_MAX_MODEL_LEN?)" in captured.err
    assert "fix: rename T4SERVE_MAX_MODELLEN to T4SERVE_MAX_MODEL_LEN" in captured.err
    assert "4096" not in captured.err, "a value is never shown: it may be a secret under a misspelt name"
    assert "vllm serve" not in captured.out, "no plan is printed for settings that were not what the user meant"


EVERY_COMMAND = [["env"], ["plan", "--gpu", "t4"], ["preflight"], ["probe", "--json"], ["profiles", "--gpu", "t4"],
                 ["roofline", "--gpu", "t4"], ["status"], ["serve"], ["bench", "report", "/nonexistent"],
                 ["host-check"], ["mcp"], ["patch", "verify"], ["attention", "prove"]]  # fmt: skip


@pytest.mark.parametrize("args", EVERY_COMMAND)
def test_every_command_refuses_an_unknown_variable(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("T4SERVE_PREFLIGTH", "warn")
    assert main(args) == 2
    assert "T4SERVE_PREFLIGTH is not a t4serve variable (did you mean T4SERVE_PREFLIGHT?)" in capsys.readouterr().err


def test_the_check_covers_every_listed_command_but_the_healthcheck() -> None:
    """Every command of `t4serve --help` runs the check (EVERY_COMMAND names each one, or its group)."""
    checked = {args[0] for args in EVERY_COMMAND}
    assert set(COMMANDS) - checked == {"healthcheck"}


def test_the_healthcheck_is_left_alone_it_answers_docker(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("T4SERVE_PREFLIGTH", "warn")
    # Docker reads only 0 and 1: no state folder here, so "not ready" (1), never the configuration error's 2.
    assert main(["healthcheck"]) == 1
    assert "not a t4serve variable" not in capsys.readouterr().err


def test_help_is_still_shown(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("T4SERVE_PREFLIGTH", "warn")
    assert main(["plan", "--help"]) == 0
    assert "Usage:" in capsys.readouterr().out


def test_several_unknown_names_in_one_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("T4SERVE_MAX_MODEL_LENGTH", "4096")
    monkeypatch.setenv("T4SERVE_XYZZY", "1")
    assert main(["env"]) == 2
    err = capsys.readouterr().err
    assert "2 T4SERVE_* variables t4serve does not know: T4SERVE_MAX_MODEL_LENGTH, T4SERVE_XYZZY" in err
    assert "rename T4SERVE_MAX_MODEL_LENGTH to T4SERVE_MAX_MODEL_LEN" in err and "unset T4SERVE_XYZZY" in err


def test_known_names_pass(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("T4SERVE_IMAGE", "T4SERVE_VOLUME_PREFIX", "T4SERVE_MCP_DATA_DIR", "T4SERVE_STANDIN_MODE"):
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("T4SERVE_MAX_MODEL_LEN", "4096")
    assert main(["env"]) == 0
    assert "4096" in capsys.readouterr().out


def test_a_new_setting_is_known_through_the_table_alone() -> None:
    """The check reads the settings table: every row's name is known with no list of its own."""
    for var in VARIABLES:
        if var.name.startswith(names.PREFIX):
            assert names.is_known(var.name)
    assert not set(names.OTHER_VARIABLES) & {v.name for v in VARIABLES}, "a setting is listed once, in the table"


def test_a_british_spelling_of_a_setting_is_not_taken_for_a_test_name() -> None:
    assert not names.is_known("T4SERVE_GPU_MEMORY_UTILISATION")
    assert names.closest("T4SERVE_GPU_MEMORY_UTILISATION", names.known_names()) == "T4SERVE_GPU_MEMORY_UTILIZATION"


def test_every_t4serve_name_the_repository_spells_is_known() -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    spelled: dict[str, str] = {}
    for raw in filter(None, files):
        rel = raw.decode()
        if rel.startswith("docs/verified/") or not (REPO / rel).is_file():
            continue
        try:
            text = (REPO / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for name in re.findall(r"\bT4SERVE_[A-Z0-9_]*[A-Z0-9]\b", text):
            spelled.setdefault(name, rel)
    unknown = {n: f for n, f in spelled.items() if not names.is_known(n) and n not in DELIBERATE_TYPOS}
    assert not unknown, (
        f"T4SERVE_ names t4serve would refuse: {unknown}; a setting goes in the settings table, any other name in "
        "t4serve.config.names.OTHER_VARIABLES (then `t4serve env --reference > docs/reference.md`)"
    )
