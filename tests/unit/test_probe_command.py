"""t4serve.commands.probe: the human summary of a Facts record, including figures the probe could not read."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sample_facts import no_gpu, t4

from t4serve.commands.probe import describe_facts
from t4serve.facts import Facts
from t4serve.planning.derived import format_bytes
from t4serve.probes.manifest import probe_manifest


def test_summary_names_gpu_host_disks_and_image() -> None:
    facts = t4()
    text = describe_facts(facts)
    assert "Tesla T4, capability 7.5" in text
    assert f"RAM {format_bytes(facts.host.mem_total_bytes or 0)}" in text
    assert all(f"disk:     {d.role} {d.path}:" in text for d in facts.host.disks)
    assert "unreadable" not in text


def test_unreadable_memory_and_disk_are_shown_with_their_reason() -> None:
    facts = no_gpu()
    host = replace(facts.host, mem_total_bytes=None, mem_available_bytes=None, swap_total_bytes=None,
                   swap_free_bytes=None, meminfo_unreadable="/proc/meminfo: No such file or directory")  # fmt: skip
    disk = replace(host.disks[0], free_bytes=None, total_bytes=None, filesystem_id=None,
                   unreadable="/cache/x (measured at /cache): Permission denied")  # fmt: skip
    facts = replace(facts, host=replace(host, disks=[disk, *host.disks[1:]]))
    text = describe_facts(facts)
    assert "RAM ? (? available), swap ? (? free); memory unreadable: /proc/meminfo: No such file" in text
    assert f"disk:     {disk.role} {disk.path}: unreadable: /cache/x (measured at /cache): Permission denied" in text
    # The record replays: the unreadable figures survive JSON.
    again = Facts.from_json(facts.to_json())
    assert again.host.meminfo_unreadable == host.meminfo_unreadable and again.host.disks[0] == disk


def test_a_missing_manifest_is_said_once(tmp_path: Path) -> None:
    """Issue 45: `probe` printed "no build manifest at X (no build manifest at X: ...)"."""
    manifest = probe_manifest(str(tmp_path / "build-manifest.json"))
    line = next(ln for ln in describe_facts(replace(t4(), manifest=manifest)).splitlines() if ln.startswith("image:"))
    assert line.count("no build manifest at") == 1 and str(tmp_path / "build-manifest.json") in line
