"""Shrink the image stack's wheel parts before they travel to the GPU host: remove from the wheels themselves what
docker/slim.json removes from the image (its `paths`), each wheel's RECORD rewritten to match, then split again.

    python3 tests/gpu/slim_stack.py PARTS_IN PARTS_OUT [--part-mib 44]

PARTS_IN holds w.00 ... w.NN (a tar of cp312 wheels, split: every pin of docker/requirements.lock less what
docker/slim.json removes as distributions), install-stack.sh and slim.json; PARTS_OUT gets the same, smaller (for
vLLM 0.34.0's stack: 665 MiB less uncompressed, 26 parts of 44 MiB where 32 were). install-stack.sh on the host still
applies slim.json: its removals then find nothing, its rewrites apply as in the image build. A call of the device
tool carries 64 MiB with the checkout: --part-mib is 64 less the checkout's size less a margin.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path


def removed(name: str, paths: list[str]) -> bool:
    """Whether a wheel member lies at or under one of slim.json's site-relative paths."""
    return any(name == p or name.startswith(p.rstrip("/") + "/") for p in paths)


def slim_wheel(src: Path, dst: Path, paths: list[str]) -> int:
    """Copy wheel `src` to `dst` without the members `removed` names, RECORD without their lines; the bytes left
    out (uncompressed)."""
    dropped = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        gone = {i.filename for i in zin.infolist() if removed(i.filename, paths)}
        for info in zin.infolist():
            if info.filename in gone:
                dropped += info.file_size
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD") and gone:
                lines = [line for line in data.decode().splitlines() if line.split(",", 1)[0] not in gone]
                data = ("\n".join(lines) + "\n").encode()
            zout.writestr(info, data, compress_type=info.compress_type)
    return dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--part-mib", type=int, default=44)
    args = parser.parse_args(argv)
    paths = [p["path"] for p in json.loads((args.src / "slim.json").read_text())["paths"]]
    args.dst.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheels, slimmed, joined = Path(tmp, "in"), Path(tmp, "out"), Path(tmp, "stack.tar")
        wheels.mkdir()
        slimmed.mkdir()
        with joined.open("wb") as f:
            for part in sorted(args.src.glob("w.[0-9][0-9]")):
                with part.open("rb") as p:
                    shutil.copyfileobj(p, f)
        with tarfile.open(joined) as tf:
            tf.extractall(wheels, filter="data")
        joined.unlink()
        total = sum(slim_wheel(w, slimmed / w.name, paths) for w in sorted(wheels.rglob("*.whl")))
        print(f"removed {total / 2**20:.0f} MiB (uncompressed) by slim.json's paths")
        with tarfile.open(joined, "w") as tf:
            for w in sorted(slimmed.iterdir()):
                tf.add(w, arcname=f"./{w.name}")
        for old in args.dst.glob("w.[0-9][0-9]"):
            old.unlink()
        count = 0
        with joined.open("rb") as f:
            while chunk := f.read(args.part_mib << 20):
                (args.dst / f"w.{count:02d}").write_bytes(chunk)
                count += 1
    for name in ("install-stack.sh", "slim.json"):
        shutil.copy2(args.src / name, args.dst / name)
    print(f"parts: {count} of {args.part_mib} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
