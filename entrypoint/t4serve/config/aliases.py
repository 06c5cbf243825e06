"""The built-in checkpoints: the aliases T4SERVE_MODEL and T4SERVE_DRAFT_MODEL accept and the Hugging Face repo each
names, and the drafter each served checkpoint has.

One table for the settings (which expand an alias), the checkpoint probe (whose facts for these repos ship with the
package), the drafter probe (t4serve.probes.drafter: a target's own drafter) and bench (which takes aliases in
--models).
"""

from __future__ import annotations

QAT_REPO = "google/gemma-4-E2B-it-qat-w4a16-ct"
BF16_REPO = "google/gemma-4-E2B-it"
MODEL_ALIASES: dict[str, str] = {"qat": QAT_REPO, "bf16": BF16_REPO}
# Gemma 4 E2B's MTP drafter (T4SERVE_SPECULATIVE=mtp): a 4-layer decoder that reads the target's KV cache.
E2B_ASSISTANT_REPO = "google/gemma-4-E2B-it-assistant"
DRAFT_ALIASES: dict[str, str] = {"e2b-assistant": E2B_ASSISTANT_REPO}
# The drafter Google publishes for each built-in checkpoint: the QAT checkpoint's weights are E2B's, quantized, and
# its layers, widths and KV cache are the same, so the same assistant drafts for both.
DRAFTERS: dict[str, str] = {QAT_REPO: E2B_ASSISTANT_REPO, BF16_REPO: E2B_ASSISTANT_REPO}
