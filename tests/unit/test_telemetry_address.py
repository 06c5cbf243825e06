"""T4SERVE_TELEMETRY_HOST: parsed by the settings, carried in the plan, rendered into supervisord.conf from the plan
by `serve`, bound by the port probe and checked by preflight (a valid address of this host, not the API's port)."""

from __future__ import annotations

import configparser
import dataclasses
import shlex
from pathlib import Path
from typing import Any

import pytest
from sample_facts import t4, with_host
from serve_here import serve_until_supervisord

from t4serve.cli import main
from t4serve.config.settings import Settings
from t4serve.errors import ConfigError
from t4serve.pipeline import ensure_model, listen_ports, prepare
from t4serve.planning.plan import plan
from t4serve.preflight import Finding, check_telemetry

BASE_ENV = {"HF_HOME": "/nonexistent-hf-home", "HF_TOKEN": "hf_testtoken"}


def settings(**env: str) -> Settings:
    return Settings.from_environ({**BASE_ENV, **env}, cwd="/")


def telemetry_finding(s: Settings, **host_changes: Any) -> Finding:
    facts = with_host(t4(), **host_changes)
    found = [f for f in prepare(s, ensure_model(s, facts))[1] if f.check == "telemetry"]
    assert len(found) == 1, found
    return found[0]


def test_default_all_addresses_and_a_host_only_choice() -> None:
    assert settings().telemetry_host == "0.0.0.0"
    assert settings(T4SERVE_TELEMETRY_HOST=" 127.0.0.1 ").telemetry_host == "127.0.0.1"
    assert settings(T4SERVE_TELEMETRY_HOST="::1").telemetry_host == "::1"


@pytest.mark.parametrize("bad", ["not an address", "1.5", "host:9400"])
def test_a_bad_address_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings(T4SERVE_TELEMETRY_HOST=bad)
    assert info.value.exit_code == 2
    assert f"T4SERVE_TELEMETRY_HOST={bad}: must be an IP address or a host name" in info.value.message()


def test_the_plan_carries_the_address_and_port() -> None:
    p = plan(settings(T4SERVE_TELEMETRY_HOST="127.0.0.1", T4SERVE_TELEMETRY_PORT="9500"), t4())
    assert (p.telemetry_host, p.telemetry_port) == ("127.0.0.1", 9500)
    assert "telemetry:         /metrics on 127.0.0.1:9500" in p.summary()
    assert p.to_dict()["telemetry_host"] == "127.0.0.1"
    off = plan(settings(T4SERVE_TELEMETRY_PORT="0"), t4())
    assert "telemetry:         off (T4SERVE_TELEMETRY_PORT=0)" in off.summary()


def test_the_port_probe_binds_the_telemetry_address() -> None:
    s = settings(T4SERVE_HOST="0.0.0.0", T4SERVE_TELEMETRY_HOST="127.0.0.1")
    assert listen_ports(s) == [("0.0.0.0", 8000), ("127.0.0.1", 9400)]


def test_preflight_passes_the_default_and_off() -> None:
    ok = telemetry_finding(settings())
    assert (ok.level, ok.found) == ("ok", "/metrics on 0.0.0.0:9400")
    off = telemetry_finding(settings(T4SERVE_TELEMETRY_PORT="0"))
    assert (off.level, off.found) == ("ok", "off (T4SERVE_TELEMETRY_PORT=0)")


def test_preflight_fails_an_address_this_host_cannot_bind() -> None:
    s = settings(T4SERVE_TELEMETRY_HOST="10.9.8.7")
    errors = {"10.9.8.7:9400": "[Errno 99] Cannot assign requested address"}
    finding = telemetry_finding(s, ports_in_use=[9400], port_bind_errors=errors)
    assert finding.level == "fail"
    assert finding.found == "/metrics cannot bind 10.9.8.7:9400: [Errno 99] Cannot assign requested address"
    assert "T4SERVE_TELEMETRY_HOST" in finding.fix


def test_a_port_in_use_is_left_to_the_port_check() -> None:
    errors = {"0.0.0.0:9400": "address already in use"}
    busy = telemetry_finding(settings(), ports_in_use=[9400], port_bind_errors=errors)
    assert busy.level == "ok"


def test_preflight_fails_a_plan_whose_telemetry_takes_the_api_port_or_a_bad_address() -> None:
    # Settings refuse both; a plan from elsewhere (edited, or replayed from JSON) is checked all the same.
    facts = t4()
    p = plan(settings(), facts)
    same = check_telemetry(dataclasses.replace(p, telemetry_port=p.port), facts.host)
    assert same.level == "fail" and "is the API's port (T4SERVE_PORT=8000)" in same.found
    bad = check_telemetry(dataclasses.replace(p, telemetry_host="no such\nhost"), facts.host)
    assert bad.level == "fail" and bad.found.startswith("T4SERVE_TELEMETRY_HOST=no such")
    assert "\n" not in bad.found


def test_serve_renders_the_plans_address_into_supervisord_conf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir, _ = serve_until_supervisord(
        tmp_path, monkeypatch, {"T4SERVE_TELEMETRY_HOST": "127.0.0.1", "T4SERVE_TELEMETRY_PORT": "9555"})
    assert main(["serve"]) == 0
    out = capsys.readouterr().out
    assert "telemetry:         /metrics on 127.0.0.1:9555" in out
    conf = configparser.ConfigParser(interpolation=None)
    conf.read_string((state_dir / "supervisord.conf").read_text())
    argv = shlex.split(conf["program:telemetry"]["command"])
    assert argv[-5:] == ["telemetry", "--host", "127.0.0.1", "--port", "9555"]
