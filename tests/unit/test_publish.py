"""scripts/publish without a registry: its arguments and its pinning (`--pin-only`), run as a user runs them. The push
itself runs against a real registry in tests/image/test_publish.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from k8s_manifests import REPO, container, render

PUBLISH = REPO / "scripts" / "publish"
DIGEST = "sha256:" + "0123456789abcdef" * 4
# A user's kustomization as docs/kubernetes.md shows it, with comments that must survive the pin.
MINE = """# my t4serve (comment kept)
resources:
  - ../deploy/kubernetes/overlays/eks-g4dn
images:
  # the image
  - name: t4serve
    newName: REGISTRY/t4serve
    newTag: "0.1.0"
  - name: other
    newTag: "1"
# components next
components:
  - ../deploy/kubernetes/components/nvidia-device-plugin
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    # No DOCKER: argument errors and --pin-only never reach the engine.
    return subprocess.run([str(PUBLISH), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "DOCKER": "/nonexistent/docker"})  # fmt: skip


@pytest.fixture
def mine(tmp_path: Path) -> Path:
    (tmp_path / "deploy").symlink_to(REPO / "deploy")
    (tmp_path / "mine").mkdir()
    path = tmp_path / "mine" / "kustomization.yaml"
    path.write_text(MINE)
    return path


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("t4serve", "registry host first"),
        ("t4serve:0.1.0", "registry host first"),
        ("owner/t4serve:0.1.0", "registry host first"),  # Docker Hub by accident
        ("ghcr.io/Owner/t4serve", "must be lowercase"),
        ("ghcr.io/owner/t4serve@" + DIGEST, "a tag, not a digest"),
        ("ghcr.io/owner/t4serve:bad tag", "registry host first"),
    ],
)
def test_a_reference_it_cannot_push_is_refused_with_the_form_it_needs(ref: str, says: str, mine: Path) -> None:
    out = run("--kustomization", str(mine), ref)
    assert out.returncode == 2 and out.stdout == ""
    assert says in out.stderr and "required: scripts/publish" in out.stderr and "fix:" in out.stderr, out.stderr
    assert mine.read_text() == MINE


def test_pin_only_sets_the_digest_keeps_the_rest_and_renders(mine: Path) -> None:
    out = run("--pin-only", "--kustomization", str(mine), f"ghcr.io/owner/t4serve@{DIGEST}")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"ghcr.io/owner/t4serve@{DIGEST}\n"
    text = mine.read_text()
    assert "# my t4serve (comment kept)" in text and "# the image" in text and "# components next" in text
    data = yaml.safe_load(text)
    assert data["images"] == [{"name": "t4serve", "newName": "ghcr.io/owner/t4serve", "digest": DIGEST},
                              {"name": "other", "newTag": "1"}]  # fmt: skip
    assert data["components"] == ["../deploy/kubernetes/components/nvidia-device-plugin"]
    assert container(render(mine.parent))["image"] == f"ghcr.io/owner/t4serve@{DIGEST}"
    # Again, with another digest: the same entry changes, nothing is added.
    other = "sha256:" + "f" * 64
    assert run("--pin-only", "--kustomization", str(mine), f"127.0.0.1:5000/a/t4serve@{other}").returncode == 0
    data = yaml.safe_load(mine.read_text())
    assert data["images"][0] == {"name": "t4serve", "newName": "127.0.0.1:5000/a/t4serve", "digest": other}
    assert len(data["images"]) == 2
    assert sorted(p.name for p in mine.parent.iterdir()) == ["kustomization.yaml"]


def test_pin_only_adds_an_images_block_where_there_is_none(tmp_path: Path) -> None:
    (tmp_path / "deploy").symlink_to(REPO / "deploy")
    path = tmp_path / "kustomization.yaml"
    path.write_text("resources:\n  - deploy/kubernetes/overlays/gke-t4\n")
    assert run("--pin-only", "--kustomization", str(path), f"ghcr.io/o/t4serve@{DIGEST}").returncode == 0
    assert yaml.safe_load(path.read_text())["images"] == [{"name": "t4serve", "newName": "ghcr.io/o/t4serve",
                                                            "digest": DIGEST}]  # fmt: skip
    assert container(render(tmp_path))["image"] == f"ghcr.io/o/t4serve@{DIGEST}"


def test_pin_only_refuses_what_it_cannot_pin_and_leaves_the_file(mine: Path, tmp_path: Path) -> None:
    short = run("--pin-only", "--kustomization", str(mine), "ghcr.io/o/t4serve@sha256:abc")
    assert short.returncode == 2 and "64 hex digits" in short.stderr
    missing = run("--pin-only", "--kustomization", str(tmp_path / "nope.yaml"), f"ghcr.io/o/t4serve@{DIGEST}")
    assert missing.returncode == 2 and "not a file" in missing.stderr and "fix:" in missing.stderr
    twice = mine.read_text().replace("  - name: other", "  - name: t4serve")
    mine.write_text(twice)
    out = run("--pin-only", "--kustomization", str(mine), f"ghcr.io/o/t4serve@{DIGEST}")
    assert out.returncode == 2 and "2 images entries named t4serve" in out.stderr
    assert mine.read_text() == twice
    assert sorted(p.name for p in mine.parent.iterdir()) == ["kustomization.yaml"]
    assert run().returncode == 2 and run("--frobnicate", "x").returncode == 2


def test_without_kustomization_it_pins_the_repository_overlay(tmp_path: Path) -> None:
    """The script in a copy of the repository's layout: the default target is that checkout's pinned-digest overlay."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "publish"
    script.write_text(PUBLISH.read_text())
    script.chmod(0o755)
    (tmp_path / "scripts" / "pin_kustomization.py").write_text((REPO / "scripts" / "pin_kustomization.py").read_text())
    overlay = tmp_path / "deploy" / "kubernetes" / "overlays" / "pinned-digest"
    overlay.mkdir(parents=True)
    source = REPO / "deploy/kubernetes/overlays/pinned-digest/kustomization.yaml"
    (overlay / "kustomization.yaml").write_text(source.read_text())
    out = subprocess.run([str(script), "--pin-only", f"ghcr.io/o/t4serve@{DIGEST}"], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    pinned = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert pinned["images"] == [{"name": "t4serve", "newName": "ghcr.io/o/t4serve", "digest": DIGEST}]
    assert pinned["resources"] == yaml.safe_load(source.read_text())["resources"]


# Issue 44, item 7: a YAML edit of any kustomization kustomize reads, checked; the file's mode and link kept.

RESOURCE = "../deploy/kubernetes/overlays/gke-t4"
IPV6 = "[::1]:5000/t4serve"
# Kustomizations the text edit broke (ParserError, a repeated key) while exiting 0: each is pinned and rendered.
SHAPES = {
    "images at indent 0": f"resources:\n- {RESOURCE}\nimages:\n- name: other\n  newTag: \"1\"\n",
    "images at indent 4": f"resources:\n    - {RESOURCE}\nimages:\n    - name: t4serve\n      newTag: \"1\"\n",
    "images: []": f"resources:\n  - {RESOURCE}\nimages: []\n",
    "images: # comment": f"resources:\n  - {RESOURCE}\nimages: # the image, pinned by scripts/publish\n"
                         "# next: annotations\ncommonAnnotations:\n  team: ml\n",
    "a flow list": f"resources: [{RESOURCE}]\nimages: [{{name: other, newTag: \"1\"}}, {{name: t4serve, newTag: x}}]\n",
    "a flow mapping": f"{{resources: [{RESOURCE}]}}\n",
    "CRLF line ends": f"resources:\r\n  - {RESOURCE}\r\nimages:\r\n  - name: t4serve # ours\r\n    newTag: \"1\"\r\n",
    "an entry that is not first": f"images:\n  - newTag: \"1\"\n    name: t4serve\n  - name: x\n"
                                  f"resources:\n  - {RESOURCE}\n",
    "a document marker": f"---\nresources:\n  - {RESOURCE}\n...\n",
    "PyYAML's indent 4": f"resources:\n-   {RESOURCE}\nimages:\n-   name: other\n    newTag: '1'\n",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("repo", ["ghcr.io/owner/t4serve", IPV6])
def test_every_shape_of_images_is_pinned_and_renders(tmp_path: Path, shape: str, repo: str) -> None:
    (tmp_path / "deploy").symlink_to(REPO / "deploy")
    (tmp_path / "mine").mkdir()
    path = tmp_path / "mine" / "kustomization.yaml"
    path.write_bytes(SHAPES[shape].encode())
    before = yaml.safe_load(SHAPES[shape])
    out = run("--pin-only", "--kustomization", str(path), f"{repo}@{DIGEST}")
    assert out.returncode == 0, out.stderr
    after = yaml.safe_load(path.read_bytes())
    ours = {"name": "t4serve", "newName": repo, "digest": DIGEST}
    assert ours in after["images"] and sum(e.get("name") == "t4serve" for e in after["images"]) == 1
    assert {k: v for k, v in after.items() if k != "images"} == {k: v for k, v in before.items() if k != "images"}
    assert [e for e in after["images"] if e["name"] != "t4serve"] == \
        [e for e in before.get("images") or [] if e["name"] != "t4serve"]
    assert container(render(path.parent))["image"] == f"{repo}@{DIGEST}"
    for comment in ("# the image, pinned by scripts/publish", "# next: annotations"):
        assert comment not in SHAPES[shape] or comment in path.read_text()
    assert sorted(p.name for p in path.parent.iterdir()) == ["kustomization.yaml"]


def test_the_file_mode_and_a_symbolic_link_are_kept(mine: Path, tmp_path: Path) -> None:
    mine.chmod(0o640)
    link = tmp_path / "link.yaml"
    link.symlink_to(mine)
    out = run("--pin-only", "--kustomization", str(link), f"ghcr.io/o/t4serve@{DIGEST}")
    assert out.returncode == 0, out.stderr
    assert link.is_symlink() and link.resolve() == mine
    assert (mine.stat().st_mode & 0o777) == 0o640
    assert yaml.safe_load(mine.read_text())["images"][0]["digest"] == DIGEST


@pytest.mark.parametrize(("label", "body", "says"), [
    ("not UTF-8", MINE.encode().replace(b"comment kept", b"comment \xff kept"), "is not UTF-8 text"),
    ("not YAML", b"resources: [a\nimages:\n", "is not YAML kustomize can read"),
    ("a repeated key", (MINE + "images: []\n").encode(), "repeats a key"),
    ("a list", b"- a\n- b\n", "is not a YAML mapping"),
    ("images a string", b"images: t4serve\n", "images is not a list"),
    ("two documents", MINE.encode() + b"---\nx: 1\n", "several YAML documents"),
    ("an alias", b"x: &i [{name: a}]\nimages: *i\n", "is a YAML alias"),
])  # fmt: skip
def test_a_kustomization_it_cannot_edit_is_refused_with_exit_2_and_left_alone(mine: Path, label: str, body: bytes,
                                                                              says: str) -> None:
    mine.write_bytes(body)
    out = run("--pin-only", "--kustomization", str(mine), f"ghcr.io/o/t4serve@{DIGEST}")
    assert out.returncode == 2 and says in out.stderr and "fix:" in out.stderr, (label, out.stderr)
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert mine.read_bytes() == body and sorted(p.name for p in mine.parent.iterdir()) == ["kustomization.yaml"]


def test_a_fifo_at_the_kustomization_path_is_refused_at_once(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "kustomization.yaml"
    os.mkfifo(fifo)
    out = run("--pin-only", "--kustomization", str(fifo), f"ghcr.io/o/t4serve@{DIGEST}")
    assert out.returncode == 2 and "is not a regular file" in out.stderr, out.stderr


@pytest.mark.parametrize("value", ["abc", "-1", "0", "00", "604801", "1.5", " 60", "1e3", "\u0663"])
def test_a_push_timeout_that_is_no_bound_is_a_bad_setting(mine: Path, value: str) -> None:
    """`abc` and `-1` reached `timeout` after the engine check (a push failure, exit 1); `0` disabled the bound."""
    out = subprocess.run([str(PUBLISH), "--kustomization", str(mine), "ghcr.io/o/t4serve:1"], capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "DOCKER": "/nonexistent/docker",
                                                     "T4SERVE_PUSH_TIMEOUT_S": value})  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "T4SERVE_PUSH_TIMEOUT_S must be whole seconds from 1 to 604800" in out.stderr and "fix:" in out.stderr
    assert mine.read_text() == MINE
