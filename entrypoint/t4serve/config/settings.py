"""Every setting t4serve reads, from one table: environment variable, click option, default, doc, parser.

`Settings.from_environ(environ)` parses and validates the whole table once into a frozen `Settings` (a bad value is a
`ConfigError`, exit 2, naming the variable, the value found, what is accepted and an example). The same table makes
the shared click options (t4serve.config.options) and docs/reference.md's environment table (`markdown_table`).

Beside it in t4serve.config: variables (a row, its parsers and error), secrets (the token and key rows, their *_FILE
pairs, the child environment, the client key) and vllmflags (the `vllm serve` flags t4serve owns or refuses).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t4serve import untrusted
from t4serve.config import compilation, secrets
from t4serve.config.aliases import BF16_REPO, DRAFT_ALIASES, E2B_ASSISTANT_REPO, MODEL_ALIASES, QAT_REPO
from t4serve.config.checkpoints import ModelChoice, checkpoint_choice, speculative_errors
from t4serve.config.kvflags import refused_kv_flags
from t4serve.config.secrets import Secret
from t4serve.config.variables import (
    MAX_NAME_CHARS,
    MAX_VLLM_ARGS_CHARS,
    Context,
    Invalid,
    Variable,
    auto_or_int,
    boolean,
    checked_text,
    choice,
    combine_errors,
    file_path,
    host_address,
    int_in,
    parse_size,
    setting_error,
    switch_text,
)
from t4serve.config.vllmflags import (
    Refusal,
    foreign_number,
    redact_vllm_args,
    refused_flags,
    secret_flag_inside,
    secret_in_value,
    unread_argument,
)
from t4serve.errors import ConfigError
from t4serve.gpus import (
    BATCHED_TOKENS_TIERS_DOC,
    BF16_MIN_CAPABILITY,
    KNOWN_GPUS,
    MAX_NUM_SEQS_TIERS_DOC,
    SMALL_TIER,
    format_capability,
    known_gpu,
)
from t4serve.untrusted import REDACTED

DTYPES = ("auto", "float16", "bfloat16", "float32")
_BF16 = format_capability(BF16_MIN_CAPABILITY)
# vLLM's own spellings of the same dtypes, accepted and normalised so the plan compares one name.
_DTYPE_SYNONYMS = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32", "fp32": "float32"}
# T4SERVE_KV_CACHE_DTYPE: t4serve.planning.vllmchecks maps each to vLLM's --kv-cache-dtype for the card.
KV_CACHE_DTYPES = ("auto", "int8", "int4", "fp8")
# T4SERVE_ATTENTION: t4serve.planning.attention resolves `auto` and checks the named paths against the card.
ATTENTION_PATHS = ("auto", "turing-mma", "triton")
# T4SERVE_SPECULATIVE: `mtp` drafts with the model's own drafter (t4serve.probes.drafter), `ngram` with vLLM's
# ngram_gpu (no draft model); t4serve.planning.speculative sizes both and writes `--speculative-config`.
SPECULATIVE_MODES = ("off", "mtp", "ngram")
# vLLM's recipe for Gemma 4 E2B with its assistant drafts 2 tokens per step.
DEFAULT_NUM_SPECULATIVE_TOKENS = 2
MAX_NUM_SPECULATIVE_TOKENS = 16
PREFLIGHT_MODES = ("strict", "warn")
CONFIG_ERROR_MODES = ("exit", "wait")
LOG_LEVELS = ("debug", "info", "warning", "error")


# The parsers of the rows below that no other table shares (t4serve.config.variables holds the common ones).


def _utilization(raw: str, ctx: Context) -> float:
    try:
        return untrusted.parse_float(raw, 0.0, 1.0, lo_open=True)
    except untrusted.Untrusted:
        raise Invalid("must be a number in (0, 1]", "0.9") from None


KV_PROFILE = "profile"


def _kv_cache_size(raw: str, ctx: Context) -> int | str | None:
    value = raw.strip().lower()
    if value == "auto":
        return None
    if value == KV_PROFILE:
        return KV_PROFILE
    try:
        return parse_size(raw)
    except ValueError:
        raise Invalid(
            'must be "auto", "profile" or a whole number of bytes from 1 B to 1 PiB (units B, KiB, MiB, GiB, KB, MB, '
            "GB)",
            "2.5GiB",
        ) from None


def _model(raw: str, ctx: Context) -> ModelChoice:
    return checkpoint_choice(raw, ctx, MODEL_ALIASES, "qat")


def _draft_model(raw: str, ctx: Context) -> ModelChoice:
    return checkpoint_choice(raw, ctx, DRAFT_ALIASES, "e2b-assistant")


def _size_as(raw: str, ctx: Context) -> str | None:
    value = raw.strip()
    if value.lower() in ("", "none", "off"):
        return None
    gpu = known_gpu(value)
    if gpu is None:
        raise Invalid("must be a GPU of the known table (" + ", ".join(KNOWN_GPUS) + ") or none", "t4")
    return gpu.key


def _served_model_name(raw: str, ctx: Context) -> str:
    value = raw.strip()
    if not value or any(c.isspace() for c in value):
        raise Invalid("must be one word without whitespace", "gemma-4-e2b")
    return value


def _vllm_args(raw: str, ctx: Context) -> tuple[str, ...]:
    try:
        args = shlex.split(raw)
    except ValueError as exc:
        raise Invalid(
            f"must be shell-quoted flags ({exc})", "'--enforce-eager --enable-prefix-caching'"
        ) from None
    # First: a secret inside a value is refused for that, before any reason that might quote the value.
    for i, arg in enumerate(args):
        following = args[i + 1] if i + 1 < len(args) else None
        why = (secret_in_value(arg) or (secret_in_value(following) if following is not None else None)
               or secret_flag_inside(arg))
        if why is not None:
            raise Invalid(why, "--enforce-eager", f"remove {arg.split('=', 1)[0][:60]} from T4SERVE_VLLM_ARGS")
    # Then the flags as vLLM's parser reads them (t4serve.config.vllmargv): those t4serve owns or refuses, those that
    # move the KV accounting in ways the plan does not model (t4serve.config.kvflags), then anything vLLM's parser
    # itself would refuse (an unknown or ambiguous flag, a value-taking flag with no value).
    refusal = refused_flags(args)
    if refusal is None and (kv := refused_kv_flags(args)) is not None:
        refusal = Refusal(*kv)
    refusal = refusal or unread_argument(args)
    if refusal is not None:
        flag = refusal.flag.split("=", 1)[0]
        fix = f"remove {flag} from T4SERVE_VLLM_ARGS" + (f" and set {refusal.variable} instead"
                                                          if refusal.variable else "")
        # The example completes the reason: the variable to use where there is one, else flags that would do.
        first = (refusal.variable or "").split(" or ")[0]  # "HF_TOKEN or HF_TOKEN_FILE": the first
        example = f"{first}={VARIABLES_BY_NAME[first].example}" if first in VARIABLES_BY_NAME else "--enforce-eager"
        # The message shows T4SERVE_VLLM_ARGS through redact_vllm_args (in setting_error): no secret value in it.
        raise Invalid(refusal.reason, example, fix)
    # Numbers vLLM's parser reads otherwise than a person (issue 33).
    for arg in args:
        why = foreign_number(arg)
        if why is not None:
            raise Invalid(why, "--enforce-eager", f"write {arg.split('=', 1)[0][:60]}'s number in ASCII digits")
    return tuple(args)


def _log_level(raw: str, ctx: Context) -> str:
    return choice(LOG_LEVELS, {"warn": "warning"})(raw, ctx)


# T4SERVE_MAX_MODEL_LEN=auto plans this, unless the pool or the model says less: the published T4 deployment served
# 16384-token requests (published-t4-run.md). t4serve.planning.sizing plans with it.
DEFAULT_MAX_MODEL_LEN = 16384
# Far above any context or batch a T4-class GPU serves; bounds that keep the sizing arithmetic in range.
MAX_MODEL_LEN_LIMIT = 1 << 24
MAX_NUM_SEQS_LIMIT = 1 << 16


def _default_hf_home(ctx: Context) -> str:
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
        _served_model_name, "gemma-4-e2b", "--served-model-name", max_chars=MAX_NAME_CHARS,
    ),
    Variable("T4SERVE_HOST", "host", "0.0.0.0", "0.0.0.0", "Address the OpenAI-compatible server binds.",
             host_address, "0.0.0.0", "--host"),
    Variable("T4SERVE_PORT", "port", "8000", "8000", "Port of the OpenAI-compatible server.",
             int_in(1, 65535, 8000), "8000", "--port"),
    secrets.API_KEY,
    secrets.API_KEY_FILE,
    Variable(
        "T4SERVE_MAX_MODEL_LEN", "max_model_len", None, "auto",
        f"Longest request in tokens (prompt + output); `auto`: {DEFAULT_MAX_MODEL_LEN} (the published T4 setup), "
        "capped by the model and by what one request fits in the KV cache.",
        auto_or_int(16, DEFAULT_MAX_MODEL_LEN, MAX_MODEL_LEN_LIMIT), str(DEFAULT_MAX_MODEL_LEN), "--max-model-len",
    ),
    Variable(
        "T4SERVE_MAX_NUM_SEQS", "max_num_seqs", None, "auto",
        "Requests decoded at once; `auto`: as many max-length requests as the KV cache holds at once, at most vLLM's "
        f"default for the planned GPU ({MAX_NUM_SEQS_TIERS_DOC}) and at most the batched tokens.",
        auto_or_int(1, 8, MAX_NUM_SEQS_LIMIT), "8", "--max-num-seqs",
    ),
    Variable(
        "T4SERVE_MAX_NUM_BATCHED_TOKENS", "max_num_batched_tokens", None, "auto",
        "Tokens the scheduler batches per step (`--max-num-batched-tokens`); `auto`: vLLM's default for the planned "
        f"GPU ({BATCHED_TOKENS_TIERS_DOC}). The KV cache's sliding-window groups and the activation peak are sized "
        "for it.",
        auto_or_int(16, SMALL_TIER[0]), str(SMALL_TIER[0]), "--max-num-batched-tokens",
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
        "pool from its profile run and T4SERVE_GPU_MEMORY_UTILIZATION (for a card or model the prediction may miss; "
        "on a 15-16 GiB card that run can reach the card's limit and size the pool too large: preflight warns).",
        _kv_cache_size, "2.5GiB", "--kv-cache-memory-bytes",
    ),
    Variable(
        "T4SERVE_DTYPE", "dtype", "auto", "auto",
        f"Compute dtype: `auto` is float16 below compute capability {_BF16} (Turing has no bf16), else the "
        f"checkpoint's; `float16`, `bfloat16` (needs {_BF16}+), `float32`.",
        choice(DTYPES, _DTYPE_SYNONYMS), "float16", "--dtype",
    ),
    Variable(
        "T4SERVE_KV_CACHE_DTYPE", "kv_cache_dtype", "auto", "auto",
        "KV cache entries: `auto` in the model dtype (16-bit); `int8` and `int4` (vLLM's `int8_per_token_head` and "
        "`int4_per_token_head`: a float32 scale per token and head, computed at run time; run by vLLM's Triton "
        "attention) hold about 1.5x and 3x the tokens of Gemma 4 E2B's 16-bit cache; int8 runs on a T4, int4 not "
        "where full-attention heads are 256 or wider, as in Gemma 4 (its kernel needs more shared memory than "
        "Turing has: refused); "
        "`fp8` needs compute capability 8.9 (refused below it in vLLM's words). The KV figures are sized for it.",
        choice(KV_CACHE_DTYPES), "int8", "--kv-cache-dtype",
    ),
    Variable(
        "T4SERVE_ATTENTION", "attention", "auto", "auto",
        "Attention path: `turing-mma` runs vLLM's Triton attention on Turing's tensor cores (compute capability 7.5, "
        "float16, 16-bit or int8 KV cache: Triton's own code for Turing has no tensor-core path; docs/sizing.md has "
        "the figures); `triton` is vLLM's Triton attention as vLLM launches it; `auto`: turing-mma where it runs on "
        "a Turing card, else triton there, and vLLM's own choice from 8.0. `plan` says which and why.",
        choice(ATTENTION_PATHS), "turing-mma", "--attention",
    ),
    Variable(
        "T4SERVE_SPECULATIVE", "speculative", "off", "off",
        "Speculative decoding: `mtp` drafts with the model's own drafter (Gemma 4 E2B's "
        f"`{E2B_ASSISTANT_REPO}`, a 4-layer decoder that reads the model's KV cache and owns none; "
        "T4SERVE_DRAFT_MODEL names another), `ngram` with vLLM's `ngram_gpu` (tokens copied from the prompt, no "
        "draft model); T4SERVE_NUM_SPECULATIVE_TOKENS per step. The plan sizes the drafter's weights, activations "
        "and host memory and passes `--speculative-config`; a model without a drafter is refused for `mtp`.",
        choice(SPECULATIVE_MODES), "mtp", "--speculative",
    ),
    Variable(
        "T4SERVE_DRAFT_MODEL", "draft_model", None, "the model's own drafter (qat, bf16: e2b-assistant)",
        f"The drafter for T4SERVE_SPECULATIVE=mtp: `e2b-assistant` ({E2B_ASSISTANT_REPO}), a Hugging Face repo "
        "id, or a local directory holding a Gemma 4 assistant checkpoint (`gemma4_assistant`).",
        _draft_model, "e2b-assistant", "--draft-model",
    ),
    Variable(
        "T4SERVE_NUM_SPECULATIVE_TOKENS", "num_speculative_tokens", str(DEFAULT_NUM_SPECULATIVE_TOKENS),
        str(DEFAULT_NUM_SPECULATIVE_TOKENS),
        "Tokens drafted per step with T4SERVE_SPECULATIVE (vLLM's `num_speculative_tokens`; "
        f"{DEFAULT_NUM_SPECULATIVE_TOKENS} is vLLM's recipe for Gemma 4 E2B's drafter).",
        int_in(1, MAX_NUM_SPECULATIVE_TOKENS, DEFAULT_NUM_SPECULATIVE_TOKENS),
        str(DEFAULT_NUM_SPECULATIVE_TOKENS), "--num-speculative-tokens",
    ),
    Variable(
        "T4SERVE_COMPILE", "compile", "auto", "auto",
        "How much vLLM compiles: `full` (its default: torch.compile and CUDA graphs), `lean` (no Inductor combo "
        "kernels), `o1` (`-O1`), `eager` (`--enforce-eager`); `auto`: full, and after an out-of-memory inside a "
        "cold torch.compile the next one down, remembered in T4SERVE_CACHE_DIR for later starts. Compilation flags in "
        "T4SERVE_VLLM_ARGS (`-O`, `--compilation-config`, `--enforce-eager`) need it unset or `auto`.",
        choice(compilation.MODES), "auto", "--compile",
    ),
    Variable(
        "T4SERVE_PREFLIGHT", "preflight", "strict", "strict",
        "`strict`: `serve` refuses to start on any failed check; `warn`: it prints the failures and starts anyway.",
        choice(PREFLIGHT_MODES), "strict", "--preflight",
    ),
    Variable(
        "T4SERVE_ON_CONFIG_ERROR", "on_config_error", "exit", "exit",
        "What `serve` does after a configuration error (exit 2): `exit` at once; `wait` prints the error, then "
        "waits for a stop signal before exiting 2, so a restart policy (compose's `restart: unless-stopped`) does "
        "not restart a setting that cannot work over and over. compose.yaml sets `wait`.",
        choice(CONFIG_ERROR_MODES), "wait", "--on-config-error",
    ),
    Variable(
        "T4SERVE_VLLM_ARGS", "vllm_args", "", "(none)",
        "Extra `vllm serve` flags, shell-quoted, read as vLLM's own parser reads them (the last of a flag wins; "
        "`--flag=value`, underscores and unambiguous abbreviations count; a flag vLLM does not have, an ambiguous "
        "one or one missing its value is refused). Flags t4serve sets are refused with the variable to use, and so "
        "are flags that leave its healthcheck nothing to talk to (`--headless`, `--uds`, `--grpc`, `--ssl-*`) or "
        "change the checkpoint it sized (`--revision`, `--hf-overrides`, `--hf-config-path`); flags that move the KV "
        "cache are sized or refused (docs/sizing.md).",
        _vllm_args, "--enforce-eager", "--vllm-args", max_chars=MAX_VLLM_ARGS_CHARS,
    ),
    secrets.HF_TOKEN,
    secrets.HF_TOKEN_FILE,
    Variable(
        "HF_HOME", "hf_home", None, "$XDG_CACHE_HOME/huggingface or ~/.cache/huggingface (image: /cache/huggingface)",
        "Hugging Face cache; checkpoints are looked up and downloaded here.",
        file_path, "/cache/huggingface", "--hf-home", default_from=_default_hf_home,
    ),
    Variable("HF_HUB_OFFLINE", "hf_hub_offline", "0", "0",
             "`1`: never contact the hub; the checkpoint must already be local.",
             boolean("one of 0, 1, true, false (also yes/no, on/off)", "1"), "1", "--hf-hub-offline"),
    Variable("T4SERVE_LOG_LEVEL", "log_level", "info", "info", "t4serve's log level: debug, info, warning, error.",
             _log_level, "info", "--log-level"),
    Variable("T4SERVE_MANIFEST", "manifest", "/etc/t4serve/build-manifest.json", "/etc/t4serve/build-manifest.json",
             "Build manifest the image wrote (torch, CUDA, arch list, vLLM, clamp proof).",
             file_path, "/etc/t4serve/build-manifest.json", "--manifest"),
    Variable("T4SERVE_STATE_DIR", "state_dir", "/tmp/t4serve", "/tmp/t4serve",
             "Runtime state (phase, figures) read by `status` and `healthcheck`.",
             file_path, "/tmp/t4serve", "--state-dir"),
    Variable("T4SERVE_CACHE_DIR", "cache_dir", "/cache/t4serve", "/cache/t4serve",
             "Persistent t4serve data (durations of past starts).",
             file_path, "/cache/t4serve", "--cache-dir"),
    Variable("T4SERVE_TELEMETRY_HOST", "telemetry_host", "0.0.0.0", "0.0.0.0",
             "Address the GPU telemetry `/metrics` endpoint binds (`127.0.0.1`: this host only).",
             host_address, "0.0.0.0", "--telemetry-host"),
    Variable("T4SERVE_TELEMETRY_PORT", "telemetry_port", "9400", "9400",
             "Port of the GPU telemetry `/metrics` endpoint; `0` disables telemetry.",
             int_in(0, 65535, 9400), "9400", "--telemetry-port"),
    Variable("T4SERVE_SHUTDOWN_TIMEOUT", "shutdown_timeout", "30", "30",
             "Seconds vLLM drains in-flight requests on SIGTERM (`--shutdown-timeout`).",
             int_in(0, 3600, 30), "30", "--shutdown-timeout"),
    Variable("T4SERVE_MAX_RESTARTS", "max_restarts", "3", "3",
             "Unexpected vLLM exits tolerated within the restart window before the container exits non-zero.",
             int_in(0, 1000, 3), "3", "--max-restarts"),
    Variable("T4SERVE_RESTART_WINDOW", "restart_window", "300", "300",
             "Seconds over which vLLM exits are counted against T4SERVE_MAX_RESTARTS.",
             int_in(1, 86400, 300), "300", "--restart-window"),
    Variable("T4SERVE_CANARY", "canary", "on", "on",
             "`on`: ready only after a fixed greedy completion answers correctly; `off`: ready when /health is up.",
             boolean("on or off", "on"), "on", "--canary"),
)  # fmt: skip

VARIABLES_BY_NAME: dict[str, Variable] = {v.name: v for v in VARIABLES}


def default_of(name: str) -> str:
    """The table's default for the variable `name`, as a user would write it: the one place it is written."""
    default = VARIABLES_BY_NAME[name].default
    if default is None:
        raise KeyError(f"{name} has no fixed default")
    return default


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
    kv_cache_dtype: str
    attention: str
    speculative: str
    draft_model: ModelChoice | None
    num_speculative_tokens: int
    compile: str
    preflight: str
    on_config_error: str
    vllm_args: tuple[str, ...]
    hf_token: Secret | None
    hf_token_file: str | None
    hf_home: str
    hf_hub_offline: bool
    log_level: str
    manifest: str
    state_dir: str
    cache_dir: str
    telemetry_host: str
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
        ctx = Context(env, Path(cwd) if cwd is not None else Path.cwd())
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
                values[var.field] = var.parse(checked_text(var, raw), ctx)
            except Invalid as exc:
                label = (override_labels or {}).get(var.name)
                errors.append(setting_error(var, raw, origin, exc.reason, exc.example, exc.fix, label, exc.shown))
        if errors:
            raise combine_errors(errors)
        return cls._finish(values, origins)

    @classmethod
    def _finish(cls, values: dict[str, Any], origins: dict[str, str]) -> Settings:
        errors: list[ConfigError] = []
        for pair in secrets.SECRET_PAIRS:
            secret_field, file_field = pair.var.field, pair.file_var.field
            secret, pair_errors = secrets.resolve_pair(pair, values[secret_field], values[file_field], origins)
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
        errors += speculative_errors(values, origins)
        if values["compile"] != compilation.AUTO and compilation.user_controls_compilation(values["vllm_args"]):
            # Two settings choosing compilation: the flags used to win silently over T4SERVE_COMPILE=eager.
            flags = compilation.compilation_flags(values["vllm_args"])
            errors.append(
                ConfigError(
                    f"T4SERVE_COMPILE={values['compile']} and compilation flags in T4SERVE_VLLM_ARGS both choose how "
                    "vLLM compiles: set one",
                    found=f"T4SERVE_COMPILE={values['compile']}, T4SERVE_VLLM_ARGS holds "
                    f"{redact_vllm_args(shlex.join(flags))}",
                    required="compilation chosen in one place: T4SERVE_COMPILE (full, lean, o1, eager, auto), or "
                    "-O/--compilation-config/--enforce-eager in T4SERVE_VLLM_ARGS with T4SERVE_COMPILE unset (auto)",
                    fix=f"unset T4SERVE_COMPILE, or remove {' '.join(f.split('=', 1)[0] for f in flags)} from "
                    "T4SERVE_VLLM_ARGS",
                )
            )
        if errors:
            raise combine_errors(errors)
        if values["served_model_name"] is None:
            model: ModelChoice = values["model"]
            values["served_model_name"] = model.repo_id or Path(model.target).name
        return cls(**values, origins=origins)

    def value_text(self, var: Variable) -> str:
        """The setting as a user would write it back; secrets redacted."""
        if var.secret:
            return REDACTED if getattr(self, var.field) is not None else "(unset)"
        value = getattr(self, var.field)
        if isinstance(value, ModelChoice):
            return f"{value.requested} ({value.target})" if value.requested != value.target else value.target
        if value is None:
            return "auto" if var.default_doc == "auto" else "(unset)"
        if isinstance(value, bool):
            return switch_text(value, var.default)
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


def markdown_table() -> str:
    """docs/reference.md's environment table, generated from VARIABLES (a unit test keeps the page equal to it)."""
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


def with_model(
    settings: Settings, raw: str, environ: Mapping[str, str] | None = None, label: str | None = None
) -> Settings:
    """`settings` with T4SERVE_MODEL set to `raw` (checked by the row's own parser; a ConfigError names it, as `label`
    where it was given otherwise than by --model), its served name following the model unless one was set.
    `t4serve profiles` plans several checkpoints under one setting; `serve MODEL` takes its argument so."""
    var = VARIABLES_BY_NAME["T4SERVE_MODEL"]
    ctx = Context(dict(os.environ if environ is None else environ), Path.cwd())
    try:
        model: ModelChoice = var.parse(checked_text(var, raw), ctx)
    except Invalid as exc:
        raise setting_error(var, raw, "flag", exc.reason, exc.example, exc.fix, label, exc.shown) from None
    served = settings.served_model_name
    if settings.origins.get("T4SERVE_SERVED_MODEL_NAME", "default") == "default":
        served = model.repo_id or Path(model.target).name
    return dataclasses.replace(settings, model=model, served_model_name=served)
