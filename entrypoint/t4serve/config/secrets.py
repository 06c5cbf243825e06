"""Secrets: the HF token and the API key, each given directly or in a *_FILE, kept out of every printout and argv.

`Secret` never shows its value (repr, str, format); the settings table holds its four rows here (HF_TOKEN,
HF_TOKEN_FILE, T4SERVE_API_KEY, T4SERVE_API_KEY_FILE), each pair checked by `resolve_pair` (a file that cannot be
read, or both set, is a ConfigError). `secret_environment` is the one place a secret is revealed, into the
environment of the server's processes; `client_api_key` gives the key to the clients of a running server.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4serve import untrusted
from t4serve.config.variables import Context, Invalid, Variable, combine_errors, file_path, setting_error
from t4serve.errors import ConfigError
from t4serve.untrusted import REDACTED


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


def _secret(name: str, what: str, example: str, printable_ascii: bool = False) -> Callable[[str, Context], Secret]:
    """The parser of a secret given in the environment (HF_TOKEN, T4SERVE_API_KEY): one word, kept as a Secret."""

    def parse(raw: str, ctx: Context) -> Secret:
        try:
            return Secret(untrusted.check_secret(raw, what, printable_ascii=printable_ascii), name)
        except untrusted.Untrusted as exc:
            raise Invalid(exc.reason, example) from None

    return parse


@dataclass(frozen=True)
class SecretFileHelp:
    """How a user fills a secret file: the value's example, the host command that writes it and the host file that
    compose mounts (docs/operations.md: compose bind-mounts the host file as it is, owner and mode included)."""

    value: str
    writes: str
    host_file: str
    compose: str
    # How such a file comes to be empty, when there is a common way.
    trap: str = ""
    # What puts the file there when it is missing, when more than "set NAME" can be said.
    missing: str | None = None

    def fill(self, uid: int) -> str:
        return f"(umask 077 && {self.writes} > {self.host_file}) && chown {uid} {self.host_file}"


def _secret_file(
    name: str, what: str, example: str, help: SecretFileHelp, printable_ascii: bool = False
) -> Callable[[str, Context], Secret]:
    """The parser of a file holding a secret (HF_TOKEN_FILE, T4SERVE_API_KEY_FILE): a Docker/compose secret file.
    An empty or unreadable file says so with its own fix (how to fill the file, whose it must be), never "set NAME"
    to the value that is already set."""

    def parse(raw: str, ctx: Context) -> Secret:
        path = Path(file_path(raw, ctx))
        uid = os.getuid()
        try:
            text = read_secret_file(path)
        except FileNotFoundError:
            raise Invalid(f"must name an existing file ({path} does not exist)", example, fix=help.missing) from None
        except untrusted.Untrusted as exc:
            unreadable = _unreadable(path, uid)
            if unreadable is not None:
                raise Invalid(
                    f"names a file uid {uid} cannot read ({unreadable})",
                    example,
                    fix=f"make the file readable by uid {uid} where it comes from: compose and `docker run -v` mount "
                    f"the host file with its owner and mode, so on the host `chown {uid} {help.host_file}` (sudo "
                    f"unless you are root or uid {uid}; keep mode 0600) for {help.compose}, or run the container "
                    "as the file's owner (`docker run --user`, compose's `user:`)",
                ) from None
            raise Invalid(f"must name a readable UTF-8 file holding the {what}: {exc.reason}", example) from None
        if not text.strip():
            content = "0 bytes" if not text else f"{len(text.encode())} bytes of whitespace only"
            raise Invalid(
                f"names an empty file ({path}: {content}); it must hold the {what}",
                help.value,
                fix=f"write the {what} into the file mounted there: on the host `{help.fill(uid)}` for "
                f"{help.compose}, then start again{help.trap}",
            )
        if any(c.isspace() for c in text.strip()):
            raise Invalid(f"must name a file holding one {what} ({path} holds whitespace inside)", example)
        try:
            value = untrusted.check_secret(text, what, printable_ascii=printable_ascii)
        except untrusted.Untrusted as exc:
            reason = exc.reason.removeprefix("must be ")
            raise Invalid(f"must name a file holding {reason} ({path})", example) from None
        return Secret(value, f"{name}={path}")

    return parse


def _unreadable(path: Path, uid: int) -> str | None:
    """Why `path` exists but this process may not read it (its mode, owner and our groups), or None."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: {exc.strerror or type(exc).__name__}"
    if os.access(path, os.R_OK):
        return None
    groups = sorted({os.getgid(), *os.getgroups()})
    return (
        f"{path}: mode {stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}, group {info.st_gid}; "
        f"this process runs as uid {uid}, groups {', '.join(map(str, groups))}"
    )


# A secret file holds one token of at most MAX_SECRET_CHARS plus a newline; a larger file is not a secret file.
SECRET_FILE_MAX_BYTES = 64 * 1024


def read_secret_file(path: Path) -> str:
    """The text of a *_FILE secret (HF_TOKEN_FILE, T4SERVE_API_KEY_FILE, compose's token file): the one reader of
    them, for the settings and for `t4serve mcp`'s redaction. Bounded and non-blocking (a FIFO or a 10 MB file is
    refused, not waited on or read whole); FileNotFoundError, or Untrusted for what is no secret file."""
    return untrusted.read_text_bounded(path, SECRET_FILE_MAX_BYTES, "the file")
API_KEY_EXAMPLE = "$(openssl rand -hex 32)"

API_KEY = Variable(
    "T4SERVE_API_KEY", "api_key", None, "(none: no key)",
    "API key clients must send (`Authorization: Bearer KEY`) to every route but /health, /ping, /metrics and "
    "/version (vLLM's own check guards /v1/*; t4serve's middleware the rest, /invocations included); vLLM gets it as "
    "VLLM_API_KEY in its environment. Never printed, never on a command line.",
    _secret("T4SERVE_API_KEY", "key", API_KEY_EXAMPLE, printable_ascii=True), API_KEY_EXAMPLE, None, secret=True,
)
API_KEY_FILE = Variable(
    "T4SERVE_API_KEY_FILE", "api_key_file", None, "(none)",
    "File holding the API key (a compose/Docker secret; see Exposing the port); setting it and "
    "T4SERVE_API_KEY both is an error.",
    file_path, "/run/secrets/api_key", "--api-key-file",
)
HF_TOKEN = Variable(
    "HF_TOKEN", "hf_token", None, "(none)",
    "Hugging Face token for gated checkpoints (Gemma is gated). Never printed, never on a command line.",
    _secret("HF_TOKEN", "token", "hf_... (from https://huggingface.co/settings/tokens)"), "hf_...", None, secret=True,
)
HF_TOKEN_FILE = Variable(
    "HF_TOKEN_FILE", "hf_token_file", None, "(none)",
    "File holding the token (a compose/Docker secret); setting it and HF_TOKEN both is an error.",
    file_path, "/run/secrets/hf_token", "--hf-token-file",
)  # fmt: skip


@dataclass(frozen=True)
class SecretPair:
    """A secret given directly (HF_TOKEN) and its *_FILE variant (HF_TOKEN_FILE): at most one may be set."""

    var: Variable
    file_var: Variable
    read_file: Callable[[str, Context], Secret]
    what: str


HF_TOKEN_HELP = SecretFileHelp(
    "hf_... (a Hugging Face token: https://huggingface.co/settings/tokens)",
    "printf %s hf_YOURTOKEN", "secrets/hf_token",
    "compose.token-file.yaml's hf_token secret (HF_TOKEN_SECRET_FILE names another host file; with compose.yaml, "
    "HF_TOKEN=hf_... in the environment compose runs in instead)",
    ' (`printf %s "$HF_TOKEN"` writes an empty file when HF_TOKEN is unset in that shell, and compose.yaml copies an '
    "empty HF_TOKEN as an empty file)",
    "give the container the token: with compose.yaml, `HF_TOKEN=hf_... docker compose up` (compose copies it to "
    "/run/secrets/hf_token; an empty HF_TOKEN gives no file in newer Compose); with compose.token-file.yaml, write "
    "secrets/hf_token (that file's second line); with `docker run`, mount the file there "
    "(`-v $PWD/secrets/hf_token:/run/secrets/hf_token:ro`)",
)
API_KEY_HELP = SecretFileHelp(
    API_KEY_EXAMPLE, "openssl rand -hex 32", "secrets/api_key",
    "compose's api_key secret (docs/operations.md, Exposing the port)",
)
API_KEY_PAIR = SecretPair(
    API_KEY, API_KEY_FILE,
    _secret_file("T4SERVE_API_KEY_FILE", "key", "/run/secrets/api_key", API_KEY_HELP, printable_ascii=True), "key",
)
SECRET_PAIRS = (
    SecretPair(HF_TOKEN, HF_TOKEN_FILE, _secret_file("HF_TOKEN_FILE", "token", "/run/secrets/hf_token", HF_TOKEN_HELP),
               "token"),
    API_KEY_PAIR,
)  # fmt: skip


def resolve_pair(
    pair: SecretPair, secret: Secret | None, file: str | None, origins: Mapping[str, str]
) -> tuple[Secret | None, list[ConfigError]]:
    """The secret a pair gives (read from the file when that is set), or the errors: an unusable file, both set."""
    errors: list[ConfigError] = []
    from_file: Secret | None = None
    name, file_name = pair.var.name, pair.file_var.name
    if file is not None:
        try:
            from_file = pair.read_file(file, Context({}, Path("/")))
        except Invalid as exc:
            origin = origins.get(file_name, "env")
            errors.append(setting_error(pair.file_var, file, origin, exc.reason, exc.example, exc.fix))
    if secret is not None and file is not None:
        errors.append(
            ConfigError(
                f"{name} and {file_name} are both set: set only one",
                found=f"{name}={REDACTED}, {file_name}={file}",
                required=f"at most one of {name}, {file_name}",
                fix=f"unset {name} and keep {file_name} (a secret file keeps the {pair.what} out of `docker inspect`)",
            )
        )
    return (None if errors else secret or from_file), errors


def api_key_from_environ(environ: Mapping[str, str]) -> Secret | None:
    """T4SERVE_API_KEY, or the key in T4SERVE_API_KEY_FILE, checked as `Settings` checks them (a ConfigError).

    For the clients of a running server (healthcheck, bench), which need the key and nothing else of the table.
    """
    ctx = Context(environ, Path.cwd())
    pair = API_KEY_PAIR
    parsed: dict[str, Any] = {}
    errors: list[ConfigError] = []
    for var in (pair.var, pair.file_var):
        raw = environ.get(var.name, "")
        try:
            parsed[var.name] = var.parse(raw, ctx) if raw else None
        except Invalid as exc:
            errors.append(setting_error(var, raw, "env", exc.reason, exc.example, exc.fix))
    if errors:
        raise combine_errors(errors)
    secret, errors = resolve_pair(pair, parsed[pair.var.name], parsed[pair.file_var.name], {})
    if errors:
        raise combine_errors(errors)
    return secret


def client_api_key(environ: Mapping[str, str], fallback: str) -> str | None:
    """The key a client of the server sends: t4serve's setting, else the variable `fallback` names (VLLM_API_KEY for
    the healthcheck, OPENAI_API_KEY for bench's client); a ConfigError when the setting is unusable."""
    key = api_key_from_environ(environ)
    return key.reveal() if key is not None else environ.get(fallback) or None


def known_secrets(environ: Mapping[str, str], files: Sequence[Path] = ()) -> list[str]:
    """Secrets this process can know, to redact from text that comes back: the API key and the HF token, from the
    variables, the files they name, and `files` (compose's HF token secret file, where compose finds it)."""
    values = [environ.get(name, "") for name in ("HF_TOKEN", "T4SERVE_API_KEY", "VLLM_API_KEY", "OPENAI_API_KEY")]
    names = ("HF_TOKEN_FILE", "T4SERVE_API_KEY_FILE", "HF_TOKEN_SECRET_FILE")
    for path in [*(environ.get(name) for name in names), *map(str, files)]:
        if path:
            try:
                values.append(read_secret_file(Path(path)).strip())
            except (OSError, untrusted.Untrusted):
                continue
    return [v for v in values if len(v) >= 8]
