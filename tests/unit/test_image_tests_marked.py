"""scripts/test runs the image tests with `-m image`: a module in tests/image without the marker is never run in CI
(tests/image/test_kernel_fit.py was, until this test)."""

from __future__ import annotations

from pathlib import Path

IMAGE_TESTS = Path(__file__).resolve().parents[1] / "image"


def test_every_image_test_module_is_marked_image() -> None:
    modules = sorted(IMAGE_TESTS.glob("test_*.py"))
    assert modules
    unmarked = [m.name for m in modules if "pytestmark = pytest.mark.image" not in m.read_text()]
    assert unmarked == []
