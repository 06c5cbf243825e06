"""Every setting t4serve reads, from one table: environment variable, click option, default, doc, parser.

`Settings.from_environ(environ)` parses and validates the whole table once into a frozen `Settings` (a bad value is a
`ConfigError`, exit 2, naming the variable, the value found, what is accepted and an example). The same table makes
the shared click options (`settings_options`) and the README's environment table (`markdown_table`).
"""

from __future__ import annotations

import functools
import math
import os
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import click

from t4serve import compilation, untrusted
from t4serve.aliases import BF16_REPO, MODEL_ALIASES, QAT_REPO
from t4serve.errors import ConfigError
from t4serve.gpus import KNOWN_GPUS, known_gpu

DTYPES = ("auto", "float16", "bfloat16", "float32")
# vLLM's own spellings of the same dtypes, accepted and normalised so the plan compares one name.
_DTYPE_SYNONYMS = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32", "fp32": "float32"}
PREFLIGHT_MODES = ("strict", "warn")
LOG_LEVELS = ("debug", "info", "warning", "error")
# huggingface_hub's own truth table (constants.ENV_VARS_TRUE_VALUES), so t4serve and the hub never disagree.
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

# Flags of `vllm serve` that t4serve sets itself, and the variable that controls each. A user flag that repeats one
# would either be overridden or override the plan silently, so it is refused with the variable to use instead.
CONTROLLED_FLAGS: dict[str, str] = {
    "--model": "T4SERVE_MODEL",
    "--host": "T4SERVE_HOST",
    "--port": "T4SERVE_PORT",
    "--served-model-name": "T4SERVE_SERVED_MODEL_NAME",
    "--dtype": "T4SERVE_DTYPE",
    "--max-model-len": "T4SERVE_MAX_MODEL_LEN",
    "--max-num-seqs": "T4SERVE_MAX_NUM_SEQS",
    # The sliding-window KV groups and the activation peak are sized for it, so the plan owns it.
    "--max-num-batched-tokens": "T4SERVE_MAX_NUM_BATCHED_TOKENS",
    "--gpu-memory-utilization": "T4SERVE_GPU_MEMORY_UTILIZATION",
    "--kv-cache-memory-bytes": "T4SERVE_KV_CACHE_MEMORY_BYTES",
    "--shutdown-timeout": "T4SERVE_SHUTDOWN_TIMEOUT",
    "--download-dir": "HF_HOME",
    # Secrets (SECRET_FLAGS): each travels only in the vLLM process's environment, never on its command line.
    "--hf-token": "HF_TOKEN or HF_TOKEN_FILE",
    "--api-key": "T4SERVE_API_KEY_FILE or T4SERVE_API_KEY",
}
# On a command line a secret would show in `ps`, in /proc/PID/cmdline and in t4serve's plan; refusing one also keeps
# its value out of the refusal's own message.
SECRET_FLAGS = ("--hf-token", "--api-key")
# Flags t4serve fixes with no variable: why each is fixed is part of the error.
FIXED_FLAGS: dict[str, str] = {
    "--kv-cache-dtype": "t4serve sets --kv-cache-dtype auto: its KV cache sizing assumes the model dtype",
    "--tensor-parallel-size": "t4serve serves one GPU (--tensor-parallel-size 1)",
    "-tp": "t4serve serves one GPU (--tensor-parallel-size 1)",
    "--pipeline-parallel-size": "t4serve serves one GPU and sizes the KV cache for it (no pipeline parallelism)",
    "-pp": "t4serve serves one GPU and sizes the KV cache for it (no pipeline parallelism)",
    "--data-parallel-size": "t4serve serves one GPU per container (run one container per GPU for data parallelism)",
    "-dp": "t4serve serves one GPU per container (run one container per GPU for data parallelism)",
    "--quantization": "t4serve sizes the weights from the checkpoint as it is; pick a quantized checkpoint with "
    "T4SERVE_MODEL (qat) instead",
    "-q": "t4serve sizes the weights from the checkpoint as it is; pick a quantized checkpoint with T4SERVE_MODEL",
    "--cpu-offload-gb": "t4serve sizes the weights as held in GPU memory; offloading makes its KV sizing wrong",
    "--num-gpu-blocks-override": "t4serve sizes the KV cache itself; use T4SERVE_KV_CACHE_MEMORY_BYTES instead",
    # A YAML config can set any flag above where no check sees it.
    "--config": "a YAML config could set t4serve's flags unseen; put the flags themselves in T4SERVE_VLLM_ARGS",
}

_REPO_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"^{_REPO_PART}/{_REPO_PART}$")
_SIZE = re.compile(r"^\s*(\d{1,19}(?:\.\d{1,19})?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
# No GPU holds a pebibyte: a larger size is a typo, and would overflow the float arithmetic of sizing.
MAX_SIZE_BYTES = 2**50
# Values of these flags that make the plan's sizing meaningless (a dummy load has no weights to size).
REFUSED_FLAG_VALUES: dict[str, dict[str, str]] = {
    "--load-format": {"dummy": "--load-format dummy serves random weights: t4serve's canary and sizing need real ones"},
}
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def secret_environment(
    environ: Mapping[str, str], *, hf_token: Secret | None, api_key: Secret | None
) -> dict[str, str]:
    """`environ` with the secrets put where the server's processes read them: the one place a secret is revealed into
    an environment (never argv). HF_TOKEN for huggingface_hub, HF_TOKEN_FILE dropped (both set is a settings error for
    any t4serve command a child runs; the hub reads HF_TOKEN anyway); VLLM_API_KEY, which vLLM's /v1 guard checks
    (vllm/entrypoints/serve/middleware/register.py) and the canary sends."""
    env = dict(environ)
    if hf_token is not None:
        env["HF_TOKEN"] = hf_token.reveal()
        env.pop("HF_TOKEN_FILE", None)
    if api_key is not None:
        env["VLLM_API_KEY"] = api_key.reveal()
    return env


class Secret:
    """A string that never shows itself: repr, str and format print a placeholder; `reveal()` is the only way in."""

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        self._value = value
        self.source = source

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret(<redacted>, from {self.source})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value and other.source == self.source

    def __hash__(self) -> int:
        return hash(("Secret", self.source))

    def __reduce__(self) -> Any:
        # Pickling would write the token to wherever the pickle goes; nothing in t4serve needs it.
        raise TypeError("a Secret cannot be pickled")


REDACTED = "<redacted>"


@dataclass(frozen=True)
class ModelChoice:
    """What T4SERVE_MODEL named: an alias, an HF repo id, or a local directory (made absolute)."""

    requested: str
    kind: str  # "alias", "repo", "local"
    # The repo id (aliases expanded) or the absolute local directory: what the model probe resolves.
    target: str

    @property
    def repo_id(self) -> str | None:
        return None if self.kind == "local" else self.target


class _Invalid(Exception):
    """Raised by a parser: `reason` completes "NAME=VALUE: must be ...", `example` is a value that would work."""

    def __init__(self, reason: str, example: str, fix: str | None = None, shown: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.example = example
        # Replaces the generic "set NAME=example" where a better fix is known.
        self.fix = fix
        # Replaces the raw value in the message where it holds a secret.
        self.shown = shown


@dataclass(frozen=True)
class _Context:
    environ: Mapping[str, str]
    cwd: Path


@dataclass(frozen=True)
class Variable:
    """One row of the settings table."""

    name: str
    field: str
    # The default as a user would write it; None means "unset" (auto, or derived from other settings).
    default: str | None
    # What the default means, for --help, the README and summary().
    default_doc: str
    doc: str
    parse: Callable[[str, _Context], Any]
    example: str
    option: str | None = None
    secret: bool = False
    # Computes the default from the environment when it depends on it (HF_HOME follows XDG_CACHE_HOME like the hub).
    default_from: Callable[[_Context], Any] | None = None

    @property
    def param(self) -> str:
        return f"setting_{self.field}"


# Parsers: each takes the raw string and returns the typed value or raises _Invalid.


def _int_in(lo: int, hi: int | None, example: int) -> Callable[[str, _Context], int]:
    def parse(raw: str, ctx: _Context) -> int:
        try:
            return untrusted.parse_int(raw, lo, untrusted.MAX_SETTING_INT if hi is None else hi)
        except untrusted.Untrusted as exc:
            raise _Invalid(exc.reason, str(example)) from None

    return parse


def _auto_or_int(lo: int, example: int, hi: int | None = None) -> Callable[[str, _Context], int | None]:
    inner = _int_in(lo, hi, example)

    def parse(raw: str, ctx: _Context) -> int | None:
        if raw.strip().lower() == "auto":
            return None
        try:
            return inner(raw, ctx)
        except _Invalid as exc:
            raise _Invalid(f'must be "auto" or {exc.reason.removeprefix("must be ")}', str(example)) from None

    return parse


def _utilization(raw: str, ctx: _Context) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise _Invalid("must be a number in (0, 1]", "0.9") from None
    if not math.isfinite(value) or not 0 < value <= 1:
        raise _Invalid("must be a number in (0, 1]", "0.9")
    return value


def parse_size(raw: str) -> int:
    """Bytes from "2684354560", "2.5GiB", "2.5 GB" (decimal KB/MB/GB/TB, binary KiB/MiB/GiB/TiB)."""
    match = _SIZE.match(raw)
    if not match:
        raise ValueError(raw)
    number, unit = match.groups()
    # Decimal, so "2.3GB" is exactly 2,300,000,000 bytes and "1.5" (not a whole byte) is refused, not rounded.
    value = Decimal(number) * _SIZE_UNITS[(unit or "B").lower()]
    if value < 1 or value > MAX_SIZE_BYTES or value != value.to_integral_value():
        raise ValueError(raw)
    return int(value)


KV_PROFILE = "profile"


def _kv_cache_size(raw: str, ctx: _Context) -> int | str | None:
    value = raw.strip().lower()
    if value == "auto":
        return None
    if value == KV_PROFILE:
        return KV_PROFILE
    try:
        return parse_size(raw)
    except ValueError:
        raise _Invalid(
            'must be "auto", "profile" or a whole number of bytes from 1 B to 1 PiB (units B, KiB, MiB, GiB, KB, MB, '
            "GB)",
            "2.5GiB",
        ) from None


def _choice(options: tuple[str, ...], synonyms: Mapping[str, str] | None = None) -> Callable[[str, _Context], str]:
    def parse(raw: str, ctx: _Context) -> str:
        value = raw.strip().lower()
        value = (synonyms or {}).get(value, value)
        if value not in options:
            raise _Invalid("must be one of " + ", ".join(options), options[0])
        return value

    return parse


def _bool(raw: str, ctx: _Context) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise _Invalid("must be one of 0, 1, true, false (also yes/no, on/off)", "1")


def _on_off(raw: str, ctx: _Context) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise _Invalid("must be on or off", "on")


def _model(raw: str, ctx: _Context) -> ModelChoice:
    value = raw.strip()
    if value.lower() in MODEL_ALIASES:
        return ModelChoice(value.lower(), "alias", MODEL_ALIASES[value.lower()])
    if value.startswith(("/", "./", "../", "~/")) or value in (".", ".."):
        try:
            untrusted.check_path(value)
        except untrusted.Untrusted as exc:
            raise _Invalid(f"must be a usable directory path: {exc.reason}", "/models/gemma") from None
        path = Path(os.path.expanduser(value))
        if not path.is_absolute():
            path = ctx.cwd / path
        path = Path(os.path.normpath(path))
        if not path.is_dir():
            raise _Invalid(
                f"must be an existing directory holding config.json ({path} is not a directory)", "/models/gemma"
            )
        if not (path / "config.json").is_file():
            raise _Invalid(f"must be a directory holding config.json ({path}/config.json is missing)", "/models/gemma")
        return ModelChoice(value, "local", str(path))
    if _REPO_ID.match(value) and ".." not in value and "--" not in value and not value.endswith(".git"):
        return ModelChoice(value, "repo", value)
    raise _Invalid(
        "must be qat, bf16, a Hugging Face repo id (org/name), or a local directory (absolute or ./ path)",
        "qat",
    )


def _size_as(raw: str, ctx: _Context) -> str | None:
    value = raw.strip()
    if value.lower() in ("", "none", "off"):
        return None
    gpu = known_gpu(value)
    if gpu is None:
        raise _Invalid("must be a GPU of the known table (" + ", ".join(KNOWN_GPUS) + ") or none", "t4")
    return gpu.key


def _served_model_name(raw: str, ctx: _Context) -> str:
    value = raw.strip()
    if not value or any(c.isspace() for c in value):
        raise _Invalid("must be one word without whitespace", "gemma-4-e2b")
    return value


def _host(raw: str, ctx: _Context) -> str:
    try:
        return untrusted.check_host(raw.strip())
    except untrusted.Untrusted as exc:
        raise _Invalid(f"{exc.reason} to bind", "0.0.0.0") from None


def _path(raw: str, ctx: _Context) -> str:
    value = os.path.expanduser(raw.strip())
    if not value:
        raise _Invalid("must be a path", "/cache/t4serve")
    path = Path(value)
    absolute = str(path if path.is_absolute() else ctx.cwd / path)
    try:
        # The path goes into supervisord.conf and into file system calls: one line, names the kernel accepts.
        return untrusted.check_path(absolute)
    except untrusted.Untrusted as exc:
        raise _Invalid(f"must be a usable path: {exc.reason}", "/cache/t4serve") from None


def _vllm_args(raw: str, ctx: _Context) -> tuple[str, ...]:
    try:
        args = shlex.split(raw)
    except ValueError as exc:
        raise _Invalid(
            f"must be shell-quoted flags ({exc})", "'--enforce-eager --attention-backend TRITON_ATTN'"
        ) from None
    for i, arg in enumerate(args):
        problem = (
            vllm_flag_conflict(arg)
            or _refused_value(arg, args[i + 1] if i + 1 < len(args) else None)
            or _secret_flag_inside(arg)
        )
        if problem is not None:
            flag = arg.split("=", 1)[0]
            use = next((v for f, v in CONTROLLED_FLAGS.items() if _names_flag(_canonical_flag(flag), f)), None)
            fix = f"remove {flag} from T4SERVE_VLLM_ARGS" + (f" and set {use} instead" if use else "")
            # The message shows T4SERVE_VLLM_ARGS through redact_vllm_args (in _error): no secret value in it.
            raise _Invalid(problem, "--enforce-eager", fix)
    return tuple(args)


def _refused_value(arg: str, following: str | None) -> str | None:
    """Why `arg` (with its value glued on by `=`, or the next argument) is refused for its value, or None."""
    if not arg.startswith("--"):
        return None
    name, eq, glued = arg.partition("=")
    value = glued if eq else following
    for flag, refused in REFUSED_FLAG_VALUES.items():
        if _names_flag(_canonical_flag(name), flag) and value is not None and value.strip().lower() in refused:
            return f"must not contain {flag} {value.strip().lower()}: {refused[value.strip().lower()]}"
    return None


def _secret_flag_inside(arg: str) -> str | None:
    """A secret flag inside one quoted argument (`' --api-key KEY'`): vLLM would print it back as an unknown one."""
    if not arg.startswith("-") and untrusted.holds_secret_flag(arg, is_secret_flag):
        return "must not hold a secret flag inside a quoted argument: the secret would reach vLLM's command line"
    return None


def is_secret_flag(flag: str) -> bool:
    """`flag` (as written, `--api_key`, an abbreviation) names one of SECRET_FLAGS."""
    return flag.startswith("--") and any(_names_flag(_canonical_flag(flag), f) for f in SECRET_FLAGS)


def redact_vllm_args(raw: str) -> str:
    """T4SERVE_VLLM_ARGS as any message may show it: every value redacted when a secret flag is among the flags."""
    return untrusted.redact_flags(raw, is_secret_flag)


def vllm_flag_conflict(arg: str) -> str | None:
    """Why `arg` may not appear in T4SERVE_VLLM_ARGS, or None when it may.

    vLLM accepts `--flag=value`, underscores for dashes, and (argparse) unambiguous abbreviations; all three count.
    """
    if not arg.startswith("-") or arg == "-" or arg == "--":
        return None
    if arg.startswith("--"):
        name = _canonical_flag(arg.split("=", 1)[0])
    else:
        name = arg.split("=", 1)[0]
        # Short options take their value glued on (-tp2): compare by prefix.
        for short, why in FIXED_FLAGS.items():
            if not short.startswith("--") and name.startswith(short):
                return f"must not contain {name}: {why}"
        return None
    for flag, variable in CONTROLLED_FLAGS.items():
        if _names_flag(name, flag) and flag in SECRET_FLAGS:
            return (
                f"must not contain {name}: on a command line the secret would show in `ps` and in t4serve's plan; "
                f"use {variable} instead (it reaches vLLM through its environment only)"
            )
        if _names_flag(name, flag):
            return f"must not contain {name}: t4serve sets {flag} itself; use {variable} instead"
    for flag, why in FIXED_FLAGS.items():
        if flag.startswith("--") and _names_flag(name, flag):
            return f"must not contain {name}: {why}"
    return None


def _names_flag(name: str, flag: str) -> bool:
    """`name` is `flag` or an abbreviation argparse would expand to it (vLLM's parser allows abbreviations)."""
    return name == flag or (len(name) > 3 and flag.startswith(name))


def _canonical_flag(flag: str) -> str:
    """vLLM's FlexibleArgumentParser reads `--max_model_len` as `--max-model-len`; so does this check. Case is folded
    too: vLLM refuses `--API-KEY` as unknown, but its refusal would print the value that follows to the log."""
    return "--" + flag[2:].replace("_", "-").lower() if flag.startswith("--") else flag


def _log_level(raw: str, ctx: _Context) -> str:
    return _choice(LOG_LEVELS, {"warn": "warning"})(raw, ctx)


def _secret(name: str, what: str, example: str, printable_ascii: bool = False) -> Callable[[str, _Context], Secret]:
    """The parser of a secret given in the environment (HF_TOKEN, T4SERVE_API_KEY): one word, kept as a Secret."""

    def parse(raw: str, ctx: _Context) -> Secret:
        try:
            return Secret(untrusted.check_secret(raw, what, printable_ascii=printable_ascii), name)
        except untrusted.Untrusted as exc:
            raise _Invalid(exc.reason, example) from None

    return parse


def _secret_file(
    name: str, what: str, example: str, printable_ascii: bool = False
) -> Callable[[str, _Context], Secret]:
    """The parser of a file holding a secret (HF_TOKEN_FILE, T4SERVE_API_KEY_FILE): a Docker/compose secret file."""

    def parse(raw: str, ctx: _Context) -> Secret:
        path = Path(_path(raw, ctx))
        try:
            # Bounded and non-blocking: a FIFO or a 10 MB file is refused, not waited on or read whole.
            text = untrusted.read_text_bounded(path, _SECRET_FILE_MAX_BYTES, "the file")
        except FileNotFoundError:
            raise _Invalid(f"must name an existing file ({path} does not exist)", example) from None
        except untrusted.Untrusted as exc:
            if not os.access(path, os.R_OK) and path.exists():
                raise _Invalid(f"must name a file readable by uid {os.getuid()} ({path} is not readable)", example) \
                    from None
            raise _Invalid(f"must name a readable UTF-8 file holding the {what}: {exc.reason}", example) from None
        if not text.strip():
            raise _Invalid(f"must name a file holding the {what} ({path} is empty)", example)
        if any(c.isspace() for c in text.strip()):
            raise _Invalid(f"must name a file holding one {what} ({path} holds whitespace inside)", example)
        try:
            value = untrusted.check_secret(text, what, printable_ascii=printable_ascii)
        except untrusted.Untrusted as exc:
            reason = exc.reason.removeprefix("must be ")
            raise _Invalid(f"must name a file holding {reason} ({path})", example) from None
        return Secret(value, f"{name}={path}")

    return parse


# A secret file holds one token of at most MAX_SECRET_CHARS plus a newline; a larger file is not a secret file.
_SECRET_FILE_MAX_BYTES = 64 * 1024
_token = _secret("HF_TOKEN", "token", "hf_... (from https://huggingface.co/settings/tokens)")
_token_file = _secret_file("HF_TOKEN_FILE", "token", "/run/secrets/hf_token")
API_KEY_EXAMPLE = "$(openssl rand -hex 32)"
_api_key = _secret("T4SERVE_API_KEY", "key", API_KEY_EXAMPLE, printable_ascii=True)
_api_key_file = _secret_file("T4SERVE_API_KEY_FILE", "key", "/run/secrets/api_key", printable_ascii=True)


@dataclass(frozen=True)
class _SecretPair:
    """A secret given directly (HF_TOKEN) and its *_FILE variant (HF_TOKEN_FILE): at most one may be set."""

    name: str
    file_name: str
    read_file: Callable[[str, _Context], Secret]
    what: str


_API_KEY_PAIR = _SecretPair("T4SERVE_API_KEY", "T4SERVE_API_KEY_FILE", _api_key_file, "key")
_SECRET_PAIRS = (_SecretPair("HF_TOKEN", "HF_TOKEN_FILE", _token_file, "token"), _API_KEY_PAIR)


# Far above any context or batch a T4-class GPU serves; bounds that keep the sizing arithmetic in range.
MAX_MODEL_LEN_LIMIT = 1 << 24
MAX_NUM_SEQS_LIMIT = 1 << 16


def _default_hf_home(ctx: _Context) -> str:
    # huggingface_hub.constants: HF_HOME defaults to $XDG_CACHE_HOME/huggingface, XDG_CACHE_HOME to ~/.cache.
    xdg = ctx.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "huggingface")


VARIABLES: tuple[Variable, ...] = (
    Variable(
        "T4SERVE_MODEL", "model", "qat", "qat",
        f"Checkpoint to serve: `qat` ({QAT_REPO}, int4 weights), `bf16` ({BF16_REPO}), any Hugging Face repo id "
        "`org/name`, or a local directory (absolute or `./` path) holding config.json.",
        _model, "qat", "--model",
    ),
    Variable(
        "T4SERVE_SERVED_MODEL_NAME", "served_model_name", None, "the model's repo id (local directory: its name)",
        "Model name clients send in requests (`model` in /v1/completions).",
        _served_model_name, "gemma-4-e2b", "--served-model-name",
    ),
    Variable("T4SERVE_HOST", "host", "0.0.0.0", "0.0.0.0", "Address the OpenAI-compatible server binds.",
             _host, "0.0.0.0", "--host"),
    Variable("T4SERVE_PORT", "port", "8000", "8000", "Port of the OpenAI-compatible server.",
             _int_in(1, 65535, 8000), "8000", "--port"),
    Variable(
        "T4SERVE_API_KEY", "api_key", None, "(none: no key)",
        "API key clients must send (`Authorization: Bearer KEY`) to /v1/* (/health and /metrics stay open); vLLM "
        "gets it as VLLM_API_KEY in its environment. Never printed, never on a command line.",
        _api_key, API_KEY_EXAMPLE, None, secret=True,
    ),
    Variable(
        "T4SERVE_API_KEY_FILE", "api_key_file", None, "(none)",
        "File holding the API key (a compose/Docker secret; see Exposing the port); setting it and "
        "T4SERVE_API_KEY both is an error.",
        _path, "/run/secrets/api_key", "--api-key-file",
    ),
    Variable(
        "T4SERVE_MAX_MODEL_LEN", "max_model_len", None, "auto",
        "Longest request in tokens (prompt + output); `auto`: 16384 (the published T4 setup), capped by the model "
        "and by what one request fits in the KV cache.",
        _auto_or_int(16, 16384, MAX_MODEL_LEN_LIMIT), "16384", "--max-model-len",
    ),
    Variable(
        "T4SERVE_MAX_NUM_SEQS", "max_num_seqs", None, "auto",
        "Requests decoded at once; `auto`: as many max-length requests as the KV cache holds at once (at most 256).",
        _auto_or_int(1, 8, MAX_NUM_SEQS_LIMIT), "8", "--max-num-seqs",
    ),
    Variable(
        "T4SERVE_MAX_NUM_BATCHED_TOKENS", "max_num_batched_tokens", None, "auto",
        "Tokens the scheduler batches per step (`--max-num-batched-tokens`); `auto`: vLLM's default for the planned "
        "GPU (2048 below 70 GiB). The KV cache's sliding-window groups and the activation peak are sized for it.",
        _auto_or_int(16, 2048), "2048", "--max-num-batched-tokens",
    ),
    Variable(
        "T4SERVE_SIZE_AS", "size_as", None, "(none)",
        "Serve on a bigger card as if it were this one of the known GPUs (`t4`, `l4`, `a10g`, ...): memory sized "
        "and `--gpu-memory-utilization` scaled so vLLM's budget equals that card's, its dtype and batch defaults, "
        "and its shared memory per block for the Turing clamp, so the attention kernels are that card's.",
        _size_as, "t4", "--size-as",
    ),
    Variable(
        "T4SERVE_GPU_MEMORY_UTILIZATION", "gpu_memory_utilization", "0.9", "0.9",
        "Fraction of GPU memory vLLM may use (weights, activations, KV cache).",
        _utilization, "0.9", "--gpu-memory-utilization",
    ),
    Variable(
        "T4SERVE_KV_CACHE_MEMORY_BYTES", "kv_cache_memory_bytes", None, "auto",
        "KV cache size (e.g. `2.5GiB`); `auto`: the predicted pool in whole blocks, so vLLM's KV figures are "
        "known in advance (vLLM skips its memory measurement); `profile`: no `--kv-cache-memory-bytes`, vLLM sizes the "
        "pool from its profile run and T4SERVE_GPU_MEMORY_UTILIZATION (safer where the prediction may be off).",
        _kv_cache_size, "2.5GiB", "--kv-cache-memory-bytes",
    ),
    Variable(
        "T4SERVE_DTYPE", "dtype", "auto", "auto",
        "Compute dtype: `auto` is float16 below compute capability 8.0 (Turing has no bf16), else the checkpoint's; "
        "`float16`, `bfloat16` (needs 8.0+), `float32`.",
        _choice(DTYPES, _DTYPE_SYNONYMS), "float16", "--dtype",
    ),
    Variable(
        "T4SERVE_COMPILE", "compile", "auto", "auto",
        "How much vLLM compiles: `full` (its default: torch.compile and CUDA graphs), `lean` (no Inductor combo "
        "kernels), `o1` (`-O1`), `eager` (`--enforce-eager`); `auto`: full, and after an out-of-memory inside a "
        "cold torch.compile the next one down, remembered in T4SERVE_CACHE_DIR for later starts.",
        _choice(compilation.MODES), "auto", "--compile",
    ),
    Variable(
        "T4SERVE_PREFLIGHT", "preflight", "strict", "strict",
        "`strict`: `serve` refuses to start on any failed check; `warn`: it prints the failures and starts anyway.",
        _choice(PREFLIGHT_MODES), "strict", "--preflight",
    ),
    Variable(
        "T4SERVE_VLLM_ARGS", "vllm_args", "", "(none)",
        "Extra `vllm serve` flags, shell-quoted. Flags t4serve sets are refused with the variable to use; "
        "`--attention-backend` passes through.",
        _vllm_args, "--enforce-eager", "--vllm-args",
    ),
    Variable(
        "HF_TOKEN", "hf_token", None, "(none)",
        "Hugging Face token for gated checkpoints (Gemma is gated). Never printed, never on a command line.",
        _token, "hf_...", None, secret=True,
    ),
    Variable(
        "HF_TOKEN_FILE", "hf_token_file", None, "(none)",
        "File holding the token (a compose/Docker secret); setting it and HF_TOKEN both is an error.",
        _path, "/run/secrets/hf_token", "--hf-token-file",
    ),
    Variable(
        "HF_HOME", "hf_home", None, "$XDG_CACHE_HOME/huggingface or ~/.cache/huggingface (image: /cache/huggingface)",
        "Hugging Face cache; checkpoints are looked up and downloaded here.",
        _path, "/cache/huggingface", "--hf-home", default_from=_default_hf_home,
    ),
    Variable("HF_HUB_OFFLINE", "hf_hub_offline", "0", "0",
             "`1`: never contact the hub; the checkpoint must already be local.",
             _bool, "1", "--hf-hub-offline"),
    Variable("T4SERVE_LOG_LEVEL", "log_level", "info", "info", "t4serve's log level: debug, info, warning, error.",
             _log_level, "info", "--log-level"),
    Variable("T4SERVE_MANIFEST", "manifest", "/etc/t4serve/build-manifest.json", "/etc/t4serve/build-manifest.json",
             "Build manifest the image wrote (torch, CUDA, arch list, vLLM, clamp proof).",
             _path, "/etc/t4serve/build-manifest.json", "--manifest"),
    Variable("T4SERVE_STATE_DIR", "state_dir", "/tmp/t4serve", "/tmp/t4serve",
             "Runtime state (phase, figures) read by `status` and `healthcheck`.",
             _path, "/tmp/t4serve", "--state-dir"),
    Variable("T4SERVE_CACHE_DIR", "cache_dir", "/cache/t4serve", "/cache/t4serve",
             "Persistent t4serve data (durations of past starts).",
             _path, "/cache/t4serve", "--cache-dir"),
    Variable("T4SERVE_TELEMETRY_PORT", "telemetry_port", "9400", "9400",
             "Port of the GPU telemetry `/metrics` endpoint; `0` disables telemetry.",
             _int_in(0, 65535, 9400), "9400", "--telemetry-port"),
    Variable("T4SERVE_SHUTDOWN_TIMEOUT", "shutdown_timeout", "30", "30",
             "Seconds vLLM drains in-flight requests on SIGTERM (`--shutdown-timeout`).",
             _int_in(0, 3600, 30), "30", "--shutdown-timeout"),
    Variable("T4SERVE_MAX_RESTARTS", "max_restarts", "3", "3",
             "Unexpected vLLM exits tolerated within the restart window before the container exits non-zero.",
             _int_in(0, 1000, 3), "3", "--max-restarts"),
    Variable("T4SERVE_RESTART_WINDOW", "restart_window", "300", "300",
             "Seconds over which vLLM exits are counted against T4SERVE_MAX_RESTARTS.",
             _int_in(1, 86400, 300), "300", "--restart-window"),
    Variable("T4SERVE_CANARY", "canary", "on", "on",
             "`on`: ready only after a fixed greedy completion answers correctly; `off`: ready when /health is up.",
             _on_off, "on", "--canary"),
)  # fmt: skip

VARIABLES_BY_NAME: dict[str, Variable] = {v.name: v for v in VARIABLES}


@dataclass(frozen=True)
class Settings:
    """Every setting, parsed and validated. `origins` says where each came from: "env", "flag" or "default"."""

    model: ModelChoice
    served_model_name: str
    host: str
    port: int
    api_key: Secret | None
    api_key_file: str | None
    max_model_len: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    size_as: str | None
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | str | None  # bytes; None for auto; KV_PROFILE to let vLLM profile
    dtype: str
    compile: str
    preflight: str
    vllm_args: tuple[str, ...]
    hf_token: Secret | None
    hf_token_file: str | None
    hf_home: str
    hf_hub_offline: bool
    log_level: str
    manifest: str
    state_dir: str
    cache_dir: str
    telemetry_port: int
    shutdown_timeout: int
    max_restarts: int
    restart_window: int
    canary: bool
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        overrides: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        override_labels: Mapping[str, str] | None = None,
    ) -> Settings:
        """Parse the table from `environ` (default os.environ), with `overrides` (command-line flags) on top.

        `override_labels` names how an override was given when that is not the variable's own option, for messages
        (e.g. {"T4SERVE_MODEL": "the MODEL argument"}).

        An empty value counts as unset, so `T4SERVE_MAX_MODEL_LEN=` in a compose file means the default.
        Every bad value is reported, in one ConfigError.
        """
        env = dict(os.environ if environ is None else environ)
        flags = dict(overrides or {})
        ctx = _Context(env, Path(cwd) if cwd is not None else Path.cwd())
        values: dict[str, Any] = {}
        origins: dict[str, str] = {}
        errors: list[ConfigError] = []
        for var in VARIABLES:
            raw: str | None
            if flags.get(var.name, "") != "":
                raw, origin = flags[var.name], "flag"
            elif env.get(var.name, "") != "":
                raw, origin = env[var.name], "env"
            else:
                raw, origin = var.default, "default"
            origins[var.name] = origin
            if raw is None and var.default_from is not None:
                # A default made from the environment (HF_HOME from XDG_CACHE_HOME) is checked like a value.
                raw = var.default_from(ctx)
            if raw is None:
                values[var.field] = None
                continue
            try:
                values[var.field] = var.parse(_checked_text(var, raw), ctx)
            except _Invalid as exc:
                label = (override_labels or {}).get(var.name)
                errors.append(_error(var, raw, origin, exc.reason, exc.example, exc.fix, label, exc.shown))
        if errors:
            raise _combine(errors)
        return cls._finish(values, origins)

    @classmethod
    def _finish(cls, values: dict[str, Any], origins: dict[str, str]) -> Settings:
        errors: list[ConfigError] = []
        for pair in _SECRET_PAIRS:
            secret_field = VARIABLES_BY_NAME[pair.name].field
            file_field = VARIABLES_BY_NAME[pair.file_name].field
            secret, pair_errors = _resolve_pair(pair, values[secret_field], values[file_field], origins)
            values[secret_field] = secret
            errors += pair_errors
        if values["telemetry_port"] != 0 and values["telemetry_port"] == values["port"]:
            errors.append(
                ConfigError(
                    f"T4SERVE_TELEMETRY_PORT={values['telemetry_port']}: must differ from T4SERVE_PORT",
                    found=f"T4SERVE_PORT={values['port']}, T4SERVE_TELEMETRY_PORT={values['telemetry_port']}",
                    required="two different ports, or T4SERVE_TELEMETRY_PORT=0 to disable telemetry",
                    fix="set T4SERVE_TELEMETRY_PORT=9400",
                )
            )
        if errors:
            raise _combine(errors)
        if values["served_model_name"] is None:
            model: ModelChoice = values["model"]
            values["served_model_name"] = model.repo_id or Path(model.target).name
        return cls(**values, origins=origins)

    def value_text(self, var: Variable) -> str:
        """The setting as a user would write it back; secrets redacted."""
        if var.secret:
            return REDACTED if getattr(self, var.field) is not None else "(unset)"
        value = getattr(self, var.field)
        if var.field == "model":
            return f"{value.requested} ({value.target})" if value.requested != value.target else value.target
        if value is None:
            return "auto" if var.default_doc == "auto" else "(unset)"
        if isinstance(value, bool):
            return ("on" if value else "off") if var.field == "canary" else ("1" if value else "0")
        if isinstance(value, tuple):
            return shlex.join(value) if value else "(none)"
        return str(value)

    def summary(self) -> str:
        """Every setting beside its default and where it came from; secrets redacted."""
        width = max(len(v.name) for v in VARIABLES)
        texts = [self.value_text(v) for v in VARIABLES]
        value_width = min(max(len(t) for t in texts), 48)
        lines = []
        for var, text in zip(VARIABLES, texts, strict=True):
            origin = self.origins.get(var.name, "default")
            mark = "" if origin == "default" else f"  [set by {origin}]"
            lines.append(f"  {var.name:<{width}}  {text:<{value_width}}  default: {var.default_doc}{mark}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view (secrets redacted): variable name -> {value, default, origin}."""
        return {
            var.name: {
                "value": self.value_text(var),
                "default": var.default_doc,
                "origin": self.origins.get(var.name, "default"),
            }
            for var in VARIABLES
        }


def _resolve_pair(
    pair: _SecretPair, secret: Secret | None, file: str | None, origins: Mapping[str, str]
) -> tuple[Secret | None, list[ConfigError]]:
    """The secret a pair gives (read from the file when that is set), or the errors: an unusable file, both set."""
    errors: list[ConfigError] = []
    from_file: Secret | None = None
    if file is not None:
        try:
            from_file = pair.read_file(file, _Context({}, Path("/")))
        except _Invalid as exc:
            file_var = VARIABLES_BY_NAME[pair.file_name]
            errors.append(_error(file_var, file, origins.get(pair.file_name, "env"), exc.reason, exc.example, exc.fix))
    if secret is not None and file is not None:
        errors.append(
            ConfigError(
                f"{pair.name} and {pair.file_name} are both set: set only one",
                found=f"{pair.name}={REDACTED}, {pair.file_name}={file}",
                required=f"at most one of {pair.name}, {pair.file_name}",
                fix=f"unset {pair.name} and keep {pair.file_name} (a secret file keeps the {pair.what} out of "
                "`docker inspect`)",
            )
        )
    return (None if errors else secret or from_file), errors


def api_key_from_environ(environ: Mapping[str, str]) -> Secret | None:
    """T4SERVE_API_KEY, or the key in T4SERVE_API_KEY_FILE, checked as `Settings` checks them (a ConfigError).

    For the clients of a running server (healthcheck, bench), which need the key and nothing else of the table.
    """
    ctx = _Context(environ, Path.cwd())
    pair = _API_KEY_PAIR
    raws = {name: environ.get(name, "") for name in (pair.name, pair.file_name)}
    parsed: dict[str, Any] = {}
    errors: list[ConfigError] = []
    for name, raw in raws.items():
        var = VARIABLES_BY_NAME[name]
        try:
            parsed[name] = var.parse(raw, ctx) if raw else None
        except _Invalid as exc:
            errors.append(_error(var, raw, "env", exc.reason, exc.example, exc.fix))
    if errors:
        raise _combine(errors)
    secret, errors = _resolve_pair(pair, parsed[pair.name], parsed[pair.file_name], {})
    if errors:
        raise _combine(errors)
    return secret


def client_api_key(environ: Mapping[str, str], fallback: str) -> str | None:
    """The key a client of the server sends: t4serve's setting, else the variable `fallback` names (VLLM_API_KEY for
    the healthcheck, OPENAI_API_KEY for bench's client); a ConfigError when the setting is unusable."""
    key = api_key_from_environ(environ)
    return key.reveal() if key is not None else environ.get(fallback) or None


def _checked_text(var: Variable, raw: str) -> str:
    """Every value, before its parser: no control characters (T4SERVE_VLLM_ARGS may span lines), valid UTF-8."""
    try:
        return untrusted.check_text(raw, "", allow_blanks=var.field == "vllm_args" or var.secret)
    except untrusted.Untrusted as exc:
        raise _Invalid(exc.reason, var.example) from None


def _error(
    var: Variable,
    raw: str,
    origin: str,
    reason: str,
    example: str,
    fix: str | None = None,
    label: str | None = None,
    shown: str | None = None,
) -> ConfigError:
    if var.field == "vllm_args":
        # Parts of the message quote a flag or an argument: none may be a secret's value.
        for secret in untrusted.secret_values(raw, is_secret_flag):
            reason = reason.replace(secret, REDACTED)
            fix = fix.replace(secret, REDACTED) if fix is not None else None
    if shown is None:
        text = redact_vllm_args(raw) if var.field == "vllm_args" else raw
        shown = REDACTED if var.secret else untrusted.printable(text)
    given_as = label or var.option
    where = f" (from {given_as})" if origin == "flag" and given_as else ""
    if fix is None and origin == "flag" and label:
        fix = f"give {label} as e.g. {example}, or leave it out for {var.name} or the default ({var.default_doc})"
    default = f", or unset it for the default ({var.default_doc})" if not var.secret else ""
    return ConfigError(
        f"{var.name}={shown}{where}: {reason}, e.g. {example}",
        found=f"{var.name}={shown}",
        fix=fix or f"set {var.name}={example}{default}",
    )


def _combine(errors: list[ConfigError]) -> ConfigError:
    if len(errors) == 1:
        return errors[0]
    return ConfigError(
        f"{len(errors)} settings are invalid:\n" + "\n".join("  - " + e.message().replace("\n", "\n  ") for e in errors)
    )


F = TypeVar("F", bound=Callable[..., Any])


def settings_options(func: F) -> F:
    """Add one click option per table row (`envvar=` shown in --help) and pass the parsed `settings=` to `func`.

    Values given on the command line override the environment; the environment itself is read by
    `Settings.from_environ`, so a flag and its variable are validated by the same parser.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        overrides: dict[str, str] = {}
        for var in VARIABLES:
            if var.option is None:
                continue
            value = kwargs.pop(var.param, None)
            if value is not None and ctx.get_parameter_source(var.param) is click.core.ParameterSource.COMMANDLINE:
                overrides[var.name] = value
        return func(*args, settings=Settings.from_environ(os.environ, overrides=overrides), **kwargs)

    decorated: Any = wrapper
    for var in reversed(VARIABLES):
        if var.option is None:
            continue
        decorated = click.option(
            var.option,
            var.param,
            envvar=var.name,
            show_envvar=True,
            default=None,
            metavar=_metavar(var),
            help=f"{var.doc} [default: {var.default_doc}]",
        )(decorated)
    return decorated  # type: ignore[no-any-return]


def _metavar(var: Variable) -> str:
    return {"model": "MODEL", "vllm_args": "FLAGS", "dtype": "DTYPE", "host": "ADDR"}.get(
        var.field, "PATH" if var.parse is _path else "VALUE"
    )


def markdown_table() -> str:
    """The README's environment table, generated from VARIABLES (a unit test keeps README equal to it)."""
    lines = [
        "Every variable is also a flag of `t4serve serve`, `plan`, `preflight`, `probe` and `env` (the flag wins); "
        "an empty value counts as unset. `t4serve env` prints the values in effect.",
        "",
        "| Variable | Flag | Default | Meaning |",
        "|---|---|---|---|",
    ]
    for var in VARIABLES:
        flag = f"`{var.option}`" if var.option else "(none: secret)"
        doc = var.doc.replace("|", "\\|")
        lines.append(f"| `{var.name}` | {flag} | {var.default_doc} | {doc} |")
    return "\n".join(lines) + "\n"
