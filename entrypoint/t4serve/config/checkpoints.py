"""How a setting names a checkpoint (T4SERVE_MODEL, T4SERVE_DRAFT_MODEL: an alias, a repo id or a local directory)
and the rule between the speculative settings. Parsers of t4serve.config.settings' table, kept apart from it."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4serve import untrusted
from t4serve.config.variables import Context, Invalid
from t4serve.errors import ConfigError

_REPO_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"^{_REPO_PART}/{_REPO_PART}$")


@dataclass(frozen=True)
class ModelChoice:
    """What T4SERVE_MODEL or T4SERVE_DRAFT_MODEL named: an alias, an HF repo id, or a local directory (absolute)."""

    requested: str
    kind: str  # "alias", "repo", "local"
    # The repo id (aliases expanded) or the absolute local directory: what the model probe resolves.
    target: str

    @property
    def repo_id(self) -> str | None:
        return None if self.kind == "local" else self.target


def checkpoint_choice(raw: str, ctx: Context, aliases: Mapping[str, str], example: str) -> ModelChoice:
    """An alias of `aliases`, a Hugging Face repo id, or an existing local directory holding config.json."""
    value = raw.strip()
    if value.lower() in aliases:
        return ModelChoice(value.lower(), "alias", aliases[value.lower()])
    if value.startswith(("/", "./", "../", "~/")) or value in (".", ".."):
        try:
            untrusted.check_path(value)
        except untrusted.Untrusted as exc:
            raise Invalid(f"must be a usable directory path: {exc.reason}", "/models/gemma") from None
        path = Path(os.path.expanduser(value))
        if not path.is_absolute():
            path = ctx.cwd / path
        path = Path(os.path.normpath(path))
        if not path.is_dir():
            raise Invalid(
                f"must be an existing directory holding config.json ({path} is not a directory)", "/models/gemma"
            )
        if not (path / "config.json").is_file():
            raise Invalid(f"must be a directory holding config.json ({path}/config.json is missing)", "/models/gemma")
        return ModelChoice(value, "local", str(path))
    if _REPO_ID.match(value) and ".." not in value and "--" not in value and not value.endswith(".git"):
        return ModelChoice(value, "repo", value)
    raise Invalid(
        f"must be {', '.join(aliases)}, a Hugging Face repo id (org/name), or a local directory (absolute or ./ path)",
        example,
    )


def speculative_errors(values: dict[str, Any], origins: dict[str, str]) -> list[ConfigError]:
    """T4SERVE_DRAFT_MODEL and T4SERVE_NUM_SPECULATIVE_TOKENS set where T4SERVE_SPECULATIVE does not use them: a
    setting that would change nothing is refused rather than ignored."""
    mode = values["speculative"]
    errors = []
    if values["draft_model"] is not None and mode != "mtp":
        errors.append(ConfigError(
            f"T4SERVE_DRAFT_MODEL is set but T4SERVE_SPECULATIVE={mode}: only `mtp` drafts with a draft model",
            found=f"T4SERVE_SPECULATIVE={mode}, T4SERVE_DRAFT_MODEL={values['draft_model'].requested}",
            required="T4SERVE_DRAFT_MODEL together with T4SERVE_SPECULATIVE=mtp",
            fix="set T4SERVE_SPECULATIVE=mtp, or unset T4SERVE_DRAFT_MODEL",
        ))
    if origins.get("T4SERVE_NUM_SPECULATIVE_TOKENS", "default") != "default" and mode == "off":
        errors.append(ConfigError(
            "T4SERVE_NUM_SPECULATIVE_TOKENS is set but T4SERVE_SPECULATIVE=off: nothing drafts tokens",
            found=f"T4SERVE_SPECULATIVE=off, T4SERVE_NUM_SPECULATIVE_TOKENS={values['num_speculative_tokens']}",
            required="T4SERVE_NUM_SPECULATIVE_TOKENS together with T4SERVE_SPECULATIVE=mtp or ngram",
            fix="set T4SERVE_SPECULATIVE=mtp (or ngram), or unset T4SERVE_NUM_SPECULATIVE_TOKENS",
        ))
    return errors
