"""The cold-start budget: one figure per loading phase, the slow end of each, growing with the checkpoint."""

from __future__ import annotations

import pytest

from t4serve.config.aliases import MODEL_ALIASES
from t4serve.planning.hostmem import PUBLISHED_PEAKS
from t4serve.probes.checkpoint import builtin_facts
from t4serve.supervise import canary
from t4serve.supervise.phases import LOADING_PHASES
from t4serve.supervise.readout import cold_budget_note
from t4serve.supervise.startbudget import PUBLISHED_LOADS, cold_start_budget, slowest_load_bytes_per_s


def test_one_figure_per_phase_status_shows_in_its_order() -> None:
    budget = cold_start_budget(10**9)
    assert tuple(budget.phases) == LOADING_PHASES == tuple(budget.how)
    assert budget.total_seconds == pytest.approx(sum(budget.phases.values()))


def test_the_published_loads_fit_inside_the_load_budget() -> None:
    # The checkpoint sizes are the same built-in tensor bytes hostmem's published peaks use.
    assert [size for size, _ in PUBLISHED_LOADS] == [size for size, _ in PUBLISHED_PEAKS]
    for size, seconds in PUBLISHED_LOADS:
        assert cold_start_budget(size).phases["loading_weights"] >= seconds
    bf16_size, bf16_seconds = PUBLISHED_LOADS[0]
    assert slowest_load_bytes_per_s() == pytest.approx(bf16_size / bf16_seconds)


def test_download_and_load_scale_with_the_checkpoint_and_the_rest_does_not() -> None:
    small, large = cold_start_budget(10**9), cold_start_budget(4 * 10**9)
    for phase in ("downloading", "loading_weights"):
        assert large.phases[phase] == pytest.approx(4 * small.phases[phase])
    for phase in ("starting", "profiling", "compiling", "canary"):
        assert large.phases[phase] == small.phases[phase]
    assert small.phases["canary"] == canary.TIMEOUT_S


def test_builtin_models_and_the_status_note() -> None:
    totals = {alias: cold_start_budget(builtin_facts(repo, "test").weight_bytes).total_seconds  # type: ignore[union-attr]
              for alias, repo in MODEL_ALIASES.items()}  # fmt: skip
    print(f"\ncold-start budgets: {', '.join(f'{a} {s:.0f} s' for a, s in totals.items())}")
    assert totals["bf16"] > totals["qat"]
    assert "budgeted at up to" in cold_budget_note(MODEL_ALIASES["qat"])
    assert cold_budget_note("/models/local-dir") == ""
