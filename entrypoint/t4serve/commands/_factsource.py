"""Where `plan`, `profiles` and `preflight` take their facts from: this machine, or a recording (`--facts FILE`), with
the GPU optionally replaced by a known card (`--gpu KEY`), so a T4's answer can be read on any machine."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import click

from t4serve.config.settings import Settings
from t4serve.facts import Facts
from t4serve.gpus import KNOWN_GPUS
from t4serve.pipeline import gather_facts, load_facts, with_known_gpu

F = TypeVar("F", bound=Callable[..., object])


def facts_options(what: str, *, gpu: bool = True) -> Callable[[F], F]:
    """`--facts FILE` and, with `gpu`, `--gpu KEY`; `what` begins their help ("Plan for", "Check", ...)."""

    def decorate(function: F) -> F:
        if gpu:
            function = click.option(
                "--gpu",
                type=click.Choice(sorted(KNOWN_GPUS), case_sensitive=False),
                help=f"{what} a known GPU instead of the probed one.",
            )(function)
        return click.option(
            "--facts", "facts_file", metavar="FILE", help=f"{what} facts recorded by `t4serve probe --json`."
        )(function)

    return decorate


def read_facts(settings: Settings, facts_file: str | None, gpu: str | None = None) -> Facts:
    """The recording, or this machine's facts gathered now; then the known GPU in place of the probed one."""
    facts = load_facts(facts_file) if facts_file else gather_facts(settings, os.environ)
    return with_known_gpu(facts, gpu) if gpu else facts
