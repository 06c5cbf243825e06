"""`t4serve serve`: settings -> facts -> plan -> preflight -> supervisord running vLLM, telemetry and the listener.

Order: the preflight table is printed and any failure refuses the start (exit 3) unless T4SERVE_PREFLIGHT=warn; the
resolved settings (secrets redacted) and the plan are logged; the run spec, the first state and supervisord.conf are
written atomically into the state directory (0600 for spec and config); HF_TOKEN and the API key (as VLLM_API_KEY)
go only into the environment supervisord inherits, never into those files. supervisord then runs under
t4serve.supervise.pid1, which reaps and sets the exit code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path

import click

from t4serve.atomic import write_atomic
from t4serve.config.options import settings_options
from t4serve.config.secrets import secret_environment
from t4serve.config.settings import Settings, with_model
from t4serve.errors import ConfigError, InternalError, PreflightError
from t4serve.supervise import pid1
from t4serve.supervise.render import SupervisorInputs, render_supervisord_conf, run_spec
from t4serve.supervise.state import (
    CONFIG_ERROR_FILE,
    EXIT_REQUEST_FILE,
    STATE_FILE,
    SUPERVISORD_CONF_FILE,
    new_state,
    write_run_spec,
    write_state,
)
from t4serve.untrusted import printable


def _say(text: str) -> None:
    print(f"t4serve: {text}", flush=True)


def child_environment(settings: Settings, environ: dict[str, str]) -> dict[str, str]:
    """The environment supervisord (and so vLLM) inherits: the secrets from HF_TOKEN_FILE and T4SERVE_API_KEY(_FILE)
    are put here and only here."""
    env = secret_environment(environ, hf_token=settings.hf_token, api_key=settings.api_key)
    # vLLM and huggingface_hub must look where the probes looked.
    env["HF_HOME"] = settings.hf_home
    return env


def with_model_argument(settings: Settings, model: str) -> Settings:
    """`settings` with the MODEL argument as T4SERVE_MODEL (over the variable, as a flag is); refused beside --model."""
    if settings.origins.get("T4SERVE_MODEL") == "flag":
        raise ConfigError(
            "the model is given twice: the MODEL argument and --model",
            found=f"MODEL argument {printable(model)[:200]!r} and --model {settings.model.requested!r}",
            required="one model: `t4serve serve MODEL` or `t4serve serve --model MODEL`",
            fix="drop one of the two",
        )
    chosen = with_model(settings, model, label="the MODEL argument")
    return dataclasses.replace(chosen, origins={**settings.origins, "T4SERVE_MODEL": "flag"})


@click.command("serve")
@click.argument("model_argument", metavar="[MODEL]", required=False)
@settings_options
def command(model_argument: str | None, settings: Settings) -> int:
    """Check the machine, size vLLM to it, and run it under supervision (the container's entrypoint).

    MODEL, as `vllm serve MODEL` takes it, is the same as --model (T4SERVE_MODEL)."""
    from t4serve.pipeline import gather_facts, prepare
    from t4serve.planning.plan import refuse_unreadable_model
    from t4serve.preflight import format_table, has_failures

    if model_argument is not None:
        settings = with_model_argument(settings, model_argument)

    started_at = time.time()
    # What an earlier run left in a state folder that outlived its container (as an emptyDir does across a container
    # restart) must not count for this one: its state would read "ready" while the probes run (absent says
    # "starting"), and its listener's exit request would decide this run's exit code.
    for leftover in (STATE_FILE, EXIT_REQUEST_FILE, CONFIG_ERROR_FILE):
        with contextlib.suppress(OSError):
            (Path(settings.state_dir) / leftover).unlink(missing_ok=True)
    facts = gather_facts(settings, os.environ)
    # Bad input, as in every command (exit 2, so T4SERVE_ON_CONFIG_ERROR=wait holds it), whatever T4SERVE_PREFLIGHT.
    refuse_unreadable_model(settings, facts.model)
    plan, findings = prepare(settings, facts)
    _say("preflight:\n" + format_table(findings))
    failures = [f for f in findings if f.level == "fail"]
    if has_failures(findings):
        if settings.preflight == "strict":
            first = failures[0]
            raise PreflightError(
                f"preflight failed ({len(failures)} check(s): {', '.join(f.check for f in failures)}); "
                f"not starting vLLM. First: {first.check}",
                found=first.found,
                required=first.required,
                fix=f"{first.fix} (or T4SERVE_PREFLIGHT=warn to start anyway)",
            )
        _say(f"T4SERVE_PREFLIGHT=warn: starting despite {len(failures)} failed check(s)")
    _say("settings:\n" + settings.summary())
    _say("plan:\n" + plan.summary())

    supervisord = shutil.which("supervisord")
    if supervisord is None:
        raise InternalError(
            "supervisord is not on PATH",
            found=f"PATH={os.environ.get('PATH', '')}",
            required="supervisord (the `supervisor` package, installed with vLLM in the image's venv)",
            fix="run the t4serve image, or `pip install supervisor` into the venv that holds t4serve",
        )
    state_dir = Path(settings.state_dir)
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        spec = run_spec(plan, settings)
        spec_path = write_run_spec(state_dir, spec)
        write_state(state_dir, new_state(spec, started_at=started_at))
        conf = render_supervisord_conf(
            SupervisorInputs(
                t4serve=(sys.executable, "-m", "t4serve"),
                state_dir=str(state_dir),
                spec_path=str(spec_path),
                shutdown_timeout=settings.shutdown_timeout,
                max_restarts=settings.max_restarts,
                restart_window=settings.restart_window,
                telemetry_host=plan.telemetry_host,
                telemetry_port=plan.telemetry_port,
            )
        )
        conf_path = state_dir / SUPERVISORD_CONF_FILE
        write_atomic(conf_path, conf, mode=0o600)
    except OSError as exc:
        # Preflight checks the folder's disk; a file in its place, a read-only mount or a full disk shows here.
        raise PreflightError(
            "cannot write t4serve's state folder",
            found=f"{exc.filename or state_dir}: {exc.strerror or exc}",
            required=f"a folder writable by uid {os.getuid()} at T4SERVE_STATE_DIR ({state_dir})",
            fix="point T4SERVE_STATE_DIR at a writable folder (the default /tmp/t4serve), or mount one there",
        ) from None
    _say(f"starting supervisord with {conf_path} (vllm, {'telemetry, ' if plan.telemetry_port else ''}listener)")
    return pid1.run([supervisord, "-n", "-c", str(conf_path)], state_dir, child_environment(settings, dict(os.environ)))
