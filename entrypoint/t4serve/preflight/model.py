"""The preflight checks of the checkpoint and of its drafter (T4SERVE_SPECULATIVE=mtp): readable, or to be downloaded
with a token where it is gated."""

from __future__ import annotations

from t4serve.config.settings import Settings
from t4serve.facts import Facts
from t4serve.preflight.findings import Finding

# ModelFacts.source values meaning "vLLM will download it": read remotely, or the aliases' built-in facts.
NOT_LOCAL_SOURCES = ("not-local", "builtin")


def check_model(facts: Facts, settings: Settings) -> Finding:
    model = facts.model
    required = "the checkpoint local, or downloadable (HF_HUB_OFFLINE=0)"
    if model is None:
        return Finding("model", "warn", "model not probed", required, "run `t4serve probe` to read the checkpoint")
    if model.source == "invalid":
        return Finding(
            "model",
            "fail",
            f"{model.requested}: {model.error}",
            "a readable checkpoint (config.json and safetensors)",
            "point T4SERVE_MODEL at a complete checkpoint directory, or at a repo id to download",
        )
    if model.source not in NOT_LOCAL_SOURCES:
        return Finding("model", "ok", f"{model.requested}: local at {model.local_path}", required, "")
    if settings.hf_hub_offline:
        return Finding(
            "model",
            "fail",
            f"{model.requested} is not in {settings.hf_home} and HF_HUB_OFFLINE=1",
            required,
            "set HF_HUB_OFFLINE=0 for the first start (it downloads once into HF_HOME's volume), or mount a "
            "checkpoint and set T4SERVE_MODEL=/path/to/it",
        )
    if settings.hf_token is None and model.requested.startswith("google/gemma"):
        return Finding(
            "model",
            "warn",
            f"{model.requested} will be downloaded, and no HF_TOKEN / HF_TOKEN_FILE is set",
            "a token for gated checkpoints (Gemma's license must be accepted on huggingface.co)",
            "set HF_TOKEN_FILE to a file holding your token (compose: the hf_token secret)",
        )
    return Finding("model", "ok", f"{model.requested}: will be downloaded into {settings.hf_home}", required, "")


def check_drafter(facts: Facts, settings: Settings) -> Finding:
    """The drafter T4SERVE_SPECULATIVE=mtp names, as the model is checked: readable, local, or to be downloaded (vLLM
    downloads it at start, into HF_HOME, with the same token). Whether it drafts for this model is the plan's refusal
    (the sizing finding)."""
    drafter = facts.drafter
    required = "the drafter local, or downloadable (HF_HUB_OFFLINE=0)"
    if drafter is None:
        return Finding("drafter", "fail", "no drafter for T4SERVE_SPECULATIVE=mtp (the sizing finding says why)",
                       "a drafter checkpoint for the model",
                       "set T4SERVE_DRAFT_MODEL, or T4SERVE_SPECULATIVE=ngram or off")
    if drafter.source == "invalid":
        return Finding("drafter", "fail", f"{drafter.requested}: {drafter.error}",
                       "a readable Gemma 4 assistant checkpoint (config.json and safetensors)",
                       "point T4SERVE_DRAFT_MODEL at a complete drafter checkpoint, or unset it for the model's own")
    if drafter.source not in NOT_LOCAL_SOURCES:
        return Finding("drafter", "ok", f"{drafter.requested}: local at {drafter.local_path}", required, "")
    if settings.hf_hub_offline:
        return Finding("drafter", "fail", f"{drafter.requested} is not in {settings.hf_home} and HF_HUB_OFFLINE=1",
                       required, "set HF_HUB_OFFLINE=0 for the first start (vLLM downloads it beside the model), or "
                       "mount it and set T4SERVE_DRAFT_MODEL=/path/to/it")
    if settings.hf_token is None and drafter.requested.startswith("google/gemma"):
        return Finding("drafter", "warn", f"{drafter.requested} will be downloaded, and no HF_TOKEN / HF_TOKEN_FILE "
                       "is set", "a token for gated checkpoints (Gemma's license must be accepted on huggingface.co)",
                       "set HF_TOKEN_FILE to a file holding your token (compose: the hf_token secret)")
    return Finding("drafter", "ok", f"{drafter.requested}: will be downloaded into {settings.hf_home}", required, "")
