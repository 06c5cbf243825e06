"""The built-in checkpoints: the aliases T4SERVE_MODEL accepts and the Hugging Face repo each names.

One table for the settings (which expand an alias), the checkpoint probe (whose facts for these repos ship with the
package) and bench (which takes aliases in --models).
"""

from __future__ import annotations

QAT_REPO = "google/gemma-4-E2B-it-qat-w4a16-ct"
BF16_REPO = "google/gemma-4-E2B-it"
MODEL_ALIASES: dict[str, str] = {"qat": QAT_REPO, "bf16": BF16_REPO}
