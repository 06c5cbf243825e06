"""The README as a newcomer meets it (issue 45): what t4serve is in one sentence, the two commands, `t4serve host-check`
first, then a chat request; its figures and quoted messages the tool's own; compose.yaml and the README agreeing with
what the published T4 VM's facts plan (QAT needs swap there too). The commands themselves run in
tests/image/test_readme_first_run.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from t4serve.config.settings import Settings
from t4serve.facts import Facts
from t4serve.pipeline import ensure_model
from t4serve.planning.plan import plan
from t4serve.preflight import IMAGE_BYTES
from t4serve.units import GIB

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
COMPOSE = (REPO / "compose.yaml").read_text(encoding="utf-8")
PUBLISHED_FACTS = REPO / "entrypoint" / "t4serve" / "data" / "facts" / "t4-published.json"
ENTRYPOINT_TEXT = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "entrypoint" / "t4serve").rglob("*.py"))
# Messages the troubleshooting quotes that others print: Docker, the kernel, vLLM, torch, the clamp's Triton check.
OTHERS_MESSAGES = (
    'could not select device driver "nvidia"',
    "no space left on device",
    "Out of memory: Killed process ... (VLLM::EngineCor)",
    "Hardware limit: 65536",
    "CUDA out of memory",
    "InductorError: OutOfMemoryError",
    "No available memory for the cache blocks",
    "Free memory on device ... is less than desired",
)


def sections() -> list[str]:
    return re.findall(r"^## (.+)$", README, re.MULTILINE)


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else len(README)]


def test_it_opens_with_what_t4serve_is_then_the_two_commands_host_check_and_a_chat_request() -> None:
    opening = README.split("\n## ", 1)[0]
    assert opening.startswith("# t4serve\n\n")
    sentence = " ".join(opening.split("\n", 2)[2].split())
    assert sentence.count(". ") == 0 and sentence.endswith("."), "one plain sentence"
    assert "Stock vLLM fails on a Tesla T4" in sentence and "makes it run" in sentence and "sizes" in sentence
    assert sections()[:4] == ["The two commands", "On a new host: `t4serve host-check` first", "First run",
                              "A chat request"]  # fmt: skip
    two = section("The two commands")
    assert re.search(r"^\| run \| `HF_TOKEN=hf_\.\.\. docker compose up` \|", two, re.MULTILINE)
    assert re.search(r"^\| test \| `scripts/test` \|", two, re.MULTILINE)


def test_the_first_run_runs_host_check_before_compose() -> None:
    block = re.findall(r"```\n(.*?)```", section("First run"), re.DOTALL)[0].splitlines()
    assert block[0] == "python3 -m venv .venv && .venv/bin/pip install -q ."
    assert block[1].startswith(".venv/bin/t4serve host-check && ") and block[1].endswith("docker compose up")
    assert "chown" not in block[1], "the env-secret route needs no token file"


def test_the_chat_request_needs_no_model_name() -> None:
    request = re.findall(r"```\n(.*?)```", section("A chat request"), re.DOTALL)[0]
    assert "/v1/chat/completions" in request and '"messages"' in request and '"model"' not in request


def _published_swap_gib(model: str) -> int:
    settings = Settings.from_environ({"T4SERVE_MODEL": model, "HF_HUB_OFFLINE": "1"})
    facts = ensure_model(settings, Facts.from_json(PUBLISHED_FACTS.read_text(encoding="utf-8")))
    sizing = plan(settings, facts).sizing
    assert sizing is not None
    return -(-int(sizing.swap_to_add_bytes.value) // GIB)


def test_the_docs_say_what_the_published_vm_plans_for_the_qat_default() -> None:
    """Issue 45, item 1: compose.yaml said QAT "fits a 7.8 GB host without swap" and the README offered "keep the QAT
    default" to avoid swap, while the published T4 VM's facts fail preflight for QAT (4.6 GiB short) and the published
    run swapped 4,770 MiB with it. The sizing stays as it is; the docs follow it."""
    qat, bf16 = _published_swap_gib("qat"), _published_swap_gib("bf16")
    assert qat > 0 and bf16 > qat
    assert f"`sudo scripts/setup-swap {qat}G` for QAT, `{bf16}G` for bf16" in README
    assert f"its facts plan {qat} and {bf16} GiB to add" in README
    for text in (README, COMPOSE):
        assert "without swap" not in text and "keep the QAT default" not in text and "or the QAT checkpoint" not in text
    assert "On a 7.8 GB host even QAT needs swap" in COMPOSE


def test_the_image_size_is_the_measured_one() -> None:
    assert f"{IMAGE_BYTES / 1e9:.2f} GB on Docker's data root for the image" in README
    assert "6.6 GB" not in README


@pytest.mark.parametrize("phrase", ["in one command", "with the compose CI has", "no NVIDIA GPU visible",
                                    "`host-check`, `mcp` | on the host (`pip install .`"])  # fmt: skip
def test_the_lines_issue_45_found_wrong_are_gone(phrase: str) -> None:
    assert phrase not in README


def test_each_quoted_message_is_one_t4serve_or_another_program_prints() -> None:
    quotes = re.findall(r"^- `([^`]+)`", section("Troubleshooting"), re.MULTILINE)
    assert len(quotes) >= 8
    for quote in quotes:
        if quote in OTHERS_MESSAGES:
            continue
        assert quote in ENTRYPOINT_TEXT, f"the README quotes {quote!r}, which t4serve never prints"


def test_mcp_installs_its_extra_and_host_check_is_the_plain_install() -> None:
    commands = section("Commands")
    assert "| `mcp` | on the host (`pip install '.[mcp]'`" in commands
    assert "| `host-check` | on the host (`pip install .`)" in commands


def test_gitignore_covers_bench_folders_and_the_secrets_and_names_a_readme_section_that_exists() -> None:
    for path in ("bench-20261201-120000/report.md", "secrets/hf_token"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, check=False)
        assert ignored.returncode == 0, f"{path} is not ignored"
    for name in re.findall(r"\(README, ([^)]+)\)", (REPO / ".gitignore").read_text(encoding="utf-8")):
        assert name in sections(), f".gitignore names the README section {name!r}, which does not exist"


def test_the_scripts_tests_side_effects_and_durations_are_said() -> None:
    tests = section("Tests and what was verified")
    assert "installs Debian's docker.io and starts dockerd" in tests and "as root" in tests
    assert "about 10" in tests and "about 35" in tests


def test_the_chat_request_as_written_is_answered(tmp_path: Path) -> None:
    """The README's curl line, run by bash against the stand-in for `vllm serve` (tests/standin: vLLM 0.33's chat
    route, where `model` may be left out) on a free port in place of 8000."""
    from test_bench_runner import start_standin

    request = re.findall(r"```\n(.*?)```", section("A chat request"), re.DOTALL)[0]
    url, proc = start_standin({})
    try:
        command = request.replace("127.0.0.1:8000", url.removeprefix("http://"))
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["model"] == "served-qat"
