"""docker/Dockerfile and compose.yaml agree with each other and with t4serve: one healthcheck start period, at least
the cold-start budget of the larger built-in model, and the ports EXPOSE declares are the settings' defaults."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from t4serve.config.aliases import MODEL_ALIASES
from t4serve.config.settings import VARIABLES_BY_NAME
from t4serve.probes.checkpoint import builtin_facts
from t4serve.supervise.startbudget import cold_start_budget

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
COMPOSE = REPO / "compose.yaml"
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def duration_s(text: str) -> float:
    """A Docker/compose duration ("1100s", "18m20s", "1h") in seconds; anything else fails the test."""
    parts = _DURATION_PART.findall(text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def dockerfile_instructions(name: str) -> list[str]:
    """The arguments of every `name` instruction of the Dockerfile (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line.split(None, 1)[1] for line in text.splitlines() if line.split(None, 1)[:1] == [name]]


def compose_service() -> dict[str, Any]:
    service: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]["t4serve"]
    return service


def dockerfile_start_period_s() -> float:
    (healthcheck,) = dockerfile_instructions("HEALTHCHECK")
    match = re.search(r"--start-period=(\S+)", healthcheck)
    assert match, healthcheck
    return duration_s(match.group(1))


def test_dockerfile_and_compose_share_one_start_period() -> None:
    compose_s = duration_s(str(compose_service()["healthcheck"]["start_period"]))
    assert dockerfile_start_period_s() == compose_s


def test_the_start_period_covers_the_cold_start_budget_of_every_builtin_model() -> None:
    budgets = {}
    for alias, repo in MODEL_ALIASES.items():
        facts = builtin_facts(repo, "start period test")
        assert facts is not None, alias
        budgets[alias] = cold_start_budget(facts.weight_bytes).total_seconds
    period = dockerfile_start_period_s()
    print(f"\nstart period {period:.0f} s; cold-start budgets: {budgets}")
    assert period >= max(budgets.values())


def test_exposed_ports_are_the_settings_defaults() -> None:
    exposed = {int(port.split("/")[0]) for args in dockerfile_instructions("EXPOSE") for port in args.split()}
    defaults = {int(VARIABLES_BY_NAME[name].default or 0) for name in ("T4SERVE_PORT", "T4SERVE_TELEMETRY_PORT")}
    assert exposed == defaults
    # compose publishes the same container ports ("127.0.0.1:${...:-8000}:8000").
    published = {int(str(mapping).rsplit(":", 1)[1]) for mapping in compose_service()["ports"]}
    assert published == exposed


@pytest.mark.parametrize(("text", "seconds"), [("1100s", 1100), ("15m", 900), ("18m20s", 1100), ("1h", 3600)])
def test_duration_parser(text: str, seconds: float) -> None:
    assert duration_s(text) == seconds


def test_the_runtime_environment_finds_gkes_driver_and_sends_no_usage_statistics() -> None:
    """GKE mounts the driver at /usr/local/nvidia (tests/image/test_cluster_env.py loads from it); vLLM's usage
    statistics are off. The last ENV that sets a name is the one the image has."""
    env: dict[str, str] = {}
    for args in dockerfile_instructions("ENV"):
        for name, value in re.findall(r"(\w+)=(\S+)", args):
            env[name] = value
    assert env["LD_LIBRARY_PATH"].split(":") == ["/usr/local/nvidia/lib", "/usr/local/nvidia/lib64"]
    assert env["PATH"] == "$PATH:/usr/local/nvidia/bin"
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1" and env["HF_HUB_DISABLE_TELEMETRY"] == "1"


def test_the_token_file_variant_is_compose_yaml_with_its_token_from_a_file() -> None:
    """compose.token-file.yaml is generated from compose.yaml (scripts/compose-token-file): the same service, the
    token secret from a host file (docker-compose 1.29 refuses compose.yaml's `environment:` secret)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(REPO / "scripts" / "compose-token-file")], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (REPO / "compose.token-file.yaml").read_text() == done.stdout, (
        "compose.token-file.yaml is out of date: `scripts/compose-token-file > compose.token-file.yaml`"
    )
    env_route = yaml.safe_load(COMPOSE.read_text())
    file_route = yaml.safe_load(done.stdout)
    assert env_route["secrets"] == {"hf_token": {"environment": "HF_TOKEN"}}
    assert file_route["secrets"] == {"hf_token": {"file": "${HF_TOKEN_SECRET_FILE:-./secrets/hf_token}"}}
    assert env_route["services"] == file_route["services"] and env_route["volumes"] == file_route["volumes"]
    # The token reaches the container as a file only: never in its environment (so never in `docker inspect`).
    environment = env_route["services"]["t4serve"]["environment"]
    assert "HF_TOKEN" not in environment and environment["HF_TOKEN_FILE"] == "/run/secrets/hf_token"
