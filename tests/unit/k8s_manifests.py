"""Render deploy/kubernetes with `kubectl kustomize` and read the rendered objects: the unit tests' rules and the image
tests' probe harness both look at what a cluster would receive, never at the source YAML."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
# Every kustomization a user may apply: the base and each overlay (found on disk, so a new overlay is tested too).
TARGETS = ["base", *sorted(f"overlays/{p.name}" for p in (DEPLOY / "overlays").iterdir() if p.is_dir())]
KUBECTL = os.environ.get("KUBECTL", "kubectl")
DOCS = REPO / "docs" / "kubernetes.md"
# A recipe in docs/kubernetes.md: a ```yaml block right after `<!-- recipe: NAME -->`, whose first line `# PATH`
# names the file; blocks of one name are the files of one recipe, laid out beside this repository's deploy/.
_RECIPE = re.compile(r"<!-- recipe: (\S+) -->\n```yaml\n(.*?)```", re.S)

Obj = dict[str, Any]
# The name of t4serve's own objects (Deployment, Service, NetworkPolicy...).
T4SERVE = "t4serve"


def renderer() -> list[str]:
    """`kubectl kustomize` (kustomize built in), else a standalone `kustomize build`."""
    kubectl = shutil.which(KUBECTL)
    if kubectl is not None:
        return [kubectl, "kustomize"]
    kustomize = shutil.which("kustomize")
    if kustomize is not None:
        return [kustomize, "build"]
    raise RuntimeError(
        f"neither kubectl (KUBECTL={KUBECTL}) nor kustomize is on PATH; the Kubernetes manifest tests render with "
        "kustomize. Fix: install kubectl >= 1.27 (https://kubernetes.io/docs/tasks/tools/) or kustomize v5, or set "
        "KUBECTL to kubectl's path"
    )


def render(directory: Path) -> list[Obj]:
    """`kubectl kustomize DIRECTORY`, parsed; a failure raises with kustomize's own message."""
    command = [*renderer(), str(directory)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {out.returncode}):\n{out.stderr}")
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def documented_recipes() -> dict[str, dict[str, str]]:
    """Each recipe docs/kubernetes.md shows: name -> {file path: text}."""
    recipes: dict[str, dict[str, str]] = {}
    for name, block in _RECIPE.findall(DOCS.read_text()):
        first, _, _ = block.partition("\n")
        assert first.startswith("# ") and first.endswith("kustomization.yaml"), f"recipe {name}: no `# PATH` line"
        recipes.setdefault(name, {})[first[2:].strip()] = block
    return recipes


def render_recipe(files: dict[str, str], folder: Path) -> list[Obj]:
    """Write a recipe's files under `folder` beside a link to this repository's deploy/, as a user would have them
    beside a checkout, and render its outermost kustomization."""
    (folder / "deploy").symlink_to(REPO / "deploy")
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    top = min(files, key=lambda path: path.count("/"))
    return render(folder / Path(top).parent)


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"].get("name"))]
    assert len(found) == 1, f"expected one {kind}{f' named {name}' if name else ''}, found {len(found)}"
    return found[0]


def deployment(objs: list[Obj]) -> Obj:
    """t4serve's Deployment (a render may hold another: components/inference-pool's endpoint picker)."""
    return one(objs, "Deployment", T4SERVE)


def kinds(objs: list[Obj]) -> list[str]:
    return [o["kind"] for o in objs]


def pod_spec(objs: list[Obj]) -> Obj:
    spec: Obj = deployment(objs)["spec"]["template"]["spec"]
    return spec


def container(objs: list[Obj]) -> Obj:
    containers = pod_spec(objs)["containers"]
    assert len(containers) == 1, f"expected one container, found {[c['name'] for c in containers]}"
    first: Obj = containers[0]
    return first


def settings_data(objs: list[Obj]) -> dict[str, str]:
    """The ConfigMap the container takes its settings from (envFrom), as the environment it becomes."""
    names = [src["configMapRef"]["name"] for src in container(objs).get("envFrom", []) if "configMapRef" in src]
    maps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    data: dict[str, str] = {}
    for name in names:
        data.update(maps[name].get("data", {}))
    return data


_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_FACTORS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9,
            "T": 10**12}  # fmt: skip


def quantity_bytes(text: str | int) -> int:
    """A Kubernetes memory quantity ("13Gi", "2G", 1024) in bytes."""
    match = _QUANTITY.match(str(text))
    if not match:
        raise ValueError(f"not a memory quantity: {text!r}")
    return int(float(match.group(1)) * _FACTORS[match.group(2)])


def probe_budget_s(probe: Obj) -> int:
    """Seconds from container start until a probe with these numbers gives up: initial delay + period x threshold."""
    return int(probe.get("initialDelaySeconds", 0)) + int(probe.get("periodSeconds", 10)) * int(
        probe.get("failureThreshold", 3)
    )


def prestop_seconds(ctr: Obj) -> int:
    """The preStop hook's sleep, from either spelling: `exec: sleep N` or the built-in `sleep: {seconds: N}`."""
    hook = ctr.get("lifecycle", {}).get("preStop")
    if hook is None:
        return 0
    if "sleep" in hook:
        return int(hook["sleep"]["seconds"])
    command = hook["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2, f"preStop is not a plain sleep: {command}"
    return int(command[1])


# ------------------------------------------------------------------------------------- overlays with components

COMPONENTS = DEPLOY / "components"
# What each cloud overlay is combined with in the tests (and in the policy scan): the components that make sense on that
# cloud, alone and together, as docs/kubernetes.md describes them. Each tuple lists components in the order they go
# into a kustomization's `components:`.
COMMON_SETS: tuple[tuple[str, ...], ...] = (
    (),
    ("namespace",),
    ("rwx-cache",),
    ("monitoring", "keda"),
    ("monitoring", "hpa"),
    ("monitoring", "keda", "keda-scale-to-zero"),
    ("gateway",),
    ("ingress",),
    ("inference-pool",),
    ("monitoring", "keda", "inference-pool"),
)
CLOUD_SETS: dict[str, tuple[tuple[str, ...], ...]] = {
    "gke-t4": (("monitoring-gmp",), ("gateway-gke",),
               ("namespace", "monitoring-gmp", "keda", "keda-scale-to-zero", "gateway-gke"), ("inference-pool-gke",),
               ("namespace", "monitoring-gmp", "keda", "keda-scale-to-zero", "inference-pool-gke")),
    "gke-autopilot": (("monitoring-gmp",), ("gateway-gke",),
                      ("namespace", "monitoring-gmp", "keda", "keda-scale-to-zero", "gateway-gke"),
                      ("inference-pool-gke",), ("monitoring-gmp", "inference-pool-gke")),
    "eks-g4dn": (("nvidia-device-plugin",),
                 ("namespace", "nvidia-device-plugin", "monitoring", "keda", "keda-scale-to-zero", "ingress")),
    "aks-t4": (("nvidia-device-plugin",),
               ("namespace", "nvidia-device-plugin", "monitoring", "hpa", "ingress")),
    "pinned-digest": (("monitoring", "keda"),),
}  # fmt: skip


def combinations() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (overlay, components): every cloud overlay with every set that applies to it."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for overlay, sets in CLOUD_SETS.items():
        for components in (*COMMON_SETS, *sets):
            out[f"{overlay}+{'+'.join(components) or 'nothing'}"] = (overlay, components)
    return out


def render_combination(overlay: str, components: tuple[str, ...], folder: Path,
                       namespace: str | None = None) -> list[Obj]:
    """A user's kustomization (beside a link to deploy/) over `overlay` with `components`; with `namespace`, laid out as
    docs/kubernetes.md says: the namespace set in a kustomization of its own below the one that adds the components."""
    (folder / "deploy").symlink_to(REPO / "deploy")
    base = f"../deploy/kubernetes/overlays/{overlay}"
    if namespace is not None:
        (folder / "app").mkdir()
        (folder / "app" / "kustomization.yaml").write_text(f"namespace: {namespace}\nresources:\n  - {base}\n")
        base = "../app"
    lines = ["resources:", f"  - {base}"]
    if components:
        lines += ["components:", *(f"  - ../deploy/kubernetes/components/{c}" for c in components)]
    (folder / "mine").mkdir()
    (folder / "mine" / "kustomization.yaml").write_text("\n".join(lines) + "\n")
    return render(folder / "mine")
