"""tests/gpu/stack_parts.py: the image's stack as parts for a GPU host, slim.json's paths taken out of the wheels (the
download itself needs PyPI; here wheels written for the test)."""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import stack_parts

RECORD = "pkg-1.0.dist-info/RECORD"


def wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("pkg/__init__.py", "x = 1\n")
        z.writestr("pkg/third_party/big/kernel.so", b"\0" * 5000)
        z.writestr("pkg/third_party/bigger.py", "keep = True\n")
        z.writestr("pkg/lib/only.so", b"\1" * 3000)
        z.writestr(RECORD, "pkg/__init__.py,sha256=a,6\npkg/third_party/big/kernel.so,sha256=b,5000\n"
                           "pkg/third_party/bigger.py,sha256=c,12\npkg/lib/only.so,sha256=d,3000\n" + RECORD + ",,\n")
    return path


def test_slim_wheel_drops_the_paths_and_their_record_lines(tmp_path: Path) -> None:
    paths = ["pkg/third_party/big", "pkg/lib/only.so"]
    dropped = stack_parts.slim_wheel(wheel(tmp_path / "pkg-1.0-py3-none-any.whl"), tmp_path / "out.whl", paths)
    assert dropped == 8000
    with zipfile.ZipFile(tmp_path / "out.whl") as z:
        assert z.namelist() == ["pkg/__init__.py", "pkg/third_party/bigger.py", RECORD]
        assert z.read(RECORD).decode().splitlines() == ["pkg/__init__.py,sha256=a,6",
                                                         "pkg/third_party/bigger.py,sha256=c,12", RECORD + ",,"]
    assert stack_parts.removed("pkg/third_party/big/x", paths) and not stack_parts.removed("pkg/third_party/bigger.py",
                                                                                          paths)


def test_slim_splits_parts_that_join_to_the_slimmed_wheels(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    whl = wheel(tmp_path / "pkg-1.0-py3-none-any.whl")
    with tarfile.open(tmp_path / "all.tar", "w") as tf:
        tf.add(whl, arcname=f"./{whl.name}")
    data = (tmp_path / "all.tar").read_bytes()
    (src / "w.00").write_bytes(data[:4000])
    (src / "w.01").write_bytes(data[4000:])
    assert stack_parts.main(["slim", str(src), str(tmp_path / "out"), "--part-mib", "1"]) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["install-stack.sh", "slim.json", "w.00"]
    with tarfile.open(out / "w.00") as tf:
        assert tf.getnames() == [f"./{whl.name}"]
    assert (out / "slim.json").read_text() == (stack_parts.REPO / "docker" / "slim.json").read_text()


def test_pins_leave_out_what_the_image_removes_and_the_host_has() -> None:
    import json

    spec = json.loads((stack_parts.REPO / "docker" / "slim.json").read_text())
    pins = stack_parts.pins(stack_parts.REPO / "docker" / "requirements.lock", spec)
    names = {p.split("==")[0].lower() for p in pins}
    assert {"vllm", "torch", "triton", "transformers"} <= names
    assert not names & {d["name"] for d in spec["distributions"]} and not names & stack_parts.HOST_HAS
