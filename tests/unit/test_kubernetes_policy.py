"""Checkov, a maintained policy scanner for Kubernetes manifests, over every render of deploy/kubernetes: each
kustomization, each recipe docs/kubernetes.md shows and each cloud overlay with each component set that applies to
it. With deploy/kubernetes/checkov.yaml it must fail nothing; each check that file skips carries its reason in a
comment above it, and must still fail some render without its skip (so a skip nothing needs any more is caught).
Checkov runs from its own virtual environment (scripts/test makes .venv-checkov), offline (--skip-download)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_manifests import (
    DEPLOY,
    REPO,
    TARGETS,
    combinations,
    documented_recipes,
    render,
    render_combination,
    render_recipe,
)

CONFIG = DEPLOY / "checkov.yaml"
CHECKOV = os.environ.get("CHECKOV", str(REPO / ".venv-checkov" / "bin" / "checkov"))


def checkov_bin() -> str:
    if not os.access(CHECKOV, os.X_OK):
        pytest.fail(
            f"checkov not found at {CHECKOV} (CHECKOV); the manifests' policy scan needs it. Fix: run scripts/test, "
            "which makes .venv-checkov, or `python3 -m venv .venv-checkov && .venv-checkov/bin/pip install "
            "checkov==3.3.30`"
        )
    return CHECKOV


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Every render as a YAML file, named after what it rendered."""
    folder = tmp_path_factory.mktemp("renders")
    out = []
    sources = {t: render(DEPLOY / t) for t in TARGETS}
    for name, files in documented_recipes().items():
        sources[f"recipe-{name}"] = render_recipe(files, tmp_path_factory.mktemp(f"recipe-{name}"))
    # Every cloud overlay with every component set that applies to it (tests/unit/k8s_manifests.py).
    for name, (overlay, components) in combinations().items():
        sources[f"combo-{name}"] = render_combination(overlay, components, tmp_path_factory.mktemp("combo"))
    for name, objs in sources.items():
        path = folder / (name.replace("/", "-") + ".yaml")
        path.write_text(yaml.safe_dump_all(objs, sort_keys=False))
        out.append(path)
    return out


def scan(files: list[Path], config: Path) -> list[dict[str, Any]]:
    """Checkov's failed checks over `files` with `config`, as (check_id, file, resource) records."""
    command = [checkov_bin(), "--config-file", str(config), "--output", "json", "--quiet"]
    for path in files:
        command += ["-f", str(path)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "LOG_LEVEL": "ERROR"})
    assert out.returncode in (0, 1), f"checkov failed to run (exit {out.returncode}):\n{out.stderr[-3000:]}"
    reports = json.loads(out.stdout) if out.stdout.strip() else []
    reports = reports if isinstance(reports, list) else [reports]
    failed: list[dict[str, Any]] = []
    scanned = 0
    for report in reports:
        if report.get("check_type") != "kubernetes":
            continue
        summary = report["summary"]
        assert summary["parsing_errors"] == 0, summary
        scanned += summary["resource_count"]
        failed += report["results"]["failed_checks"]
    assert scanned > 0, f"checkov scanned no resource:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return failed


def skips_with_reasons() -> dict[str, str]:
    """checkov.yaml's skip-check entries, each with the comment lines right above it (its reason)."""
    lines = CONFIG.read_text().splitlines()
    start = lines.index("skip-check:")
    skips: dict[str, str] = {}
    reason: list[str] = []
    for line in lines[start + 1 :]:
        if line.strip().startswith("#"):
            reason.append(line.strip().lstrip("# "))
        elif m := re.fullmatch(r"\s+- (CKV2?_K8S_\d+)", line):
            skips[m.group(1)] = " ".join(reason)
            reason = []
        elif line.strip():
            break
    assert yaml.safe_load(CONFIG.read_text())["skip-check"] == list(skips), "a skip-check entry is not `  - ID`"
    return skips


def test_every_render_passes_every_check_that_is_not_skipped(renders: list[Path]) -> None:
    failed = scan(renders, CONFIG)
    lines = [f"{f['check_id']} {f['check_name']}: {f['resource']} in {Path(f['file_path']).name}" for f in failed]
    assert lines == []


def test_every_skip_has_a_reason_and_is_still_needed(renders: list[Path], tmp_path: Path) -> None:
    skips = skips_with_reasons()
    assert skips, "checkov.yaml skips nothing: then this test has nothing to check"
    for check, reason in skips.items():
        assert len(reason) > 40, f"{check}: its reason is missing or too short: {reason!r}"
    config = yaml.safe_load(CONFIG.read_text())
    del config["skip-check"]
    unskipped = tmp_path / "checkov-no-skips.yaml"
    unskipped.write_text(yaml.safe_dump(config))
    failing = {f["check_id"] for f in scan(renders, unskipped)}
    print(f"\nchecks failing without their skips: {sorted(failing)}")
    assert set(skips) <= failing, f"skipped but failing nowhere (drop the skip): {sorted(set(skips) - failing)}"
    # And nothing fails that is not skipped (the first test, again, from the other side).
    assert failing <= set(skips)


def test_the_scan_fails_a_broken_manifest(renders: list[Path], tmp_path: Path) -> None:
    """The scan reads the objects: a privileged container with the host's network fails it."""
    objs = list(yaml.safe_load_all(renders[0].read_text()))
    deployment = next(o for o in objs if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    pod["containers"][0]["securityContext"]["privileged"] = True
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    failed = {f["check_id"] for f in scan([broken], CONFIG)}
    assert {"CKV_K8S_16", "CKV_K8S_19"} <= failed, failed
