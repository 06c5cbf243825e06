"""Plan -> what the supervised programs run: the run spec for the vLLM wrapper and the supervisord.conf text.

Pure: `run_spec(plan, settings)` and `render_supervisord_conf(...)` read nothing. Values are shell-quoted as
supervisord's shlex split expects, and every `%` is doubled because supervisord expands `%(name)s` in values.
Secrets never appear here: HF_TOKEN and VLLM_API_KEY reach vLLM only through the environment supervisord inherits.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from t4serve.config.compilation import ladder_for
from t4serve.config.settings import Settings
from t4serve.errors import ConfigError
from t4serve.planning.derived import Derived
from t4serve.planning.plan import Plan
from t4serve.planning.sizing import Sizing
from t4serve.supervise.state import Prediction, RunSpec
from t4serve.units import GIB
from t4serve.untrusted import Untrusted, check_text, printable

# Seconds beyond vLLM's own drain for its engine to shut down before supervisord resorts to SIGKILL.
STOP_MARGIN_S = 30
# vLLM must stay up this long to count as started; a quicker death is a failed start (BACKOFF, then FATAL).
VLLM_STARTSECS = 10



def predicted_figures(sizing: Sizing) -> dict[str, Derived]:
    """The plan's sizing figures under the names vLLM's log gives them (t4serve.supervise.logwatch)."""
    return {
        "kv_tokens": sizing.kv_tokens,
        "max_concurrency": sizing.concurrency,
        "max_model_len": sizing.max_model_len,
        "model_memory_gib": sizing.gpu_weights_bytes,
        "kv_cache_memory_gib": sizing.kv_pool_bytes,
    }


def predictions(figures: dict[str, Derived] | None) -> dict[str, Prediction]:
    """The sizing figures vLLM will also log, as predictions to compare against (none when sizing is absent).
    Byte figures that vLLM logs in GiB are converted to GiB."""
    out: dict[str, Prediction] = {}
    for name, derived in (figures or {}).items():
        value, unit = float(derived.value), derived.unit
        if name.endswith("_gib") and unit == "B":
            value, unit = value / GIB, "GiB"
        out[name] = Prediction(name, value, unit, derived.how)
    return out


def run_spec(plan: Plan, settings: Settings) -> RunSpec:
    """What the wrapper needs from the plan and the settings."""
    return RunSpec(
        argv=list(plan.argv),
        env=dict(plan.env),
        model=plan.model,
        served_model_name=plan.served_model_name,
        host=plan.host,
        port=int(plan.port),
        dtype=plan.dtype,
        shutdown_timeout=int(settings.shutdown_timeout),
        canary=bool(settings.canary),
        gpu_name=plan.gpu.name if plan.gpu is not None else None,
        hf_hub_cache=f"{settings.hf_home.rstrip('/')}/hub",
        cache_dir=settings.cache_dir,
        predictions=predictions(None if plan.sizing is None else predicted_figures(plan.sizing)),
        compile_ladder=[[rung.name, *rung.flags] for rung in ladder_for(settings.compile, settings.vllm_args)],
        speculative=settings.speculative,
    )


def conf_value(text: str) -> str:
    """A value as supervisord reads it back: `%` doubled (it expands `%(here)s`-style names in values), and one line
    (a newline would start a line of its own, e.g. a `[program:...]` section): settings refuse control characters in
    paths, and this refuses whatever else would carry one."""
    try:
        check_text(text, "a value of supervisord.conf")
    except Untrusted as exc:
        raise ConfigError(
            f"cannot write supervisord.conf: {exc.reason}",
            found=printable(text),
            required="values of one line without control characters",
            fix="remove the control character from the setting that gives this path or flag",
        ) from None
    return text.replace("%", "%%")


def conf_command(argv: Sequence[str]) -> str:
    return conf_value(shlex.join(argv))


@dataclass(frozen=True)
class SupervisorInputs:
    # How to call t4serve inside the image, e.g. ["/opt/venv/bin/t4serve"].
    t4serve: tuple[str, ...]
    state_dir: str
    spec_path: str
    shutdown_timeout: int
    max_restarts: int
    restart_window: int
    telemetry_host: str
    # 0 disables the telemetry program.
    telemetry_port: int


def render_supervisord_conf(inputs: SupervisorInputs) -> str:
    t4 = list(inputs.t4serve)
    stop_wait = inputs.shutdown_timeout + STOP_MARGIN_S
    sections = [
        "; Rendered by `t4serve serve` from the plan; regenerated at every start, do not edit.",
        "[supervisord]",
        "nodaemon=true",
        # In nodaemon mode supervisord logs its own lines to stdout already; a log file would only duplicate them.
        "logfile=/dev/null",
        "logfile_maxbytes=0",
        f"pidfile={conf_value(inputs.state_dir)}/supervisord.pid",
        f"childlogdir={conf_value(inputs.state_dir)}",
        "loglevel=info",
        "",
        "[program:vllm]",
        f"command={conf_command([*t4, 'run-vllm', '--spec', inputs.spec_path])}",
        "autostart=true",
        # Every exit of a server is a failure to serve; the listener decides when restarts have gone on too long.
        "autorestart=true",
        f"startsecs={VLLM_STARTSECS}",
        f"startretries={inputs.max_restarts}",
        "stopsignal=TERM",
        # Only the wrapper gets SIGTERM (it passes it to vLLM's API server, which drains and then stops its engine in
        # order); the whole group gets SIGKILL if anything outlives stopwaitsecs.
        "stopasgroup=false",
        "killasgroup=true",
        f"stopwaitsecs={stop_wait}",
        "redirect_stderr=true",
        "stdout_logfile=/dev/stdout",
        "stdout_logfile_maxbytes=0",
    ]
    if inputs.telemetry_port:
        sections += [
            "",
            "[program:telemetry]",
            "command="
            + conf_command([*t4, "telemetry", "--host", inputs.telemetry_host, "--port", str(inputs.telemetry_port)]),
            "autostart=true",
            # Exit 0 means "no NVML here, said so": leave it stopped. Any other exit is a crash worth a restart.
            "autorestart=unexpected",
            "exitcodes=0",
            "startsecs=0",
            "stopsignal=TERM",
            "stopwaitsecs=5",
            "redirect_stderr=true",
            "stdout_logfile=/dev/stdout",
            "stdout_logfile_maxbytes=0",
        ]
    listener_argv = [
        *t4,
        "listener",
        "--state-dir",
        inputs.state_dir,
        "--max-restarts",
        str(inputs.max_restarts),
        "--restart-window",
        str(inputs.restart_window),
    ]
    sections += [
        "",
        "[eventlistener:listener]",
        f"command={conf_command(listener_argv)}",
        "events=PROCESS_STATE_EXITED,PROCESS_STATE_FATAL",
        "autostart=true",
        "autorestart=true",
        "startsecs=0",
        # stdout is the listener protocol channel; only stderr is a log.
        "stderr_logfile=/dev/stderr",
        "stderr_logfile_maxbytes=0",
        "",
    ]
    return "\n".join(sections)
