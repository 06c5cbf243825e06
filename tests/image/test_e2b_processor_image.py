"""tests/unit/test_e2b_processor.py run inside the image, where transformers, torch, torchvision, Pillow and tokenizers
are installed: the unit-test venv has none of them, so there four of its tests skip. Here none may: the checked-in
processor files must be what the image's transformers saves, and its AutoTokenizer / AutoProcessor must load the test
checkpoint and expand an image. The image has no pytest, so this machine's (pure Python) is lent to the container,
read-only, beside the test module; the unit tests' conftest (the hardening summary, which needs hypothesis) is left out.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from .conftest import REPO, RunInImage

pytestmark = pytest.mark.image

# pytest and what it imports that the image lacks (packaging is in the image).
LENT = ("pytest", "_pytest", "pluggy", "iniconfig", "py")


def _lend_pytest(target: Path) -> None:
    for name in LENT:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, f"{name} is not importable here"
        origin = Path(spec.origin)
        if origin.name == "__init__.py":
            shutil.copytree(origin.parent, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, target / origin.name)


def test_processor_tests_pass_in_the_image_with_none_skipped(run_in_image: RunInImage, tmp_path: Path) -> None:
    lent = tmp_path / "lent"
    lent.mkdir()
    _lend_pytest(lent)
    done = run_in_image(
        *("-m", "pytest", "-p", "no:cacheprovider", "--noconftest", "-rs", "-q", "/t/unit/test_e2b_processor.py"),
        entrypoint="python3",
        env={"PYTHONPATH": "/lent:/t/unit", "PYTHONDONTWRITEBYTECODE": "1"},
        extra=("--network", "none", "-v", f"{REPO / 'tests'}:/t:ro", "-v", f"{lent}:/lent:ro", "-w", "/tmp"),
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    print(summary)
    assert done.returncode == 0, f"test_e2b_processor.py failed in the image:\n{done.stdout[-4000:]}{done.stderr}"
    assert "passed" in summary and "skipped" not in summary, f"expected every test to run in the image: {summary}"
