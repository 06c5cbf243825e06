"""Which drafter T4SERVE_SPECULATIVE=mtp drafts with, and its probe.

`choose_drafter(settings, model)` is pure: T4SERVE_DRAFT_MODEL where it is set, else the drafter Google publishes for
the served checkpoint (t4serve.config.aliases.DRAFTERS, by repo id), else, for a checkpoint of Gemma 4 E2B's
architecture read from its config.json (a local copy or a fine-tune), E2B's assistant; any other model has none,
and the plan refuses it by name. `probe_drafter` reads the chosen checkpoint as the model probe reads any
(t4serve.probes.checkpoint, in the drafter's role: a Gemma 4 assistant, its layers' KV sharing as vLLM sets it up).
"""

from __future__ import annotations

from dataclasses import dataclass

from t4serve.config.aliases import DRAFTERS, E2B_ASSISTANT_REPO
from t4serve.config.settings import Settings
from t4serve.facts import ModelFacts
from t4serve.probes.checkpoint import ROLE_DRAFTER, probe_model

# Gemma 4 E2B's text architecture, as its config.json (and the QAT checkpoint's) gives it: a checkpoint with these is
# E2B whatever its name, and E2B's assistant drafts for it (its projections read and write this width; its layers
# read the KV cache of E2B's last owning sliding and full layers).
E2B_ARCHITECTURE = {"model_type": "gemma4_text", "hidden_size": 1536, "num_hidden_layers": 35,
                    "num_kv_shared_layers": 20}


@dataclass(frozen=True)
class DrafterChoice:
    """The drafter to probe (a repo id or a directory; None: the model has none) and how it was chosen."""

    target: str | None
    how: str


def is_e2b(model: ModelFacts | None) -> bool:
    text = model.config.get("text") if model is not None else None
    return isinstance(text, dict) and all(text.get(key) == value for key, value in E2B_ARCHITECTURE.items())


def choose_drafter(settings: Settings, model: ModelFacts | None) -> DrafterChoice:
    """The drafter for T4SERVE_SPECULATIVE=mtp on the checkpoint `model` (the probe's facts of T4SERVE_MODEL)."""
    if settings.draft_model is not None:
        return DrafterChoice(settings.draft_model.target, "T4SERVE_DRAFT_MODEL")
    published = DRAFTERS.get(settings.model.target)
    if published is not None:
        return DrafterChoice(published, f"the drafter Google publishes for {settings.model.target}")
    if is_e2b(model):
        return DrafterChoice(E2B_ASSISTANT_REPO, "Gemma 4 E2B's architecture in the checkpoint's config.json "
                             "(hidden size 1536, 35 layers, 20 KV-shared)")
    return DrafterChoice(None, f"{settings.model.requested} has no drafter t4serve knows: Google publishes one for "
                         f"Gemma 4 E2B ({E2B_ASSISTANT_REPO}, for qat and bf16), and this checkpoint is not E2B by "
                         "its repo id or its config.json")


def probe_drafter(settings: Settings, model: ModelFacts | None) -> ModelFacts | None:
    """The drafter's facts where T4SERVE_SPECULATIVE=mtp and the model has one, read where the settings say (HF_HOME,
    HF_HUB_OFFLINE); None otherwise."""
    if settings.speculative != "mtp":
        return None
    choice = choose_drafter(settings, model)
    if choice.target is None:
        return None
    return probe_model(choice.target, hf_home=settings.hf_home, offline=settings.hf_hub_offline, role=ROLE_DRAFTER)
