"""The image's entrypoint rule and docker-library's image conventions, run against the built image (no GPU).

`docker run IMAGE ARG...` runs `t4serve ARG...`; a first argument that is no t4serve command runs as a program in
t4serve's place (official-images' `override-cmd`: `docker run IMAGE echo hi` prints hi). Also its `utc` test (`date`
prints UTC) and `no-hard-coded-passwords` (no account in /etc/passwd or /etc/shadow has a crypt password).
"""

from __future__ import annotations

import uuid

import pytest

from .conftest import RunInImage

pytestmark = pytest.mark.image


def test_a_program_overrides_the_command(run_in_image: RunInImage) -> None:
    hello = f"Hello world-{uuid.uuid4().hex[:8]}"
    out = run_in_image("echo", hello)
    assert (out.returncode, out.stdout, out.stderr) == (0, hello + "\n", ""), out


def test_the_program_replaces_t4serve_as_pid_1(run_in_image: RunInImage) -> None:
    out = run_in_image("sh", "-c", 'echo "$$ $0"; exit 7')
    assert out.returncode == 7, out.stderr
    assert out.stdout.split() == ["1", "sh"]


def test_bash_gives_a_shell(run_in_image: RunInImage) -> None:
    out = run_in_image("bash", "-c", "echo ${BASH_VERSION%%.*}; id -un")
    assert out.returncode == 0, out.stderr
    major, user = out.stdout.split()
    assert major.isdigit() and user == "t4serve"


def test_t4serve_by_name_and_its_commands_still_work(run_in_image: RunInImage) -> None:
    out = run_in_image("t4serve", "--help")
    assert out.returncode == 0, out.stderr
    assert "serve" in out.stdout and "healthcheck" in out.stdout
    # `env` is t4serve's command (its settings table), not /usr/bin/env's NAME=VALUE listing.
    out = run_in_image("env")
    assert out.returncode == 0, out.stderr
    assert "T4SERVE_MODEL" in out.stdout and "default:" in out.stdout
    assert not any(line.startswith("PATH=") for line in out.stdout.splitlines())
    out = run_in_image("--version")
    assert out.returncode == 0 and "t4serve" in out.stdout, out.stderr


def test_neither_command_nor_program_is_a_usage_error(run_in_image: RunInImage) -> None:
    out = run_in_image("no-such-program-anywhere")
    assert out.returncode == 2, out
    assert "No such command 'no-such-program-anywhere'" in out.stderr and "fix:" in out.stderr
    assert "Traceback" not in out.stderr


def test_date_prints_utc(run_in_image: RunInImage) -> None:
    for out in (run_in_image("+%Z", entrypoint="date"), run_in_image("date", "+%Z")):
        assert (out.returncode, out.stdout.strip()) == (0, "UTC"), out


def test_no_hard_coded_passwords(run_in_image: RunInImage) -> None:
    """Every account's password field (its /etc/shadow field where /etc/passwd says `x`) is empty, `*` (no password)
    or `!...` (locked); a `$id$salt$hash` field is a password baked into the image."""
    passwd = run_in_image("/etc/passwd", entrypoint="cat", user="0:0")
    shadow = run_in_image("/etc/shadow", entrypoint="cat", user="0:0")
    assert passwd.returncode == 0 and shadow.returncode == 0, (passwd.stderr, shadow.stderr)
    fields = {line.split(":")[0]: line.split(":")[1] for line in passwd.stdout.splitlines() if line}
    shadowed = {line.split(":")[0]: line.split(":")[1] for line in shadow.stdout.splitlines() if line}
    assert "t4serve" in fields and "root" in fields
    for user, field in fields.items():
        password = shadowed.get(user, "") if field == "x" else field
        assert password in ("", "*") or password.startswith("!"), f"{user} has a password: {password[:3]}..."


def test_options_after_the_image_name_are_serves(run_in_image: RunInImage) -> None:
    """`docker run IMAGE --max-model-len ...`, as vLLM's and TGI's images take server flags: serve's own option
    handling answers (a bad value names the variable; a good one gets serve as far as this GPU-less host allows)."""
    out = run_in_image("--max-model-len", "nope")
    assert out.returncode == 2, out
    assert "T4SERVE_MAX_MODEL_LEN=nope (from --max-model-len): must be" in out.stderr
    out = run_in_image("--max-model-len", "4096", "--gpu-memory-utilization", "0.8", timeout=180)
    text = out.stdout + out.stderr
    assert out.returncode == 3, text  # serve ran: its preflight finds no GPU here
    assert "preflight failed" in text and "Traceback" not in text
    out = run_in_image("--tensor-parallel-size", "2")
    assert out.returncode == 2, out
    assert "a `vllm serve` flag t4serve refuses: t4serve serves one GPU" in out.stderr
    out = run_in_image("--enable-prefix-caching")
    assert out.returncode == 2, out
    assert "--vllm-args '--enable-prefix-caching ...'" in out.stderr


def test_host_check_in_the_image_says_it_runs_on_the_host(run_in_image: RunInImage) -> None:
    """Its failed check (exit 3, as any failed host check) says where the command runs, not "install Docker"."""
    out = run_in_image("host-check")
    text = out.stdout + out.stderr
    assert out.returncode == 3, out
    assert "docker: no such command inside this container (/.dockerenv)" in text
    assert "are host-side commands: run them on the host, not in the image" in text and "`pip install .`" in text
    assert "install Docker" not in text and "Traceback" not in text
