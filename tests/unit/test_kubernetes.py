"""deploy/kubernetes: every kustomization renders with `kubectl kustomize`, every rendered object validates offline
(Kubernetes' own schemas from kubernetes-validate at pinned versions; KEDA's and prometheus-operator's CRDs against
schemas derived from their upstream CRDs, in tests/unit/data/crd), and rules hold over the rendered YAML with their
numbers recomputed from t4serve's code: a manifest that drifts from the code fails here. Each rule also has a test
that breaks the rendered object on purpose and sees the rule catch it, so no rule passes by looking at nothing."""

from __future__ import annotations

import configparser
import copy
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from k8s_manifests import (
    DEPLOY,
    T4SERVE,
    TARGETS,
    Obj,
    container,
    deployment,
    documented_recipes,
    kinds,
    one,
    pod_spec,
    prestop_seconds,
    probe_budget_s,
    quantity_bytes,
    render,
    render_recipe,
    settings_data,
)
from local_http import Canned, serve

from t4serve import preflight
from t4serve.config.aliases import MODEL_ALIASES
from t4serve.config.settings import VARIABLES_BY_NAME, Settings
from t4serve.gpus import THROTTLE_REASONS
from t4serve.planning import hostmem
from t4serve.probes.checkpoint import builtin_facts
from t4serve.supervise import telemetry
from t4serve.supervise.health import DEADLINE_S
from t4serve.supervise.render import SupervisorInputs, render_supervisord_conf
from t4serve.supervise.startbudget import MIN_DOWNLOAD_BYTES_PER_S, cold_start_budget
from t4serve.supervise.state import RunSpec, new_state, write_state

# The Kubernetes minors the built-in objects are checked against: the oldest the manifests promise to work on (every
# field they use is GA in 1.32; kubectl 1.32 is what they were written with) and the newest kubernetes-validate 1.37.0
# ships.
K8S_VERSIONS = ("1.32", "1.37")
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobject_v1alpha1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_podmonitor_v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrule_v1.json",
    # Derived whole from their upstream CRDs by tests/unit/data/crd/derive.py (each file's $comment names the commit).
    ("gateway.networking.k8s.io/v1", "Gateway"): "gateway.networking.k8s.io_gateway_v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "gateway.networking.k8s.io_httproute_v1.json",
    ("monitoring.googleapis.com/v1", "PodMonitoring"): "monitoring.googleapis.com_podmonitoring_v1.json",
    ("monitoring.googleapis.com/v1", "Rules"): "monitoring.googleapis.com_rules_v1.json",
    ("networking.gke.io/v1", "HealthCheckPolicy"): "networking.gke.io_healthcheckpolicy_v1.json",
    ("networking.gke.io/v1", "GCPBackendPolicy"): "networking.gke.io_gcpbackendpolicy_v1.json",
    ("inference.networking.k8s.io/v1", "InferencePool"): "inference.networking.k8s.io_inferencepool_v1.json",
}
# Kinds that live outside any namespace; every other kind rendered here must carry one.
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "StorageClass", "PersistentVolume",
                  "CustomResourceDefinition", "PriorityClass"}  # fmt: skip
# Cluster infrastructure a component brings, which stays in kube-system whatever namespace t4serve uses: NVIDIA's
# device plugin (components/nvidia-device-plugin).
KUBE_SYSTEM_OBJECTS = {("DaemonSet", "nvidia-device-plugin-daemonset")}
# What pulling the image may take on the slowest link t4serve's start budget assumes (preflight.IMAGE_BYTES at
# startbudget.MIN_DOWNLOAD_BYTES_PER_S): part of a rollout's turn, with the old pod's grace and the new pod's start.
IMAGE_PULL_S = preflight.IMAGE_BYTES / MIN_DOWNLOAD_BYTES_PER_S
# Where the image writes (besides /cache and /dev/shm) under a read-only root: T4SERVE_STATE_DIR's /tmp and HOME.
WRITABLE_PATHS = ("/tmp", "/home/t4serve")
# The PVC annotation components/rwx-cache reads its class from, and the base's value (no class chosen).
RWX_CLASS_ANNOTATION = "t4serve/rwx-storage-class"
RWX_CLASS_UNSET = "set-t4serve-rwx-storage-class"
CRD_DIR = Path(__file__).parent / "data" / "crd"
# supervisord's own default for a program without stopwaitsecs (the listener's section has none).
SUPERVISORD_DEFAULT_STOPWAITSECS = 10
# Beyond preStop and supervisord's longest stop: the kubelet's SIGKILL, PID 1's reaping and the process exit.
GRACE_MARGIN_S = 10
# A probe's exec runs a fresh Python (`t4serve healthcheck` starts in about 0.1 s in the image): a second of room.
PROBE_START_S = 1.0
HEALTHCHECK = ["t4serve", "healthcheck"]
LIVENESS = ["t4serve", "healthcheck", "--liveness"]
SECRET_VARIABLES = ("HF_TOKEN", "T4SERVE_API_KEY", "VLLM_API_KEY")
SECRET_FILE_VARIABLES = ("HF_TOKEN_FILE", "T4SERVE_API_KEY_FILE")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {target: render(DEPLOY / target) for target in TARGETS}


@pytest.fixture(scope="module")
def recipes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Obj]]:
    """Every recipe docs/kubernetes.md shows, written out as it stands and rendered."""
    return {name: render_recipe(files, tmp_path_factory.mktemp(f"recipe-{name}"))
            for name, files in documented_recipes().items()}  # fmt: skip


# ------------------------------------------------------------------------------------------------ render and validate


def test_every_kustomization_renders_the_objects_it_promises(rendered: dict[str, list[Obj]]) -> None:
    # No Namespace: the base does not own it (components/namespace adds it), so `kubectl delete -k` never deletes it.
    base = ["ConfigMap", "Service", "PersistentVolumeClaim", "Deployment", "PodDisruptionBudget", "NetworkPolicy"]
    monitoring = ["PodMonitor", "PrometheusRule", "ConfigMap"]
    expected = {
        "base": base,
        "overlays/gke-t4": base,
        "overlays/gke-autopilot": base,
        # A fresh EKS cluster marks no class as default: the overlay brings the cache's own (cluster-scoped).
        "overlays/eks-g4dn": [*base, "StorageClass"],
        "overlays/aks-t4": base,
        "overlays/pinned-digest": base,
        "overlays/autoscaling": [*base, *monitoring, "ScaledObject"],
        "overlays/autoscaling-hpa": [*base, *monitoring, "HorizontalPodAutoscaler"],
    }
    assert sorted(rendered) == sorted(expected), "a new overlay needs its expected objects here"
    for target, objs in rendered.items():
        assert sorted(kinds(objs)) == sorted(expected[target]), target
        assert namespace_problems(objs) == [], target
        for obj in objs:
            if obj["kind"] not in CLUSTER_SCOPED:
                assert obj["metadata"].get("namespace") == "t4serve", (target, obj["kind"])
            assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "t4serve", (target, obj["kind"])


def validation_errors(obj: Obj, version: str) -> list[str]:
    key = (obj["apiVersion"], obj["kind"])
    if key in CRD_SCHEMAS:
        schema = json.loads((CRD_DIR / CRD_SCHEMAS[key]).read_text())
        validator = jsonschema.Draft202012Validator(schema)
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
        if not obj.get("metadata", {}).get("name"):
            errors.append("metadata.name: missing")
        return errors
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [str(exc)]
    return []


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_object_validates_offline(rendered: dict[str, list[Obj]], version: str) -> None:
    problems = [
        f"{target} {obj['kind']}/{obj['metadata'].get('name')}: {error}"
        for target, objs in rendered.items()
        for obj in objs
        for error in validation_errors(obj, version)
    ]
    assert problems == []


def test_the_validators_reject_broken_objects(rendered: dict[str, list[Obj]]) -> None:
    objs = copy.deepcopy(rendered["overlays/autoscaling"])
    server, scaled, monitor = deployment(objs), one(objs, "ScaledObject"), one(objs, "PodMonitor")
    typo = copy.deepcopy(server)
    typo["spec"]["template"]["spec"]["enableServiceLink"] = False
    wrong_type = copy.deepcopy(server)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8000"
    int_threshold = copy.deepcopy(scaled)
    int_threshold["spec"]["triggers"][0]["metadata"]["threshold"] = 4
    no_target = copy.deepcopy(scaled)
    del no_target["spec"]["scaleTargetRef"]
    bad_interval = copy.deepcopy(monitor)
    bad_interval["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"
    unknown = copy.deepcopy(monitor)
    unknown["spec"]["podMetricEndpoints"] = []
    for broken in (typo, wrong_type, int_threshold, no_target, bad_interval, unknown):
        assert validation_errors(broken, K8S_VERSIONS[0]), broken["kind"]


def test_every_documented_recipe_renders_valid_objects_that_hold_every_rule(recipes: dict[str, list[Obj]]) -> None:
    # What the docs show: a cloud overlay alone, each with the autoscaling components, the RWX class named by hand, and
    # another namespace (two kustomizations). A renamed or dropped recipe fails here rather than going untested.
    assert {"gke", "gke-autopilot", "eks", "aks", "gke-autoscaling", "aks-autoscaling-hpa", "eks-own-rwx-class",
            "another-namespace", "monitoring-own-release", "shared-gateway", "aks-ingress"} <= set(recipes)
    for name, objs in recipes.items():
        assert namespace_problems(objs) == [], name
        assert deployment_problems(objs) == [], name
        assert storage_problems(objs) == [], name
        for version in K8S_VERSIONS:
            assert [e for obj in objs for e in validation_errors(obj, version)] == [], (name, version)
    # Each cloud's first apply: its overlay, and on EKS and AKS NVIDIA's device plugin.
    assert "DaemonSet" in kinds(recipes["eks"]) and "DaemonSet" in kinds(recipes["aks"])
    assert "StorageClass" in kinds(recipes["eks"]) and "DaemonSet" not in kinds(recipes["gke-autopilot"])
    assert {one(recipes[n], kind)["metadata"]["labels"]["release"] for n in ("monitoring-own-release",)
            for kind in ("PodMonitor", "PrometheusRule")} == {"prometheus"}  # fmt: skip
    assert one(recipes["shared-gateway"], "HTTPRoute")["spec"]["parentRefs"][0]["namespace"] == "gateway-system"
    assert one(recipes["aks-ingress"], "Ingress")["spec"]["ingressClassName"] == "azure-application-gateway"
    scaled = recipes["gke-autoscaling"]
    assert {"ScaledObject", "PodMonitor", "PrometheusRule"} <= set(kinds(scaled)) and pod_spec(scaled)["nodeSelector"]
    assert one(scaled, "PersistentVolumeClaim")["spec"]["storageClassName"] == "standard-rwx"
    assert one(recipes["aks-autoscaling-hpa"], "PersistentVolumeClaim")["spec"]["storageClassName"] == "azurefile-csi"
    assert one(recipes["eks-own-rwx-class"], "PersistentVolumeClaim")["spec"]["storageClassName"] == "my-efs-class"
    # Another namespace: every object there, the Namespace created with Pod Security's labels, the query following.
    moved = recipes["another-namespace"]
    assert {o["metadata"].get("namespace") for o in moved if o["kind"] != "Namespace"} == {"team-a"}
    namespace = one(moved, "Namespace")["metadata"]
    assert namespace["name"] == "team-a" and namespace["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert 'namespace="team-a"' in one(moved, "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]


def test_the_namespace_rule_catches_an_object_left_outside(recipes: dict[str, list[Obj]]) -> None:
    """The defect the docs' cloud + autoscaling recipe had: component objects rendered without a namespace."""
    for kind in ("ScaledObject", "PodMonitor", "PrometheusRule"):
        objs = copy.deepcopy(recipes["gke-autoscaling"])
        del one(objs, kind)["metadata"]["namespace"]
        assert any(p.startswith(f"{kind}/t4serve: namespace None") for p in namespace_problems(objs)), kind
    objs = copy.deepcopy(recipes["another-namespace"])
    one(objs, "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"] = 'sum(x{namespace="t4serve"})'
    assert any("does not count namespace 'team-a'" in p for p in namespace_problems(objs))
    objs = copy.deepcopy(recipes["another-namespace"])
    one(objs, "Namespace")["metadata"]["name"] = "t4serve"
    assert any("creates a namespace other than" in p for p in namespace_problems(objs))


def storage_problems(objs: list[Obj]) -> list[str]:
    """A ReadWriteMany claim names a storage class that was chosen (RWX needs one on every major cloud)."""
    claim = one(objs, "PersistentVolumeClaim")["spec"]
    if "ReadWriteMany" not in claim["accessModes"]:
        return []
    cls = claim.get("storageClassName")
    if not cls or cls == RWX_CLASS_UNSET:
        return [f"storage: the ReadWriteMany claim's class is {cls!r}: set {RWX_CLASS_ANNOTATION} or the class"]
    return []


def test_rwx_claims_name_their_class(rendered: dict[str, list[Obj]], recipes: dict[str, list[Obj]]) -> None:
    # The cloud overlays choose it for components/rwx-cache; the cloud-neutral overlays leave it unset on purpose,
    # where the claim stays Pending with a message naming the setting.
    expected = {"overlays/gke-t4": "standard-rwx", "overlays/gke-autopilot": "standard-rwx",
                "overlays/eks-g4dn": "efs-sc", "overlays/aks-t4": "azurefile-csi",
                "base": RWX_CLASS_UNSET, "overlays/pinned-digest": RWX_CLASS_UNSET}  # fmt: skip
    # ReadWriteOnce: the cluster's default class (no storageClassName at all; "" would mean none), except on EKS, where
    # a fresh cluster has no default class and the overlay names its own.
    rwo_class = {"overlays/eks-g4dn": "t4serve-gp3"}
    for target, cls in expected.items():
        claim = one(rendered[target], "PersistentVolumeClaim")
        assert claim["metadata"]["annotations"][RWX_CLASS_ANNOTATION] == cls, target
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"], target
        assert claim["spec"].get("storageClassName") == rwo_class.get(target), target
    for target in ("overlays/autoscaling", "overlays/autoscaling-hpa"):
        assert one(rendered[target], "PersistentVolumeClaim")["spec"]["storageClassName"] == RWX_CLASS_UNSET
        assert storage_problems(rendered[target]) != []
    objs = copy.deepcopy(recipes["gke-autoscaling"])
    del one(objs, "PersistentVolumeClaim")["spec"]["storageClassName"]
    assert storage_problems(objs) != []


# ------------------------------------------------------------------------------------------------------- namespaces


def namespace_problems(objs: list[Obj]) -> list[str]:
    """Every namespaced object has a namespace, all the same one (the Deployment's) but the device plugin's (in
    kube-system), and the KEDA query counts the queue of that namespace."""
    namespace = deployment(objs)["metadata"].get("namespace")
    problems = [] if namespace else ["Deployment: no namespace"]
    for obj in objs:
        where = f"{obj['kind']}/{obj['metadata'].get('name')}"
        if (obj["kind"], obj["metadata"].get("name")) in KUBE_SYSTEM_OBJECTS:
            if obj["metadata"].get("namespace") != "kube-system":
                problems.append(f"{where}: namespace {obj['metadata'].get('namespace')!r}, it belongs in kube-system")
        elif obj["kind"] in CLUSTER_SCOPED:
            if obj["kind"] == "Namespace" and obj["metadata"]["name"] != namespace:
                problems.append(f"{where}: creates a namespace other than the Deployment's {namespace}")
        elif obj["metadata"].get("namespace") != namespace:
            got = obj["metadata"].get("namespace")
            problems.append(f"{where}: namespace {got!r}, the Deployment's is {namespace!r}")
        if obj["kind"] == "RoleBinding":
            for subject in obj.get("subjects", []):
                if subject["kind"] == "ServiceAccount" and subject.get("namespace") != namespace:
                    problems.append(f"{where}: binds ServiceAccount {subject['name']} of namespace "
                                    f"{subject.get('namespace')!r}, its own is {namespace!r}")  # fmt: skip
        if obj["kind"] == "ScaledObject":
            for trigger in obj["spec"]["triggers"]:
                if trigger["type"] != "prometheus":
                    continue  # a schedule (components/keda-scale-to-zero) counts no queue
                query = trigger["metadata"].get("query", "")
                if f'namespace="{namespace}"' not in query:
                    problems.append(f"{where}: query {query!r} does not count namespace {namespace!r}")
    return problems


# --------------------------------------------------------------------------------------------------- network policy


def _selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions) against labels; {} selects everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values, "Exists": key in labels,
              "DoesNotExist": key not in labels}[op]  # fmt: skip
        if not ok:
            return False
    return True


def admits(policy: Obj, pod: Obj, ports: dict[str, int], source_namespace: str, source_labels: dict[str, str],
           port: int) -> bool:  # fmt: skip
    """Whether NetworkPolicy `policy` (in the pod's namespace) lets a pod with `source_labels` in `source_namespace`
    reach `pod` (its template: labels and named ports) on TCP `port`: Kubernetes' ingress semantics (a rule's peers
    are ORed, its ports ORed, a missing `from` or `ports` means all; podSelector alone is this namespace,
    namespaceSelector alone all pods of the namespaces it picks, both together pods of those namespaces). Namespaces
    are matched by the label Kubernetes gives each, kubernetes.io/metadata.name. ipBlock peers admit no pod here."""
    namespace = policy["metadata"]["namespace"]
    spec = policy["spec"]
    if not _selects(spec["podSelector"], pod["metadata"]["labels"]) or "Ingress" not in spec.get("policyTypes", []):
        return True
    ns_labels = {"kubernetes.io/metadata.name": source_namespace, **NAMESPACE_LABELS.get(source_namespace, {})}
    for rule in spec.get("ingress", []):
        rule_ports = rule.get("ports")
        if rule_ports is not None and not any(
            p.get("protocol", "TCP") == "TCP" and (ports.get(p["port"]) if isinstance(p["port"], str) else p["port"])
            == port for p in rule_ports
        ):  # fmt: skip
            continue
        peers = rule.get("from")
        if peers is None:
            return True
        for peer in peers:
            if "ipBlock" in peer:
                continue
            if "namespaceSelector" in peer:
                in_namespace = _selects(peer["namespaceSelector"], ns_labels)
            else:
                in_namespace = source_namespace == namespace
            if in_namespace and _selects(peer.get("podSelector", {}), source_labels):
                return True
    return False


# The labels the namespaces below carry besides kubernetes.io/metadata.name: the gateway's proxies run in a namespace
# its operator labelled `t4serve/gateway=true`; ingress-nginx's namespace, unlabelled, is admitted no more.
NAMESPACE_LABELS = {"envoy-gateway-system": {"t4serve/gateway": "true"}}
# The declared exposure: (source namespace or "SAME", port name) -> admitted. Prometheus runs in `monitoring`
# (base/networkpolicy.yaml says how to change it).
EXPOSURE = {
    ("SAME", "http"): True, ("SAME", "telemetry"): False,
    ("envoy-gateway-system", "http"): True, ("envoy-gateway-system", "telemetry"): False,
    ("ingress-nginx", "http"): False, ("ingress-nginx", "telemetry"): False,
    ("monitoring", "http"): True, ("monitoring", "telemetry"): True,
    ("kube-system", "http"): False, ("other-team", "http"): False, ("other-team", "telemetry"): False,
}  # fmt: skip


def network_problems(objs: list[Obj]) -> list[str]:
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    if not policies:
        return ["network: no NetworkPolicy selects the pods"]
    pod = deployment(objs)["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    namespace = deployment(objs)["metadata"]["namespace"]
    problems = []
    # Each policy selects a workload's pods by label, t4serve's or another of the render (components/inference-pool's
    # endpoint picker), never the whole namespace.
    workloads = [o["spec"]["template"]["metadata"]["labels"] for o in objs if o["kind"] == "Deployment"]
    for policy in policies:
        selector = policy["spec"]["podSelector"]
        if selector == {} or not any(_selects(selector, labels) for labels in workloads):
            name = policy["metadata"]["name"]
            problems.append(f"network: NetworkPolicy {name} must select the t4serve pods (or another workload's) "
                            "by label")  # fmt: skip
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], pod["metadata"]["labels"])]

    def reaches(src: str, port: int) -> bool:
        # No policy selecting the pod: all traffic. Several: the union of what they admit.
        return not selecting or any(admits(p, pod, ports, src, {"app": "client"}, port) for p in selecting)

    for (source, name), expected in EXPOSURE.items():
        src = namespace if source == "SAME" else source
        got = reaches(src, ports[name])
        if got != expected:
            problems.append(f"network: a pod in {src} {'reaches' if got else 'cannot reach'} port {name}")
    # Any port the container does not declare is closed to everyone, the pod's own namespace included.
    if reaches(namespace, 1 + max(ports.values())):
        problems.append("network: an undeclared port is open")
    return problems


# ----------------------------------------------------------------------------------------------------------- rules


def settings_of(objs: list[Obj]) -> Settings:
    """The ConfigMap's settings, parsed by t4serve's own table (a bad value fails here as it would in the pod)."""
    return Settings.from_environ(settings_data(objs), cwd="/")


def worst_stop_s(settings: Settings) -> int:
    """The longest stop supervisord allows for what `serve` renders with these settings: each program's stopwaitsecs,
    added up (supervisord stops its groups one after another)."""
    conf = render_supervisord_conf(
        SupervisorInputs(t4serve=("t4serve",), state_dir=settings.state_dir, spec_path="/tmp/run-spec.json",
                         shutdown_timeout=settings.shutdown_timeout, max_restarts=settings.max_restarts,
                         restart_window=settings.restart_window, telemetry_host=settings.telemetry_host,
                         telemetry_port=settings.telemetry_port)
    )
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(conf)
    return sum(
        parser.getint(section, "stopwaitsecs", fallback=SUPERVISORD_DEFAULT_STOPWAITSECS)
        for section in parser.sections()
        if section.startswith(("program:", "eventlistener:"))
    )


def worst_start_s(settings: Settings) -> float:
    """The cold-start budget of the larger of the built-in models (switching T4SERVE_MODEL needs no manifest edit),
    and of the configured model when it is neither."""
    repos = {*MODEL_ALIASES.values(), settings.model.target}
    budgets = []
    for repo in repos:
        facts = builtin_facts(repo, "kubernetes rule test")
        if facts is not None:
            budgets.append(cold_start_budget(facts.weight_bytes).total_seconds)
    return max(budgets)


def _exec(probe: Obj | None) -> list[str] | None:
    return None if probe is None else list(probe.get("exec", {}).get("command", [])) or None


def deployment_problems(objs: list[Obj]) -> list[str]:
    """Every rule over the rendered pod, as a list of what is wrong (empty when all hold)."""
    problems: list[str] = []
    spec = pod_spec(objs)
    ctr = container(objs)
    settings = settings_of(objs)

    # One GPU per pod: t4serve plans for one device (--tensor-parallel-size 1).
    limits, requests = ctr.get("resources", {}).get("limits", {}), ctr.get("resources", {}).get("requests", {})
    if str(limits.get("nvidia.com/gpu")) != "1":
        problems.append(f"GPU: limits nvidia.com/gpu is {limits.get('nvidia.com/gpu')!r}, t4serve serves one GPU")
    if "nvidia.com/gpu" in requests and str(requests["nvidia.com/gpu"]) != "1":
        problems.append(f"GPU: requests nvidia.com/gpu is {requests['nvidia.com/gpu']!r}")
    if len(spec["containers"]) != 1 or spec.get("initContainers"):
        problems.append("GPU: one container per pod (the GPU's only user)")

    # /dev/shm: a memory-backed emptyDir of at least what preflight asks for.
    mounts = {m["mountPath"]: m for m in ctr.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    shm = volumes.get(mounts.get("/dev/shm", {}).get("name", ""), {}).get("emptyDir")
    if shm is None or shm.get("medium") != "Memory":
        problems.append("shm: /dev/shm is not an emptyDir of medium Memory")
    elif quantity_bytes(shm.get("sizeLimit", 0)) < preflight.SHM_RECOMMENDED:
        problems.append(f"shm: sizeLimit {shm.get('sizeLimit')} < preflight's {preflight.SHM_RECOMMENDED} B")

    # Service links: VLLM_PORT from a Service named vllm breaks vLLM.
    if spec.get("enableServiceLinks") is not False:
        problems.append("enableServiceLinks: must be false")
    if any(o["kind"] == "Service" and o["metadata"]["name"] == "vllm" for o in objs):
        problems.append("Service: named vllm")

    # Probes: the canary-aware healthcheck, with time for its HTTP calls.
    startup, ready, live = ctr.get("startupProbe"), ctr.get("readinessProbe"), ctr.get("livenessProbe")
    if _exec(startup) != HEALTHCHECK or _exec(ready) != HEALTHCHECK:
        problems.append(f"probes: startup and readiness must run {HEALTHCHECK}")
    if _exec(live) != LIVENESS:
        problems.append(f"probes: liveness must run {LIVENESS} (the plain healthcheck fails while loading)")
    # The healthcheck's deadline bounds the whole check, however many requests it sends.
    for name, probe in (("startup", startup), ("readiness", ready), ("liveness", live)):
        if probe is not None and int(probe.get("timeoutSeconds", 1)) < DEADLINE_S + PROBE_START_S:
            problems.append(f"probes: {name} timeoutSeconds {probe.get('timeoutSeconds')} < the healthcheck's "
                            f"deadline {DEADLINE_S} s + {PROBE_START_S} s")  # fmt: skip
    worst = worst_start_s(settings)
    if startup is None or probe_budget_s(startup) < worst:
        budget = probe_budget_s(startup) if startup else 0
        problems.append(f"startup: budget {budget} s < t4serve's cold-start budget {worst:.0f} s")

    # Termination: preStop, then vLLM's drain and supervisord's stop, inside the grace period.
    grace = int(spec.get("terminationGracePeriodSeconds", 30))
    need = prestop_seconds(ctr) + worst_stop_s(settings) + GRACE_MARGIN_S
    if grace < need:
        problems.append(f"grace: terminationGracePeriodSeconds {grace} < preStop {prestop_seconds(ctr)} + "
                        f"supervisord's stop {worst_stop_s(settings)} + {GRACE_MARGIN_S} = {need}")  # fmt: skip
    if prestop_seconds(ctr) == 0:
        problems.append("preStop: none (endpoints need time to drop the pod before SIGTERM)")

    # Secrets: only as files, through the *_FILE variables, from Secret volumes.
    env = {e["name"]: e for e in ctr.get("env", [])}
    for e in env.values():
        if "secretKeyRef" in e.get("valueFrom", {}):
            problems.append(f"secrets: {e['name']} comes from a Secret as an environment value")
    if any("secretRef" in src for src in ctr.get("envFrom", [])):
        problems.append("secrets: envFrom secretRef puts a Secret into the environment")
    data = settings_data(objs)
    for name in SECRET_VARIABLES:
        if name in env or name in data:
            problems.append(f"secrets: {name} is set as a value; use the *_FILE variable")
    for name in SECRET_FILE_VARIABLES:
        path = env.get(name, {}).get("value")
        if path is None:
            problems.append(f"secrets: {name} is not set")
            continue
        mount = next((m for p, m in mounts.items() if path.startswith(p.rstrip("/") + "/")), None)
        volume = volumes.get(mount["name"], {}) if mount else {}
        files = {
            item["path"]
            for src in [*volume.get("projected", {}).get("sources", []), {"secret": volume.get("secret")}]
            if src.get("secret")
            for item in src["secret"].get("items", [])
        }
        if mount is None or os.path.relpath(path, mount["mountPath"]) not in files:
            problems.append(f"secrets: {name}={path} is not a file of a mounted Secret")
        elif not mount.get("readOnly"):
            problems.append(f"secrets: the mount {mount['mountPath']} is not read-only")

    # Settings: every ConfigMap key is one of t4serve's variables (a typo would be ignored silently).
    problems += [f"settings: {k} is not a t4serve variable" for k in data if k not in VARIABLES_BY_NAME]

    # Memory: pods get no swap, so the loading peak `t4serve plan` predicts must fit in the request and the limit.
    facts = builtin_facts(settings.model.target, "kubernetes rule test")
    if facts is not None:
        need_bytes = hostmem.estimate(facts, None).need_bytes.value
        for where, values in (("requests", requests), ("limits", limits)):
            if quantity_bytes(values.get("memory", 0)) < need_bytes:
                problems.append(f"memory: {where}.memory {values.get('memory')} < the {need_bytes / 2**30:.2f} GiB "
                                f"loading {settings.model.requested} needs")  # fmt: skip

    # Non-root, no privilege escalation.
    pod_sc, ctr_sc = spec.get("securityContext", {}), ctr.get("securityContext", {})
    if pod_sc.get("runAsNonRoot") is not True or pod_sc.get("runAsUser", 0) == 0:
        problems.append("security: the pod must run as non-root (runAsNonRoot, runAsUser 1000)")
    if ctr_sc.get("allowPrivilegeEscalation") is not False or ctr_sc.get("privileged"):
        problems.append("security: allowPrivilegeEscalation must be false, privileged unset")
    if "ALL" not in ctr_sc.get("capabilities", {}).get("drop", []):
        problems.append("security: capabilities must drop ALL")

    # Ports: the container's ports are the settings' ports, and the Service targets one that exists.
    ports = {p["name"]: p["containerPort"] for p in ctr.get("ports", [])}
    if ports.get("http") != settings.port or ports.get("telemetry") != settings.telemetry_port:
        problems.append(f"ports: {ports} differ from T4SERVE_PORT {settings.port} / T4SERVE_TELEMETRY_PORT "
                        f"{settings.telemetry_port}")  # fmt: skip
    labels = deployment(objs)["spec"]["template"]["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget"):
        obj = one(objs, kind, T4SERVE)
        selector = obj["spec"]["selector"] if kind == "Service" else obj["spec"]["selector"]["matchLabels"]
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            problems.append(f"{kind}: selector {selector} does not select the pods {labels}")
    for port in one(objs, "Service", T4SERVE)["spec"]["ports"]:
        if port["targetPort"] not in ports and port["targetPort"] not in ports.values():
            problems.append(f"Service: targetPort {port['targetPort']} is not a container port")
    if not any(t.get("topologyKey") == "kubernetes.io/hostname" for t in spec.get("topologySpreadConstraints", [])):
        problems.append("topology: no spread over nodes (kubernetes.io/hostname)")

    # Rollout: one pod's whole turn (the old pod's grace, the image pull, the startup budget) within the deadline.
    rollout = deployment(objs)["spec"]
    deadline = int(rollout.get("progressDeadlineSeconds", 600))
    turn = grace + IMAGE_PULL_S + (probe_budget_s(startup) if startup else 0)
    if deadline <= max(turn, worst):
        problems.append(f"rollout: progressDeadlineSeconds {deadline} <= grace {grace} + image pull {IMAGE_PULL_S:.0f}"
                        f" + startup {probe_budget_s(startup) if startup else 0} = {turn:.0f} s")  # fmt: skip

    # Read-only root: every path the image writes is a volume.
    if ctr_sc.get("readOnlyRootFilesystem") is not True:
        problems.append("filesystem: readOnlyRootFilesystem must be true")
    disk_limits = 0
    for path in (*WRITABLE_PATHS, "/cache", "/dev/shm"):
        volume = volumes.get(mounts.get(path, {}).get("name", ""))
        if volume is None or not ({"emptyDir", "persistentVolumeClaim"} & set(volume)):
            problems.append(f"filesystem: {path} is not a writable volume (emptyDir or PVC)")
        elif "emptyDir" in volume and volume["emptyDir"].get("medium") != "Memory":
            size = volume["emptyDir"].get("sizeLimit")
            disk_limits += quantity_bytes(size) if size else 0
            if size is None:
                problems.append(f"filesystem: the emptyDir at {path} has no sizeLimit")
    tmp = volumes.get(mounts.get("/tmp", {}).get("name", ""), {}).get("emptyDir", {})
    tmp_need = preflight.DISK_NEED_BY_ROLE["tmp"] + preflight.DISK_NEED_BY_ROLE["state"]
    if tmp.get("sizeLimit") and quantity_bytes(tmp["sizeLimit"]) < tmp_need:
        problems.append(f"filesystem: /tmp's sizeLimit {tmp['sizeLimit']} < preflight's {tmp_need} B")
    # Node disk: requested, and limited to at least what the disk emptyDirs may hold.
    eph_request, eph_limit = requests.get("ephemeral-storage"), limits.get("ephemeral-storage")
    if eph_request is None or eph_limit is None:
        problems.append("ephemeral-storage: no request or no limit")
    elif not disk_limits <= quantity_bytes(eph_limit) or quantity_bytes(eph_request) > quantity_bytes(eph_limit):
        problems.append(f"ephemeral-storage: limit {eph_limit} < the emptyDirs' {disk_limits} B, or request > limit")

    # Pod Security Admission's restricted profile (Kubernetes' Pod Security Standards), the fields this pod sets.
    problems += [f"restricted: {p}" for p in restricted_problems(spec)]

    # The image's environment finds GKE's driver (docker/Dockerfile's LD_LIBRARY_PATH and PATH): the pod must not
    # replace either.
    for name in ("LD_LIBRARY_PATH", "PATH"):
        if name in env or name in data:
            problems.append(f"driver: the pod sets {name}, replacing the image's (it finds GKE's /usr/local/nvidia)")

    # Drains: a not-ready pod never blocks them.
    pdb = one(objs, "PodDisruptionBudget")["spec"]
    if pdb.get("unhealthyPodEvictionPolicy") != "AlwaysAllow":
        problems.append("PodDisruptionBudget: unhealthyPodEvictionPolicy must be AlwaysAllow")

    problems += network_problems(objs)
    return problems


RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                      "secret"}  # fmt: skip


def restricted_problems(spec: Obj) -> list[str]:
    """The pod against Pod Security Standards' restricted profile (what `pod-security.kubernetes.io/enforce:
    restricted` refuses): host namespaces, privileged, capabilities, volume types, privilege escalation, non-root,
    seccomp, host ports."""
    problems = []
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        problems.append("host namespaces")
    for volume in spec.get("volumes", []):
        kind = next(k for k in volume if k != "name")
        if kind not in RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']} is {kind}")
    pod_sc = spec.get("securityContext", {})
    for ctr in [*spec.get("initContainers", []), *spec["containers"]]:
        sc = ctr.get("securityContext", {})
        if sc.get("privileged"):
            problems.append(f"{ctr['name']}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{ctr['name']}: allowPrivilegeEscalation is not false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            problems.append(f"{ctr['name']}: capabilities do not drop ALL")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{ctr['name']}: adds capabilities")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            problems.append(f"{ctr['name']}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            problems.append(f"{ctr['name']}: runAsUser 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{ctr['name']}: seccompProfile {seccomp}")
        if any(p.get("hostPort") for p in ctr.get("ports", [])):
            problems.append(f"{ctr['name']}: hostPort")
    return problems


def test_the_rules_hold_for_every_kustomization(rendered: dict[str, list[Obj]]) -> None:
    for target, objs in rendered.items():
        assert deployment_problems(objs) == [], target


def test_the_figures_the_rules_use() -> None:
    """What the manifests are measured against, printed so a reader can compare with the YAML's comments."""
    objs = render(DEPLOY / "base")
    settings = settings_of(objs)
    ctr = container(objs)
    startup = probe_budget_s(ctr["startupProbe"])
    print(f"\ncold-start budget {worst_start_s(settings):.0f} s vs startupProbe {startup} s;"
          f" preStop {prestop_seconds(ctr)} s + supervisord stop {worst_stop_s(settings)} s + {GRACE_MARGIN_S} s vs "
          f"grace {pod_spec(objs)['terminationGracePeriodSeconds']} s")  # fmt: skip
    # supervisord: vLLM's drain + STOP_MARGIN_S, telemetry 5 s, the listener's default 10 s.
    assert worst_stop_s(settings) == settings.shutdown_timeout + 30 + 5 + 10
    longer = Settings.from_environ({**settings_data(objs), "T4SERVE_SHUTDOWN_TIMEOUT": "300"}, cwd="/")
    assert worst_stop_s(longer) == worst_stop_s(settings) + 270


Mutation = Callable[[list[Obj]], None]


def _set(path: tuple[str | int, ...], value: Any) -> Mutation:
    """Set a field of the rendered Deployment's pod spec or container (path ("pod", ...) or ("ctr", ...), list items
    by index), or delete it (None)."""

    def mutate(objs: list[Obj]) -> None:
        where, *keys = path
        node: Any = pod_spec(objs) if where == "pod" else container(objs)
        for key in keys[:-1]:
            node = node[key] if isinstance(node, list) else node.setdefault(key, {})
        if value is None:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value

    return mutate


def _configmap(key: str, value: str) -> Mutation:
    def mutate(objs: list[Obj]) -> None:
        name = container(objs)["envFrom"][0]["configMapRef"]["name"]
        next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name)["data"][key] = value

    return mutate


def _deployment(key: str, value: Any) -> Mutation:
    def mutate(objs: list[Obj]) -> None:
        spec = deployment(objs)["spec"]
        if value is None:
            del spec[key]
        else:
            spec[key] = value

    return mutate


def _pdb(key: str, value: Any) -> Mutation:
    def mutate(objs: list[Obj]) -> None:
        spec = one(objs, "PodDisruptionBudget")["spec"]
        if value is None:
            del spec[key]
        else:
            spec[key] = value

    return mutate


def _drop(kind: str) -> Mutation:
    def mutate(objs: list[Obj]) -> None:
        objs.remove(one(objs, kind))

    return mutate


def _policy(path: tuple[str | int, ...], value: Any) -> Mutation:
    """Set (None: delete) a field of the rendered NetworkPolicy."""

    def mutate(objs: list[Obj]) -> None:
        node: Any = one(objs, "NetworkPolicy")
        for key in path[:-1]:
            node = node[key]
        if value is None:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return mutate


def _add_env(entry: Obj) -> Mutation:
    def mutate(objs: list[Obj]) -> None:
        container(objs)["env"].append(entry)

    return mutate


BREAKAGES: dict[str, tuple[Mutation, str]] = {
    "two GPUs": (_set(("ctr", "resources", "limits", "nvidia.com/gpu"), 2), "GPU:"),
    "no GPU": (_set(("ctr", "resources", "limits"), {"memory": "13Gi"}), "GPU:"),
    "small shm": (_set(("pod", "volumes", 3, "emptyDir", "sizeLimit"), "512Mi"), "shm:"),
    "disk-backed shm": (_set(("pod", "volumes", 3, "emptyDir"), {"sizeLimit": "2Gi"}), "shm:"),
    "service links on": (_set(("pod", "enableServiceLinks"), True), "enableServiceLinks"),
    "readiness on /health": (_set(("ctr", "readinessProbe"), {"httpGet": {"path": "/health", "port": 8000}}),
                             "probes:"),
    "liveness = readiness": (_set(("ctr", "livenessProbe", "exec", "command"), HEALTHCHECK), "probes:"),
    "short probe timeout": (_set(("ctr", "readinessProbe", "timeoutSeconds"), 3), "probes:"),
    "startup too short": (_set(("ctr", "startupProbe", "failureThreshold"), 60), "startup:"),
    # Raising the drain in the ConfigMap alone must fail: the grace period has to follow it.
    "drain longer than grace": (_configmap("T4SERVE_SHUTDOWN_TIMEOUT", "120"), "grace:"),
    "grace too short": (_set(("pod", "terminationGracePeriodSeconds"), 60), "grace:"),
    "longer preStop": (_set(("ctr", "lifecycle", "preStop", "exec", "command"), ["sleep", "40"]), "grace:"),
    "token as env": (_add_env({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "k"}}}),
                     "secrets:"),
    "key file not mounted": (_set(("ctr", "env", 1, "value"), "/etc/api_key"), "secrets:"),
    "setting typo": (_configmap("T4SERVE_SHUTDOWN_TIMOUT", "30"), "settings:"),
    "bf16 in 13Gi": (_configmap("T4SERVE_MODEL", "bf16"), "memory:"),
    "root": (_set(("pod", "securityContext", "runAsNonRoot"), False), "security:"),
    "escalation": (_set(("ctr", "securityContext", "allowPrivilegeEscalation"), True), "security:"),
    "wrong port": (_set(("ctr", "ports", 0, "containerPort"), 8080), "ports:"),
    "no node spread": (_set(("pod", "topologySpreadConstraints"), None), "topology:"),
    "default rollout deadline": (_deployment("progressDeadlineSeconds", None), "rollout:"),
    "rollout deadline below a start": (_deployment("progressDeadlineSeconds", 1300), "rollout:"),
    "writable root": (_set(("ctr", "securityContext", "readOnlyRootFilesystem"), None), "filesystem:"),
    "no /tmp volume": (_set(("ctr", "volumeMounts", 1, "mountPath"), "/scratch"), "filesystem:"),
    "home without a size": (_set(("pod", "volumes", 2, "emptyDir"), {}), "filesystem:"),
    "small /tmp": (_set(("pod", "volumes", 1, "emptyDir", "sizeLimit"), "128Mi"), "filesystem:"),
    "no ephemeral limit": (_set(("ctr", "resources", "limits", "ephemeral-storage"), None), "ephemeral-storage:"),
    "ephemeral limit below the emptyDirs": (_set(("ctr", "resources", "limits", "ephemeral-storage"), "1Gi"),
                                            "ephemeral-storage:"),
    "no seccomp": (_set(("pod", "securityContext", "seccompProfile"), None), "restricted:"),
    "hostPath volume": (_set(("pod", "volumes", 0), {"name": "cache", "hostPath": {"path": "/data"}}), "restricted:"),
    "adds a capability": (_set(("ctr", "securityContext", "capabilities", "add"), ["SYS_ADMIN"]), "restricted:"),
    "replaces LD_LIBRARY_PATH": (_add_env({"name": "LD_LIBRARY_PATH", "value": "/opt/lib"}), "driver:"),
    "unhealthy pods block drains": (_pdb("unhealthyPodEvictionPolicy", None), "PodDisruptionBudget:"),
    "no network policy": (_drop("NetworkPolicy"), "network:"),
    "policy selects the whole namespace": (_policy(("spec", "podSelector"), {}), "network:"),
    "telemetry from the namespace": (_policy(("spec", "ingress", 1, "from"), [{"podSelector": {}}]), "network:"),
    "api from every namespace": (_policy(("spec", "ingress", 0, "from", 1), {"namespaceSelector": {}}), "network:"),
    "a rule without ports": (_policy(("spec", "ingress", 0, "ports"), None), "network:"),
    "egress only": (_policy(("spec", "policyTypes"), ["Egress"]), "network:"),
}


@pytest.mark.parametrize("name", list(BREAKAGES))
def test_each_rule_catches_its_drift(rendered: dict[str, list[Obj]], name: str) -> None:
    objs = copy.deepcopy(rendered["base"])
    mutate, prefix = BREAKAGES[name]
    mutate(objs)
    problems = deployment_problems(objs)
    assert any(p.startswith(prefix) for p in problems), problems


# ------------------------------------------------------------------------------------- the probe commands themselves


def _run_probe(command: list[str], state_dir: Path) -> subprocess.CompletedProcess[str]:
    """The rendered probe's argv as the kubelet runs it, with this checkout's t4serve in place of the image's."""
    assert command[0] == "t4serve"
    env = {**os.environ, "T4SERVE_STATE_DIR": str(state_dir)}
    return subprocess.run([sys.executable, "-m", "t4serve", *command[1:]], capture_output=True, text=True, env=env,
                          timeout=30)  # fmt: skip


def test_the_rendered_probes_tell_loading_ready_and_hung_apart(rendered: dict[str, list[Obj]], tmp_path: Path) -> None:
    ctr = container(rendered["base"])
    readiness, liveness = _exec(ctr["readinessProbe"]), _exec(ctr["livenessProbe"])
    assert readiness and liveness and _exec(ctr["startupProbe"]) == readiness

    def state(port: int, phase: str) -> None:
        spec = RunSpec(["vllm", "serve", "m"], {}, "m", "gemma", "127.0.0.1", port, "float16", 30, True, None,
                       "/nonexistent/hub", "/nonexistent/cache")  # fmt: skip
        s = new_state(spec, started_at=time.time())
        write_state(tmp_path, s.with_phase(phase, time.time()) if phase != "starting" else s)

    state(1, "loading_weights")
    assert _run_probe(readiness, tmp_path).returncode == 1
    assert _run_probe(liveness, tmp_path).returncode == 0
    # A reload (attempt 2) that has loaded for longer than the cold-start budget the startupProbe is sized from: wedged.
    spec = RunSpec(["vllm", "serve", "m"], {}, "m", "gemma", "127.0.0.1", 1, "float16", 30, True, None,
                   "/nonexistent/hub", "/nonexistent/cache")  # fmt: skip
    began = time.time() - worst_start_s(settings_of(rendered["base"])) - 60
    write_state(tmp_path, new_state(spec, started_at=began - 600, attempt=2, now=began).with_phase("compiling", began))
    wedged = _run_probe(liveness, tmp_path)
    assert wedged.returncode == 1 and wedged.stderr.rstrip().endswith(": wedged"), wedged.stderr
    models = {"object": "list", "data": [{"id": "gemma"}]}
    with serve({"/health": Canned(), "/v1/models": Canned(body=models)}) as server:
        state(server.port, "ready")
        assert _run_probe(readiness, tmp_path).returncode == 0
        assert _run_probe(liveness, tmp_path).returncode == 0
    with serve({"/health": Canned(delay=DEADLINE_S + 2)}) as server:
        state(server.port, "ready")
        began = time.monotonic()
        hung = _run_probe(liveness, tmp_path)
        took = time.monotonic() - began
    assert hung.returncode == 1 and "hung" in hung.stderr
    assert took < int(ctr["livenessProbe"]["timeoutSeconds"])


# ------------------------------------------------------------------------------------------------------ autoscaling


def test_autoscaling_targets_the_deployment_and_scales_down_slower_than_a_start(
    rendered: dict[str, list[Obj]],
) -> None:
    worst = worst_start_s(settings_of(rendered["base"]))
    for target in ("overlays/autoscaling", "overlays/autoscaling-hpa"):
        objs = rendered[target]
        server = deployment(objs)
        assert "replicas" not in server["spec"], f"{target}: replicas would fight the autoscaler"
        # Replicas on several nodes need the shared cache.
        assert one(objs, "PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]
        if "ScaledObject" in kinds(objs):
            spec = one(objs, "ScaledObject")["spec"]
            assert spec["scaleTargetRef"]["name"] == server["metadata"]["name"]
            behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
            assert spec["maxReplicaCount"] > spec["minReplicaCount"] >= 1
        else:
            spec = one(objs, "HorizontalPodAutoscaler")["spec"]
            assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                              "name": server["metadata"]["name"]}  # fmt: skip
            behavior = spec["behavior"]
        down = behavior["scaleDown"]["stabilizationWindowSeconds"]
        up = behavior["scaleUp"]["stabilizationWindowSeconds"]
        assert down >= worst > up, f"{target}: scale-down window {down} s vs cold-start budget {worst:.0f} s"
        ports = {p["name"] for p in container(objs)["ports"]}
        endpoints = one(objs, "PodMonitor")["spec"]["podMetricsEndpoints"]
        assert {e["port"] for e in endpoints} == ports == {"http", "telemetry"}


def test_keda_and_the_hpa_alternative_scale_on_the_same_vllm_metric(rendered: dict[str, list[Obj]]) -> None:
    scaled = one(rendered["overlays/autoscaling"], "ScaledObject")
    trigger = scaled["spec"]["triggers"][0]
    series = re.search(r"(vllm:[a-z_]+)", trigger["metadata"]["query"])
    # The query counts the queue of the pods this ScaledObject scales, in their namespace.
    assert f'namespace="{scaled["metadata"]["namespace"]}"' in trigger["metadata"]["query"]
    assert trigger["type"] == "prometheus" and series and series.group(1) == "vllm:num_requests_waiting"
    hpa = one(rendered["overlays/autoscaling-hpa"], "HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]
    values = yaml.safe_load((DEPLOY / "components" / "hpa" / "prometheus-adapter-values.yaml").read_text())
    rule = values["rules"]["custom"][0]
    assert rule["seriesQuery"].startswith(series.group(1) + "{")
    # prometheus-adapter's renaming, applied as it applies it: the HPA must ask for the name the adapter serves.
    served = re.sub(rule["name"]["matches"], rule["name"]["as"], series.group(1))
    assert served == hpa["metric"]["name"]
    assert float(trigger["metadata"]["threshold"]) == float(hpa["target"]["averageValue"])


def test_cloud_overlays_select_their_gpu_nodes(rendered: dict[str, list[Obj]]) -> None:
    gke = pod_spec(rendered["overlays/gke-t4"])
    # The T4, and GKE's `latest` driver (R580 for the image's CUDA 13): auto-provisioned and Autopilot nodes get
    # `default` unless the pod asks.
    assert gke["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
                                   "cloud.google.com/gke-gpu-driver-version": "latest"}  # fmt: skip
    assert pod_spec(rendered["overlays/gke-autopilot"])["nodeSelector"] == gke["nodeSelector"]
    eks = pod_spec(rendered["overlays/eks-g4dn"])
    term = eks["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    instance_types = term["matchExpressions"][0]["values"]
    assert instance_types and all(t.startswith("g4dn.") for t in instance_types)
    aks = pod_spec(rendered["overlays/aks-t4"])
    term = aks["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    sizes = term["matchExpressions"][0]["values"]
    assert sizes and all(t.startswith("Standard_NC") and t.endswith("as_T4_v3") for t in sizes)
    assert {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in aks["tolerations"]
    for spec in (gke, eks, aks):
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_the_image_is_pinned_by_digest_in_its_overlay_and_by_tag_elsewhere(rendered: dict[str, list[Obj]]) -> None:
    pinned = container(rendered["overlays/pinned-digest"])["image"]
    assert re.fullmatch(r"[a-z0-9.\-/]+/t4serve@sha256:[0-9a-f]{64}", pinned)
    assert container(rendered["base"])["image"] == "t4serve:dev"


# ------------------------------------------------------------------------------------------------------- monitoring

# kube-state-metrics' series the alerts read (kube-prometheus-stack ships it): Deployment replicas and restarts.
KUBE_STATE_METRICS = {"kube_deployment_status_replicas_available", "kube_deployment_spec_replicas",
                      "kube_pod_container_status_restarts_total"}  # fmt: skip
METRIC = re.compile(r"\b((?:vllm:|t4serve_|kube_)[a-zA-Z0-9_:]+)")


def monitoring_expressions(objs: list[Obj]) -> dict[str, str]:
    """Every PromQL expression components/monitoring renders: each alert's, and each dashboard panel target's."""
    groups = one(objs, "PrometheusRule")["spec"]["groups"]
    exprs = {f"alert {r['alert']}": r["expr"] for g in groups for r in g["rules"]}
    board = json.loads(next(o for o in objs if o["kind"] == "ConfigMap" and "t4serve.json" in o.get("data", {}))
                       ["data"]["t4serve.json"])  # fmt: skip
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            exprs[f"panel {panel['title']} {target['refId']}"] = target["expr"]
    return exprs


def test_the_alerts_and_the_dashboard_read_metrics_that_exist(rendered: dict[str, list[Obj]]) -> None:
    """t4serve's own series against its telemetry code; kube-state-metrics' by name; vLLM's against the image's vLLM
    source in tests/image/test_monitoring_names.py."""
    objs = rendered["overlays/autoscaling"]
    exprs = monitoring_expressions(objs)
    ours = {name for name, *_ in telemetry._GAUGES} | {"t4serve_gpu_clocks_event_reason"}
    used = {m for e in exprs.values() for m in METRIC.findall(e)}
    assert {m for m in used if m.startswith("t4serve_")} <= ours
    assert {m for m in used if m.startswith("kube_")} <= KUBE_STATE_METRICS
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "t4serve_gpu_clocks_event_reason"} <= used
    # Throttling reasons are the telemetry's own keys.
    keys = {key for _bit, key, _label in THROTTLE_REASONS}
    for reason in re.findall(r'reason=~"([^"]+)"', exprs["alert T4serveGpuThrottled"])[0].split("|"):
        assert reason in keys
    # Each expression selects t4serve's pods (by container, or the Deployment by name), never everything.
    for where, expr in exprs.items():
        assert 'container="t4serve"' in expr or 'deployment="t4serve"' in expr, where
    board = json.loads(one([o for o in objs if o["kind"] == "ConfigMap" and "t4serve.json" in o.get("data", {})],
                           "ConfigMap")["data"]["t4serve.json"])  # fmt: skip
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and board["uid"] == "t4serve"
    assert all("$namespace" in t["expr"] for p in board["panels"] for t in p.get("targets", []))


def test_not_ready_waits_longer_than_a_start(rendered: dict[str, list[Obj]]) -> None:
    rules = {r["alert"]: r for g in one(rendered["overlays/autoscaling"], "PrometheusRule")["spec"]["groups"]
             for r in g["rules"]}  # fmt: skip
    minutes = int(rules["T4serveNotReady"]["for"].removesuffix("m"))
    assert minutes * 60 > probe_budget_s(container(rendered["base"])["startupProbe"])
    assert set(rules) == {"T4serveNotReady", "T4serveRestarting", "T4serveKvCacheNearlyFull", "T4serveQueueGrowing",
                          "T4serveGpuThrottled"}  # fmt: skip


def test_quantities() -> None:
    assert quantity_bytes("13Gi") == 13 * 2**30 and quantity_bytes("2G") == 2 * 10**9 and quantity_bytes(512) == 512
    with pytest.raises(ValueError):
        quantity_bytes("13 GiB")
    assert math.isclose(quantity_bytes("1.5Gi"), 1.5 * 2**30)
