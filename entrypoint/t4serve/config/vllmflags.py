"""The vLLM flag policy: the `vllm serve` flags t4serve owns, those it refuses, and why.

T4SERVE_VLLM_ARGS passes extra flags to vLLM; a flag that repeats one t4serve sets (CONTROLLED_FLAGS), one it fixes
(FIXED_FLAGS), one that breaks its supervision or changes what it sized (SUPERVISION_FLAGS), a refused value
(REFUSED_FLAG_VALUES) or a secret (SECRET_FLAGS) is refused with the variable to use instead. Each table names a flag
by one option string of vLLM's; the arguments are read as vLLM's parser reads them (t4serve.config.vllmargv), so a
flag is refused in every spelling that parser takes (`--flag=value`, underscores, an abbreviation, a short alias, a
dotted key). Owning one more flag is one entry here. Pure: strings in, reasons out.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from t4serve import untrusted
from t4serve.config.vllmargv import Occurrence, flag_table, read_vllm_args, resolve

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
    # The KV figures are sized for the cache dtype, which the plan maps to vLLM's name for the card.
    "--kv-cache-dtype": "T4SERVE_KV_CACHE_DTYPE",
    # The attention path: vLLM's Triton backend, on Turing's tensor cores where t4serve.turing runs (the image carries
    # no other backend).
    "--attention-backend": "T4SERVE_ATTENTION",
    # Speculative decoding: the plan sizes the drafter (its weights, activations and host memory; its KV cache is the
    # target's) and writes `--speculative-config` itself, so every spelling of it is the settings'.
    "--speculative-config": "T4SERVE_SPECULATIVE",
    "--spec-method": "T4SERVE_SPECULATIVE",
    "--spec-model": "T4SERVE_DRAFT_MODEL",
    "--spec-tokens": "T4SERVE_NUM_SPECULATIVE_TOKENS",
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
    "--tensor-parallel-size": "t4serve serves one GPU (--tensor-parallel-size 1)",
    "--pipeline-parallel-size": "t4serve serves one GPU and sizes the KV cache for it (no pipeline parallelism)",
    "--data-parallel-size": "t4serve serves one GPU per container (run one container per GPU for data parallelism)",
    "--quantization": "t4serve sizes the weights from the checkpoint as it is; pick a quantized checkpoint with "
    "T4SERVE_MODEL (qat) instead",
    "--cpu-offload-gb": "t4serve sizes the weights as held in GPU memory; offloading makes its KV sizing wrong",
    "--num-gpu-blocks-override": "t4serve sizes the KV cache itself; use T4SERVE_KV_CACHE_MEMORY_BYTES instead",
    # A YAML config can set any flag above where no check sees it.
    "--config": "a YAML config could set t4serve's flags unseen; put the flags themselves in T4SERVE_VLLM_ARGS",
    "--help": "vLLM would print its help and exit instead of serving; `docker run IMAGE vllm serve --help` shows it",
}

# Flags that take away what t4serve's supervision talks to, or change which checkpoint vLLM loads after t4serve sized
# another: refused with what owns that choice. The healthcheck, the canary and the wrapper's health poll speak plain
# HTTP to T4SERVE_HOST:T4SERVE_PORT, and the plan sized the config.json t4serve probed.
SUPERVISION_FLAGS: dict[str, str] = {
    "--headless": "t4serve serves the API server itself (--headless starts none, so the healthcheck and canary talk "
    "to nothing); serve one GPU per container",
    "--uds": "the healthcheck and canary reach the server at T4SERVE_HOST:T4SERVE_PORT (--uds ignores both); set "
    "those instead",
    "--grpc": "the healthcheck and canary speak vLLM's HTTP API on T4SERVE_PORT (--grpc serves gRPC there instead)",
    "--ssl-keyfile": "the healthcheck and canary speak plain HTTP to the server; terminate TLS in front of it (a "
    "reverse proxy or the Kubernetes ingress)",
    "--ssl-certfile": "the healthcheck and canary speak plain HTTP to the server; terminate TLS in front of it",
    "--ssl-ca-certs": "the healthcheck and canary speak plain HTTP to the server; terminate TLS in front of it",
    "--ssl-cert-reqs": "the healthcheck and canary speak plain HTTP to the server; terminate TLS in front of it",
    "--ssl-ciphers": "the healthcheck and canary speak plain HTTP to the server; terminate TLS in front of it",
    "--enable-ssl-refresh": "the healthcheck and canary speak plain HTTP to the server; terminate TLS in front of it",
    "--revision": "t4serve sized the checkpoint T4SERVE_MODEL names as it probed it; download that revision into a "
    "folder (`hf download REPO --revision REV --local-dir ./m`) and set T4SERVE_MODEL=./m",
    "--hf-overrides": "t4serve sized the config.json it probed (overrides change layers, heads or context); put the "
    "edited config.json in a checkpoint folder and set T4SERVE_MODEL to it",
    "--hf-config-path": "t4serve sized the config.json it probed, not another one; put that config.json in a "
    "checkpoint folder and set T4SERVE_MODEL to it",
    "--tokenizer": "t4serve sized and checks (the canary) the checkpoint T4SERVE_MODEL names with its own tokenizer; "
    "put the tokenizer files in a checkpoint folder and set T4SERVE_MODEL to it",
    "--checkpoint-prepare-on-startup": "vLLM then serves nothing until a /checkpoint/restore, so the canary and the "
    "healthcheck never see it ready; start the server without it",
}

# Values of these flags that make the plan's sizing meaningless (a dummy load has no weights to size).
REFUSED_FLAG_VALUES: dict[str, dict[str, str]] = {
    "--load-format": {
        "dummy": "--load-format dummy serves random weights: t4serve's canary and sizing need real ones",
        # docker/slim.json: the image leaves their packages out; vLLM would fail at load with an ImportError.
        "fastsafetensors": "the image leaves fastsafetensors out (docker/slim.json); the default safetensors loader "
        "reads the same files",
        "instanttensor": "the image leaves instanttensor out (docker/slim.json); the default safetensors loader reads "
        "the same files",
    },
}


def _is(occurrence: Occurrence, flag: str) -> bool:
    """`occurrence` is the flag a policy table names, however it was written."""
    return occurrence.action is flag_table().action(flag)


def refused_value(occurrence: Occurrence) -> str | None:
    """Why the value `occurrence` gives its flag is refused, or None."""
    value = occurrence.value
    if value is None:
        return None
    word = value.strip().lower()
    for flag, refused in REFUSED_FLAG_VALUES.items():
        if _is(occurrence, flag) and word in refused:
            return f"must not contain {flag} {word}: {refused[word]}"
    return None


# A key of a JSON-valued flag (`--model-loader-extra-config '{"s3_secret_access_key": ...}'`, a token in
# `--speculative-config`) or a dict flag's dotted key that names a secret: its value is a secret like --api-key's.
SECRET_KEY_WORDS = frozenset({"secret", "secrets", "token", "password", "passwd", "passphrase", "credential",
                              "credentials", "apikey", "auth", "authorization", "bearer", "cookie"})  # fmt: skip
SECRET_KEY_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"),
                              ("session", "key"), ("client", "secret"), ("sas", "key")})  # fmt: skip
_JSON_KEY = re.compile(r"\"((?:[^\"\\]|\\.){0,200})\"\s*:|'((?:[^'\\]|\\.){0,200})'\s*:")


def names_secret(key: str) -> bool:
    """A key (`hf_token`, `s3_secret_access_key`, `apiKey`) whose value is a secret; `num_speculative_tokens` or
    `tokenizer` is not one."""
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()) if w]
    return any(w in SECRET_KEY_WORDS for w in words) or any(p in SECRET_KEY_PAIRS for p in itertools.pairwise(words))


def secret_key_in(arg: str) -> str | None:
    """The first key naming a secret in `arg`: a dict flag's dotted key (`--x.hf_token`), or a key of the JSON value
    it holds or has glued on (`--x={"hf_token": ...}`, `'{"hf_token": ...}'`); None when it holds none."""
    if arg.startswith("--"):
        name, eq, value = arg.partition("=")
        _base, dot, keys = name.partition(".")
        if dot and names_secret(keys):
            return keys
        if not eq:
            return None
        arg = value
    for match in _JSON_KEY.finditer(arg):
        key = match.group(1) if match.group(1) is not None else match.group(2)
        if names_secret(key):
            return key
    return None


def secret_in_value(arg: str) -> str | None:
    """Why `arg` is refused for a secret inside a flag's JSON value or dotted key, or None."""
    key = secret_key_in(arg)
    if key is None:
        return None
    return (
        f"must not hold a secret in a flag's value (the key {untrusted.shown(key, 80)}): on vLLM's command line it "
        "would show in `ps` and in t4serve's plan; give it to vLLM through the environment variable its library "
        "reads (e.g. AWS_SECRET_ACCESS_KEY for S3, HF_TOKEN for the hub)"
    )


def foreign_number(arg: str) -> str | None:
    """Why `arg` is refused for a number vLLM's parser would read and a person would not (`\u0663`, `1_0`), or None."""
    value = arg.partition("=")[2] if arg.startswith("-") else arg
    if not untrusted.python_reads_differently(value):
        return None
    return (f"must write numbers in ASCII decimal digits (found {untrusted.shown(value, 40)}: vLLM's parser reads "
            "other scripts' digits and underscores as a number no one reading it sees)")


def is_secret_word(word: str) -> bool:
    """A secret flag (`is_secret_flag`), or a value that holds a secret key (`secret_key_in`): what redaction looks
    for in T4SERVE_VLLM_ARGS."""
    return is_secret_flag(word) or secret_key_in(word) is not None


def secret_flag_inside(arg: str) -> str | None:
    """A secret flag inside one quoted argument (`' --api-key KEY'`): vLLM would print it back as an unknown one."""
    if not arg.startswith("-") and untrusted.holds_secret_flag(arg, is_secret_flag):
        return "must not hold a secret flag inside a quoted argument: the secret would reach vLLM's command line"
    return None


def is_secret_flag(flag: str) -> bool:
    """`flag` (as written, `--api_key`, an abbreviation, in capitals) may name one of SECRET_FLAGS: what vLLM's parser
    reads as one, and any prefix of one besides (redaction errs towards hiding)."""
    if not flag.startswith("--"):
        return False
    if any(names_flag(canonical_flag(flag), f) for f in SECRET_FLAGS):
        return True
    occurrence = resolve(flag)
    return occurrence is not None and any(_is(occurrence, f) for f in SECRET_FLAGS)


def redact_vllm_args(raw: str) -> str:
    """T4SERVE_VLLM_ARGS as any message may show it: every value redacted when a secret flag is among the flags."""
    return untrusted.redact_flags(raw, is_secret_word)


@dataclass(frozen=True)
class Refusal:
    """Why T4SERVE_VLLM_ARGS is refused: `reason` completes "T4SERVE_VLLM_ARGS=...: ..." and never quotes a value;
    `flag` is the flag as written (for "remove it"), `variable` the setting to use instead where there is one."""

    reason: str
    flag: str
    variable: str | None = None


def flag_refusal(occurrence: Occurrence) -> Refusal | None:
    """Why t4serve refuses the flag `occurrence` is (owned, fixed, supervision, or its value), or None."""
    written = occurrence.written.partition(".")[0]
    # An abbreviation or alias is named with the option vLLM reads it as.
    shown = written if written == occurrence.option else f"{written} ({occurrence.option})"
    for flag, variable in CONTROLLED_FLAGS.items():
        if _is(occurrence, flag):
            if flag in SECRET_FLAGS:
                why = ("on a command line the secret would show in `ps` and in t4serve's plan; "
                       f"use {variable} instead (it reaches vLLM through its environment only)")
            else:
                why = f"t4serve sets {flag} itself; use {variable} instead"
            return Refusal(f"must not contain {shown}: {why}", occurrence.written, variable)
    for table in (FIXED_FLAGS, SUPERVISION_FLAGS):
        for flag, why in table.items():
            # A switch's off form (`--no-checkpoint-prepare-on-startup`) is vLLM's default: it passes.
            if _is(occurrence, flag) and (occurrence.action.nargs != 0 or occurrence.switched_on):
                return Refusal(f"must not contain {shown}: {why}", occurrence.written)
    value_why = refused_value(occurrence)
    return None if value_why is None else Refusal(value_why, occurrence.written)


def refused_flags(args: Sequence[str]) -> Refusal | None:
    """The first flag of `args`, read as vLLM reads them, that t4serve refuses (`flag_refusal`), or None."""
    for occurrence in read_vllm_args(args).occurrences:
        refusal = flag_refusal(occurrence)
        if refusal is not None:
            return refusal
    return None


def unread_argument(args: Sequence[str]) -> Refusal | None:
    """The first argument vLLM's parser would refuse (`vllmargv.ArgvProblem`), as a Refusal, or None: a flag
    `vllm serve` does not have, an ambiguous abbreviation, a value-taking flag with no value, a value with no flag."""
    problem = read_vllm_args(args).problem
    if problem is None:
        return None
    return Refusal(f"must be flags `vllm serve` reads, with their values: {problem.written} {problem.reason}",
                   problem.written)


def vllm_flag_refusal(arg: str) -> str | None:
    """Why t4serve refuses the `vllm serve` flag `arg` names (`--flag`, `--flag=value`, an abbreviation), or None:
    the reason alone, for an unknown option after `docker run IMAGE`. Never quotes a value."""
    occurrence = resolve(arg)
    refusal = flag_refusal(occurrence) if occurrence is not None else None
    return None if refusal is None else refusal.reason.partition(": ")[2]


def names_flag(name: str, flag: str) -> bool:
    """`name` is `flag` or an abbreviation argparse would expand to it (vLLM's parser allows abbreviations)."""
    return name == flag or (len(name) > 3 and flag.startswith(name))


def canonical_flag(flag: str) -> str:
    """vLLM's FlexibleArgumentParser reads `--max_model_len` as `--max-model-len`; so does this check. Case is folded
    too: vLLM refuses `--API-KEY` as unknown, but its refusal would print the value that follows to the log."""
    return "--" + flag[2:].replace("_", "-").lower() if flag.startswith("--") else flag
