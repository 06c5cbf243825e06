"""The Turing clamp inside the built image: the installed clamp proves itself, applying again writes nothing, and a
vLLM whose `_get_tile_size` moved fails the patch with exit 4 naming the version and what moved."""

from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.image

# Runs inside the container: where the image's vLLM keeps the kernel file the clamp patches.
FIND_TARGET = (
    'PY="$(dirname "$(command -v t4serve)")/python"; '
    'VLLM="$("$PY" -c \'import importlib.util as u; print(*u.find_spec("vllm").submodule_search_locations)\')"; '
    'TARGET="$VLLM/v1/attention/ops/triton_unified_attention.py"'
)
VERIFY_TIMEOUT_S = 600


def in_image(docker_bin: str, image_ref: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [docker_bin, "run", "--rm", "--entrypoint", "sh", image_ref, "-c", script],
        capture_output=True,
        text=True,
        timeout=VERIFY_TIMEOUT_S,
    )


def test_patch_verify_passes_in_the_image(docker_bin: str, image_ref: str) -> None:
    done = subprocess.run(
        [docker_bin, "run", "--rm", image_ref, "patch", "verify"],
        capture_output=True,
        text=True,
        timeout=VERIFY_TIMEOUT_S,
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    assert "2d/prefill/head512/tile16" in done.stdout
    assert "98,304 B" in done.stdout and "the clamp matters" in done.stdout
    assert "clamp proven for vLLM" in done.stdout


def test_patch_apply_again_is_a_no_op(docker_bin: str, image_ref: str) -> None:
    done = in_image(
        docker_bin,
        image_ref,
        f'{FIND_TARGET}; before="$(sha256sum "$TARGET")"; t4serve patch apply --proof-out /tmp/proof.json || exit $?; '
        'after="$(sha256sum "$TARGET")"; [ "$before" = "$after" ] && echo UNCHANGED; cat /tmp/proof.json',
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    assert "clamp already applied" in done.stdout and "nothing written" in done.stdout
    assert "UNCHANGED" in done.stdout
    assert '"state": "applied"' in done.stdout


def test_a_moved_get_tile_size_fails_with_exit_4(docker_bin: str, image_ref: str) -> None:
    done = in_image(
        docker_bin,
        image_ref,
        f"{FIND_TARGET}; ROOT=/tmp/moved/vllm; mkdir -p $ROOT/v1/attention/ops; "
        'cp "$VLLM/_version.py" $ROOT/; '
        'sed "s/_get_tile_size/_choose_tile_size/g" "$TARGET" > $ROOT/v1/attention/ops/triton_unified_attention.py; '
        "t4serve patch apply --vllm-root $ROOT",
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 4, (done.returncode, done.stderr)
    assert "_get_tile_size is missing" in done.stderr
    assert "the Turing clamp cannot be applied to vLLM 0.3" in done.stderr
    assert "fix:" in done.stderr
