"""Write the GPU tests' E2B checkpoints: DIR/bf16 and DIR/qat, sparse zero weights plus the tokenizer and the Gemma 4
processor files, so vLLM can start the full multimodal model (no --language-model-only needed).

    python3 tests/gpu/write_checkpoints.py DIR

Needs only the standard library (tests/unit/e2b_checkpoint.py writes everything; the processor files are the
checked-in copies transformers saved). Each checkpoint is written into a sibling temporary folder and renamed into
place, so an interrupted run leaves no half-written checkpoint behind.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from e2b_checkpoint import write_checkpoint

KINDS = ("bf16", "qat")


def write_all(root: str | Path) -> dict[str, Path]:
    """Write (or replace) root/bf16 and root/qat; returns kind -> checkpoint folder."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for kind in KINDS:
        final = root / kind
        tmp = root / f".{kind}.writing"
        shutil.rmtree(tmp, ignore_errors=True)
        write_checkpoint(tmp, kind, sparse=True, tokenizer=True, processor=True)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        out[kind] = final
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: write_checkpoints.py DIR  (writes DIR/bf16 and DIR/qat)", file=sys.stderr)
        return 2
    for kind, path in write_all(argv[0]).items():
        print(f"{kind}: {path} ({', '.join(sorted(p.name for p in path.iterdir()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
