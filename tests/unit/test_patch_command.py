"""`t4serve patch` on the command line: exit 4 with the found/required/fix message on a vLLM the clamp cannot take."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_patch_apply import make_tree
from test_patch_locate import VLLM_LIKE_SOURCE

from t4serve.cli import main
from t4serve.patch.locate import TARGET_PATH


def test_apply_on_drifted_vllm_exits_4_naming_what_moved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_tree(tmp_path, VLLM_LIKE_SOURCE.replace("_get_tile_size", "_pick_tile"), version="0.40.0")
    assert main(["patch", "apply", "--vllm-root", str(root)]) == 4
    err = capsys.readouterr().err
    assert "vLLM 0.40.0" in err and "_get_tile_size is missing" in err
    assert "found:" in err and "required:" in err and "fix:" in err
    assert "_get_tile_size" not in (root / TARGET_PATH).read_text()


def test_verify_on_unpatched_vllm_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_tree(tmp_path)
    assert main(["patch", "verify", "--skip-interpreter", "--vllm-root", str(root)]) == 4
    assert "the Turing clamp is not applied to vLLM 0.33.0" in capsys.readouterr().err


def test_help_lists_both_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["patch", "--help"]) == 0
    out = capsys.readouterr().out
    assert "apply" in out and "verify" in out
