"""t4serve.turing.inputs: the proof's inputs, gathered by the image's build stage so the proof stage reruns only when
they change. The gathered modules must be enough to import the proof on their own (the proof stage has nothing else of
t4serve); the vLLM side here is a folder holding only the attention file (vLLM itself is the image tests')."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from t4serve.cli import main
from t4serve.patch.locate import TARGET_PATH
from t4serve.turing import inputs

PACKAGE_PARENT = Path(inputs.__file__).resolve().parents[2]


@pytest.fixture
def vllm_root(tmp_path: Path) -> Path:
    """Stands in for an installed vllm package: the one file of it the proof's inputs take."""
    root = tmp_path / "site" / "vllm"
    (root / TARGET_PATH).parent.mkdir(parents=True)
    (root / TARGET_PATH).write_text("# the clamped attention file\n")
    return root


def test_the_closure_holds_the_entries_and_what_they_import_even_inside_functions() -> None:
    found = {p.as_posix() for p in inputs.module_closure(PACKAGE_PARENT)}
    assert {"t4serve/__init__.py", "t4serve/turing/proof.py", "t4serve/turing/__main__.py",
            "t4serve/turing/worker.py", "t4serve/patch/apply.py"} <= found
    # worker imports hook inside a function; the closure reads nested imports too.
    assert "t4serve/turing/hook.py" in found
    # The CLI is not the proof's: a change there must not rerun the image's proof stage.
    assert not {"t4serve/cli.py", "t4serve/turing/plugin.py", "t4serve/turing/inputs.py"} & found
    assert not any(p.startswith("t4serve/commands/") for p in found)


def test_relative_imports_resolve_against_their_package(tmp_path: Path) -> None:
    package = tmp_path / "t4serve"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import near\n")
    (package / "sub" / "near.py").write_text("def f():\n    from ..far import x\n")
    (package / "sub" / "entry.py").write_text("from .near import f\n")
    (package / "far.py").write_text("x = 1\n")
    (package / "unrelated.py").write_text("")
    found = {p.as_posix() for p in inputs.module_closure(tmp_path, ("t4serve.sub.entry",))}
    assert found == {"t4serve/__init__.py", "t4serve/sub/__init__.py", "t4serve/sub/near.py", "t4serve/sub/entry.py",
                     "t4serve/far.py"}


def test_gathered_modules_import_the_proof_on_their_own(tmp_path: Path, vllm_root: Path) -> None:
    out = tmp_path / "inputs"
    copied = inputs.gather(out, vllm_root=vllm_root)
    assert out / vllm_root.resolve().relative_to("/") / TARGET_PATH in copied
    site = out / PACKAGE_PARENT.relative_to("/")
    assert (site / "t4serve" / "turing" / "proof.py").read_bytes() == \
        (PACKAGE_PARENT / "t4serve" / "turing" / "proof.py").read_bytes()
    done = subprocess.run(
        [sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "import t4serve.turing.proof, t4serve.turing.worker, t4serve.turing.hook; "
         "print(t4serve.turing.proof.__file__)", str(site)],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(site))


def test_the_same_sources_gather_to_the_same_bytes_and_modes(tmp_path: Path, vllm_root: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    inputs.gather(first, vllm_root=vllm_root)
    inputs.gather(second, vllm_root=vllm_root)

    def tree(root: Path) -> dict[str, tuple[bytes, int]]:
        return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777)
                for p in root.rglob("*") if p.is_file()}

    assert tree(first) == tree(second)
    assert {mode for _, mode in tree(first).values()} == {0o644}


def test_a_folder_with_content_is_refused_untouched(tmp_path: Path, vllm_root: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "inputs"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["attention", "inputs", "--out", str(out), "--vllm-root", str(vllm_root)]) == 4
    err = capsys.readouterr().err
    assert "not empty" in err and "fix:" in err and str(out) in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_the_command_gathers(tmp_path: Path, vllm_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "inputs"
    assert main(["attention", "inputs", "--out", str(out), "--vllm-root", str(vllm_root)]) == 0
    count = len(inputs.module_closure(PACKAGE_PARENT)) + 1
    assert f"{count} files" in capsys.readouterr().out
    assert sum(1 for p in out.rglob("*") if p.is_file()) == count


def test_the_proof_module_runs_with_a_clear_failure_outside_vllm(tmp_path: Path) -> None:
    """`python -m t4serve.turing.proof`, as the proof stage runs it, fails with t4serve's message, not a traceback,
    when the vllm folder does not hold vLLM's attention file."""
    done = subprocess.run([sys.executable, "-m", "t4serve.turing.proof", "--vllm-root", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 4, done.stderr
    assert done.stderr.startswith("t4serve: ") and "Traceback" not in done.stderr and "fix:" in done.stderr
