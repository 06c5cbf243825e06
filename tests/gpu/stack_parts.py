"""The image's Python stack as parts a device call can carry to a GPU host that has Python 3.12 and the NVIDIA driver
but no package index (tests/gpu/gpu-host.sh installs them with tests/gpu/install-stack.sh).

    python3 tests/gpu/stack_parts.py make OUT [--part-mib 44]     # from docker/requirements.lock, here
    python3 tests/gpu/stack_parts.py slim IN OUT [--part-mib 44]  # parts made before: take slim.json's paths out

`make` downloads, for CPython 3.12 on manylinux x86-64, one wheel per pin of docker/requirements.lock except what
docker/slim.json removes as distributions and the NVIDIA libraries such a host's torch install already carries
(HOST_HAS), removes slim.json's paths from the wheels themselves (each RECORD rewritten to match), and writes OUT/w.00
... w.NN (a tar of the wheels, split), install-stack.sh and slim.json. For vLLM 0.34.0: 165 wheels, 26 parts of 44
MiB (32 before the paths came out: 665 MiB less uncompressed). The image is Python 3.13; these are the same versions
built for 3.12. A call of the device tool carries 64 MiB with the checkout: --part-mib is 64 less the checkout's
size less a margin. `slim` does the second half to parts made without it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# NVIDIA libraries a GPU host with torch 2.11.0+cu130 already has in a version the image's torch loads.
HOST_HAS = {"nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cudnn-cu13",
            "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse",
            "nvidia-cusparselt-cu13", "nvidia-nvjitlink", "nvidia-nvshmem-cu13", "cuda-toolkit",
            "opencv-python-headless"}
MANYLINUX = ("2_39", "2_35", "2_34", "2_31", "2_28", "2_27", "2_24", "2_18", "2_17", "2014", "2_5", "1")


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


def pins(lock: Path, spec: dict[str, object]) -> list[str]:
    """`name==version` of every pin in the lock but slim.json's distributions and HOST_HAS."""
    skip = HOST_HAS | {str(d["name"]) for d in spec["distributions"]}  # type: ignore[index, union-attr]
    out = []
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line)
        if m and m.group(1).lower() not in skip:
            out.append(f"{m.group(1)}=={m.group(2)}")
    return out


def download(requirements: list[str], into: Path) -> None:
    platforms = [f"manylinux{p}_x86_64" if p in ("2014", "1") else f"manylinux_{p}_x86_64" for p in MANYLINUX]
    req = into / "requirements.txt"
    req.write_text("\n".join(requirements) + "\n")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *(a for p in platforms for a in ("--platform", p)), "-d", str(into),
           "-r", str(req)]
    subprocess.run(cmd, check=True)
    req.unlink()


def write_parts(wheels: list[Path], out: Path, part_mib: int, paths: list[str], slim_json: Path) -> None:
    """Slim each wheel, tar them, split the tar into OUT/w.NN, and put install-stack.sh and slim.json beside."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        slimmed, joined = Path(tmp, "wheels"), Path(tmp, "stack.tar")
        slimmed.mkdir()
        total = sum(slim_wheel(w, slimmed / w.name, paths) for w in sorted(wheels))
        print(f"{len(wheels)} wheels; removed {total / 2**20:.0f} MiB (uncompressed) by slim.json's paths")
        with tarfile.open(joined, "w") as tf:
            for w in sorted(slimmed.iterdir()):
                tf.add(w, arcname=f"./{w.name}")
        for old in out.glob("w.[0-9][0-9]"):
            old.unlink()
        count = 0
        with joined.open("rb") as f:
            while chunk := f.read(part_mib << 20):
                (out / f"w.{count:02d}").write_bytes(chunk)
                count += 1
    shutil.copy2(REPO / "tests" / "gpu" / "install-stack.sh", out / "install-stack.sh")
    if slim_json.resolve() != (out / "slim.json").resolve():
        shutil.copy2(slim_json, out / "slim.json")
    print(f"parts: {count} of {part_mib} MiB in {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make", help="download the lock's wheels and write the parts")
    make.add_argument("out", type=Path)
    make.add_argument("--part-mib", type=int, default=44)
    slim = sub.add_parser("slim", help="take slim.json's paths out of parts made before")
    slim.add_argument("src", type=Path)
    slim.add_argument("out", type=Path)
    slim.add_argument("--part-mib", type=int, default=44)
    args = parser.parse_args(argv)
    slim_json = REPO / "docker" / "slim.json"
    spec = json.loads(slim_json.read_text())
    paths = [p["path"] for p in spec["paths"]]
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp)
        if args.command == "make":
            download(pins(REPO / "docker" / "requirements.lock", spec), wheels)
        else:
            with tempfile.TemporaryFile() as joined:
                for part in sorted(args.src.glob("w.[0-9][0-9]")):
                    with part.open("rb") as p:
                        shutil.copyfileobj(p, joined)
                joined.seek(0)
                with tarfile.open(fileobj=joined) as tf:
                    tf.extractall(wheels, filter="data")
        write_parts(sorted(wheels.rglob("*.whl")), args.out, args.part_mib, paths, slim_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
