"""deploy/kubernetes per cloud and per combination: every cloud overlay with every component set that applies to it
(k8s_manifests.combinations) renders, validates against the schemas and holds every rule of test_kubernetes.py; each
cloud's render has the objects that cloud needs for a Ready pod on the first apply; components that exclude each other
refuse to render with a message naming both; the namespace follows every component."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from k8s_manifests import (
    COMPONENTS,
    DEPLOY,
    REPO,
    Obj,
    combinations,
    container,
    deployment,
    kinds,
    one,
    pod_spec,
    render,
    render_combination,
)
from test_kubernetes import (
    CLUSTER_SCOPED,
    CRD_DIR,
    CRD_SCHEMAS,
    IMAGE_PULL_S,
    K8S_VERSIONS,
    KUBE_SYSTEM_OBJECTS,
    admits,
    deployment_problems,
    namespace_problems,
    settings_of,
    storage_problems,
    validation_errors,
    worst_start_s,
)

from t4serve.apiguard import OPEN_PATHS
from t4serve.config.aliases import MODEL_ALIASES
from t4serve.probes.checkpoint import builtin_facts
from t4serve.supervise.startbudget import cold_start_budget

# Google's load-balancer and health-check source ranges (container-native load balancing reaches pod IPs from them).
GOOGLE_LB_RANGES = {"130.211.0.0/22", "35.191.0.0/16"}
INSTANCE_TYPE = "node.kubernetes.io/instance-type"


@pytest.fixture(scope="module")
def combos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Obj]]:
    return {name: render_combination(overlay, components, tmp_path_factory.mktemp("combo"))
            for name, (overlay, components) in combinations().items()}  # fmt: skip


def render_error(overlay: str, components: tuple[str, ...], folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    with pytest.raises(RuntimeError) as failed:
        render_combination(overlay, components, folder)
    return str(failed.value)


def in_namespace(objs: list[Obj]) -> list[Obj]:
    """The objects that follow t4serve's namespace: all but the cluster-scoped ones and the device plugin."""
    return [o for o in objs if o["kind"] not in CLUSTER_SCOPED and (o["kind"], o["metadata"]["name"])
            not in KUBE_SYSTEM_OBJECTS]  # fmt: skip


# ------------------------------------------------------------------------------------------------ every combination


def test_every_combination_renders_valid_objects_that_hold_every_rule(combos: dict[str, list[Obj]]) -> None:
    assert len(combos) >= 40
    problems = []
    for name, objs in combos.items():
        problems += [f"{name}: {p}" for p in namespace_problems(objs)]
        problems += [f"{name}: {p}" for p in deployment_problems(objs)]
        problems += [f"{name}: {p}" for p in storage_problems(objs) if "set-t4serve" not in p]
        for version in K8S_VERSIONS:
            problems += [f"{name} {version} {o['kind']}: {e}" for o in objs for e in validation_errors(o, version)]
    assert problems == []
    print(f"\n{len(combos)} combinations, {sum(len(o) for o in combos.values())} objects: valid, every rule holds")


def test_the_derived_crd_schemas_reject_an_unknown_field(combos: dict[str, list[Obj]]) -> None:
    """Each schema derive.py made is closed: a misspelt field in the spec fails, as the API server's strict field
    validation fails it."""
    seen = {}
    for objs in combos.values():
        for obj in objs:
            if (obj["apiVersion"], obj["kind"]) in CRD_SCHEMAS:
                seen[(obj["apiVersion"], obj["kind"])] = obj
    derived = {key for key, file in CRD_SCHEMAS.items() if "derive.py" in (CRD_DIR / file).read_text()}
    assert derived <= set(seen), f"no render uses {derived - set(seen)}"
    for key in derived:
        broken = copy.deepcopy(seen[key])
        broken["spec"]["notAField"] = 1
        assert any("notAField" in e for e in validation_errors(broken, K8S_VERSIONS[0])), key


# ----------------------------------------------------------------------------------------------- per cloud, first apply


def test_gke_standard_and_autopilot_ask_for_a_t4_and_the_latest_driver(combos: dict[str, list[Obj]]) -> None:
    for overlay in ("gke-t4", "gke-autopilot"):
        spec = pod_spec(combos[f"{overlay}+nothing"])
        assert spec["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
                                        "cloud.google.com/gke-gpu-driver-version": "latest"}, overlay  # fmt: skip
        assert "affinity" not in spec
    # Autopilot: requests equal limits (a Guaranteed pod: what the node is sized for is what the pod may use), one GPU.
    resources = container(combos["gke-autopilot+nothing"])["resources"]
    assert resources["requests"] == resources["limits"]
    assert {str(resources["limits"][k]) for k in ("nvidia.com/gpu",)} == {"1"}
    assert set(resources["limits"]) == {"cpu", "memory", "ephemeral-storage", "nvidia.com/gpu"}
    # Standard keeps its burstable CPU (no CPU limit: deploy/kubernetes/checkov.yaml, CKV_K8S_11).
    assert "cpu" not in container(combos["gke-t4+nothing"])["resources"]["limits"]


def test_eks_names_a_cache_class_that_exists_and_brings_the_device_plugin(combos: dict[str, list[Obj]]) -> None:
    objs = combos["eks-g4dn+nothing"]
    storage = one(objs, "StorageClass")
    assert storage["provisioner"] == "ebs.csi.aws.com" and storage["volumeBindingMode"] == "WaitForFirstConsumer"
    assert "storageclass.kubernetes.io/is-default-class" not in storage["metadata"].get("annotations", {})
    claim = one(objs, "PersistentVolumeClaim")["spec"]
    assert claim["storageClassName"] == storage["metadata"]["name"] and claim["accessModes"] == ["ReadWriteOnce"]
    # With the shared cache: EFS's class (the note in the overlay and the docs says how to make it).
    shared = one(combos["eks-g4dn+rwx-cache"], "PersistentVolumeClaim")["spec"]
    assert shared == {**shared, "storageClassName": "efs-sc", "accessModes": ["ReadWriteMany"]}
    assert "DaemonSet" not in kinds(objs)
    plugin_runs_where_the_pod_may_run(combos["eks-g4dn+nvidia-device-plugin"])


def test_aks_uses_its_default_class_and_brings_the_device_plugin(combos: dict[str, list[Obj]]) -> None:
    objs = combos["aks-t4+nvidia-device-plugin"]
    assert "storageClassName" not in one(objs, "PersistentVolumeClaim")["spec"]  # managed-csi, AKS's default
    assert {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in pod_spec(objs)["tolerations"]
    plugin_runs_where_the_pod_may_run(objs)


def instance_types(spec: Obj) -> set[str]:
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return {v for t in terms for e in t["matchExpressions"] if e["key"] == INSTANCE_TYPE for v in e["values"]}


def plugin_runs_where_the_pod_may_run(objs: list[Obj]) -> None:
    plugin = one(objs, "DaemonSet")
    assert plugin["metadata"]["namespace"] == "kube-system"
    spec = plugin["spec"]["template"]["spec"]
    pod = pod_spec(objs)
    assert instance_types(pod) <= instance_types(spec)
    # It tolerates every taint the t4serve pod tolerates (the GPU nodes' taints).
    assert all(t in spec["tolerations"] for t in pod["tolerations"])
    ctr = spec["containers"][0]
    assert re.fullmatch(r"nvcr\.io/nvidia/k8s-device-plugin:v\d+\.\d+\.\d+", ctr["image"])
    assert ctr["volumeMounts"][0]["mountPath"] == "/var/lib/kubelet/device-plugins"
    assert ctr["securityContext"]["allowPrivilegeEscalation"] is False
    assert ctr["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_the_device_plugin_covers_exactly_the_overlays_node_types() -> None:
    """The comment in its DaemonSet says it: the union of the EKS and AKS overlays' instance types, no more."""
    plugin = yaml.safe_load((COMPONENTS / "nvidia-device-plugin" / "daemonset.yaml").read_text())
    union = instance_types(pod_spec(render(DEPLOY / "overlays/eks-g4dn"))) | instance_types(
        pod_spec(render(DEPLOY / "overlays/aks-t4"))
    )
    assert instance_types(plugin["spec"]["template"]["spec"]) == union


# ----------------------------------------------------------------------------------- combinations that exclude others


def test_keda_and_the_hpa_refuse_to_render_together_naming_each_other(tmp_path: Path) -> None:
    first = render_error("gke-t4", ("monitoring", "keda", "hpa"), tmp_path / "a")
    assert "components/hpa" in first and "autoscaling-keda-excludes-hpa" in first and "test failed" in first
    second = render_error("aks-t4", ("monitoring", "hpa", "keda"), tmp_path / "b")
    assert "components/keda" in second and "autoscaling-hpa-excludes-keda" in second


def test_scale_to_zero_needs_keda_first(tmp_path: Path) -> None:
    message = render_error("eks-g4dn", ("keda-scale-to-zero",), tmp_path / "a")
    assert "components/keda-scale-to-zero" in message and "nothing selected by ScaledObject" in message
    assert "t4serve" in message


def test_autoscaling_brings_the_shared_cache_with_it(tmp_path: Path) -> None:
    """Replicas on several nodes need a ReadWriteMany claim: KEDA or the HPA alone (no rwx-cache listed) has one."""
    for i, autoscaler in enumerate(("keda", "hpa")):
        (tmp_path / str(i)).mkdir()
        objs = render_combination("gke-t4", ("monitoring", autoscaler), tmp_path / str(i))
        claim = one(objs, "PersistentVolumeClaim")["spec"]
        assert claim["accessModes"] == ["ReadWriteMany"] and claim["storageClassName"] == "standard-rwx"
        assert deployment(objs)["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


# --------------------------------------------------------------------------------------------------- the namespace


EVERYTHING_BY_CLOUD = {
    "gke-t4": ("namespace", "monitoring-gmp", "keda", "keda-scale-to-zero", "gateway-gke", "ingress"),
    "eks-g4dn": ("namespace", "nvidia-device-plugin", "monitoring", "keda", "keda-scale-to-zero", "ingress"),
    "aks-t4": ("namespace", "nvidia-device-plugin", "monitoring", "hpa", "gateway"),
}


@pytest.mark.parametrize("overlay", list(EVERYTHING_BY_CLOUD))
def test_a_namespace_set_below_the_components_reaches_every_one(overlay: str, tmp_path: Path) -> None:
    objs = render_combination(overlay, EVERYTHING_BY_CLOUD[overlay], tmp_path, namespace="team-b")
    followers = in_namespace(objs)
    assert {o["metadata"].get("namespace") for o in followers} == {"team-b"}, [
        (o["kind"], o["metadata"].get("namespace")) for o in followers if o["metadata"].get("namespace") != "team-b"
    ]
    assert one(objs, "Namespace")["metadata"]["name"] == "team-b"
    assert namespace_problems(objs) == []
    if "ScaledObject" in kinds(objs):
        assert 'namespace="team-b"' in one(objs, "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    for obj in objs:
        if (obj["kind"], obj["metadata"]["name"]) in KUBE_SYSTEM_OBJECTS:
            assert obj["metadata"]["namespace"] == "kube-system"
    assert deployment_problems(objs) == []


def test_a_namespace_set_beside_the_components_is_caught_by_the_rule(tmp_path: Path) -> None:
    """What docs/kubernetes.md warns of: kustomize applies a kustomization's `namespace:` after its components, so the
    KEDA query (filled in by the component) still counts `t4serve`, and the device plugin leaves kube-system. The
    namespace rule these tests apply to every render names both."""
    (tmp_path / "deploy").symlink_to(REPO / "deploy")
    (tmp_path / "kustomization.yaml").write_text(
        "namespace: team-b\nresources:\n  - deploy/kubernetes/overlays/eks-g4dn\ncomponents:\n"
        + "".join(f"  - deploy/kubernetes/components/{c}\n" for c in ("nvidia-device-plugin", "monitoring", "keda"))
    )
    objs = render(tmp_path)
    problems = namespace_problems(objs)
    assert any("does not count namespace 'team-b'" in p for p in problems)
    assert "DaemonSet/nvidia-device-plugin-daemonset: namespace 'team-b', it belongs in kube-system" in problems


# ------------------------------------------------------------------------------------------------------- monitoring


def test_monitoring_sets_the_release_label_once_for_both_objects(combos: dict[str, list[Obj]]) -> None:
    objs = combos["gke-t4+monitoring+keda"]
    for kind in ("PodMonitor", "PrometheusRule"):
        assert one(objs, kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind
    # Only there: the label says which Prometheus selects the object, nothing else carries it.
    assert [o["kind"] for o in objs if "release" in o["metadata"].get("labels", {})] == ["PodMonitor",
                                                                                          "PrometheusRule"]  # fmt: skip
    # Set in one place: one `labels:` entry of the component, and in neither object's own file.
    component = yaml.safe_load((COMPONENTS / "monitoring" / "kustomization.yaml").read_text())
    releases = [e["pairs"] for e in component["labels"] if "release" in e["pairs"]]
    assert releases == [{"release": "kube-prometheus-stack"}]
    for name in ("podmonitor.yaml", "prometheusrule.yaml"):
        assert "release" not in yaml.safe_load((COMPONENTS / "monitoring" / name).read_text())["metadata"]["labels"]


def test_gmp_scrapes_both_ports_with_the_same_alerts(combos: dict[str, list[Obj]]) -> None:
    objs = combos["gke-autopilot+monitoring-gmp"]
    ports = {p["name"]: p["containerPort"] for p in container(objs)["ports"]}
    endpoints = one(objs, "PodMonitoring")["spec"]["endpoints"]
    assert {e["port"] for e in endpoints} == set(ports) == {"http", "telemetry"}
    operator = yaml.safe_load((COMPONENTS / "monitoring" / "prometheusrule.yaml").read_text())
    assert one(objs, "Rules")["spec"]["groups"] == operator["spec"]["groups"]
    pod = deployment(objs)["spec"]["template"]
    policy = one(objs, "NetworkPolicy")
    for port in ports.values():
        assert admits(policy, pod, ports, "gmp-system", {"app": "collector"}, port)
    assert not admits(policy, pod, ports, "gmp-public", {"app": "x"}, ports["telemetry"])


def scale_to_zero_figures(objs: list[Obj]) -> tuple[float, float]:
    """(the slower built-in model's start from the cache volume, seconds; its start plus the image pull on a new
    node)."""
    settings = settings_of(objs)
    warm = max(
        cold_start_budget(f.weight_bytes).total_seconds - cold_start_budget(f.weight_bytes).phases["downloading"]
        for f in (builtin_facts(r, "scale to zero") for r in {*MODEL_ALIASES.values(), settings.model.target})
        if f is not None
    )
    return warm, warm + IMAGE_PULL_S


def test_scale_to_zero_runs_on_a_schedule_that_opens_before_a_start(combos: dict[str, list[Obj]]) -> None:
    objs = combos["eks-g4dn+monitoring+keda+keda-scale-to-zero"]
    spec = one(objs, "ScaledObject")["spec"]
    assert spec["minReplicaCount"] == 0 and spec["cooldownPeriod"] >= worst_start_s(settings_of(objs))
    triggers = {t["type"]: t["metadata"] for t in spec["triggers"]}
    assert set(triggers) == {"prometheus", "cron"} and triggers["cron"]["desiredReplicas"] == "1"
    warm, with_pull = scale_to_zero_figures(objs)
    start = re.fullmatch(r"(\d+) (\d+) .*", triggers["cron"]["start"])
    assert start
    lead_s = (8 * 60 - (int(start.group(2)) * 60 + int(start.group(1)))) * 60
    print(f"\nscale to zero: a wake-up costs {warm:.0f} s of start from the cache volume + {IMAGE_PULL_S:.0f} s "
          f"of image pull on a new node = {with_pull:.0f} s; the window opens {lead_s} s before 08:00")  # fmt: skip
    assert lead_s >= with_pull
    text = (COMPONENTS / "keda-scale-to-zero" / "kustomization.yaml").read_text()
    for figure in (f"{warm_of('qat'):.0f} s for QAT", f"{warm_of('bf16'):.0f} s for bf16"):
        assert figure in text, figure


def warm_of(alias: str) -> float:
    facts = builtin_facts(MODEL_ALIASES[alias], "scale to zero")
    assert facts is not None
    budget = cold_start_budget(facts.weight_bytes)
    return budget.total_seconds - budget.phases["downloading"]


# --------------------------------------------------------------------------------------------------------- a way in


def test_the_gke_gateway_routes_to_the_service_and_checks_health_where_the_key_does_not_guard(
    combos: dict[str, list[Obj]],
) -> None:
    objs = combos["gke-t4+gateway-gke"]
    service = one(objs, "Service")
    ports = {p["name"]: p["containerPort"] for p in container(objs)["ports"]}
    route = one(objs, "HTTPRoute")["spec"]
    gateway = one(objs, "Gateway")
    assert route["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                    "name": gateway["metadata"]["name"]}]  # fmt: skip
    assert gateway["spec"]["gatewayClassName"] == "gke-l7-global-external-managed"
    (backend,) = route["rules"][0]["backendRefs"]
    assert backend == {"name": service["metadata"]["name"], "port": service["spec"]["ports"][0]["port"]}
    check = one(objs, "HealthCheckPolicy")["spec"]
    http = check["default"]["config"]["httpHealthCheck"]
    assert check["default"]["config"]["type"] == "HTTP" and http["port"] == ports["http"]
    assert http["requestPath"] in OPEN_PATHS and http["requestPath"] == "/health"
    for policy in ("HealthCheckPolicy", "GCPBackendPolicy"):
        assert one(objs, policy)["spec"]["targetRef"] == {"group": "", "kind": "Service",
                                                          "name": service["metadata"]["name"]}  # fmt: skip
    assert one(objs, "GCPBackendPolicy")["spec"]["default"]["timeoutSec"] >= 300
    lb = next(o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] != "t4serve")
    (rule,) = lb["spec"]["ingress"]
    assert {p["ipBlock"]["cidr"] for p in rule["from"]} == GOOGLE_LB_RANGES
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]


def test_the_ingress_health_checks_health_for_both_controllers(combos: dict[str, list[Obj]]) -> None:
    objs = combos["eks-g4dn+ingress"]
    ingress = one(objs, "Ingress")
    notes = ingress["metadata"]["annotations"]
    paths = {notes["alb.ingress.kubernetes.io/healthcheck-path"],
             notes["appgw.ingress.kubernetes.io/health-probe-path"]}  # fmt: skip
    assert paths == {"/health"} and paths <= OPEN_PATHS
    assert notes["alb.ingress.kubernetes.io/target-type"] == "ip"
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": one(objs, "Service")["metadata"]["name"], "port": {"name": "http"}}


def test_the_route_only_component_targets_a_gateway_named_in_one_place(combos: dict[str, list[Obj]]) -> None:
    objs = combos["aks-t4+gateway"]
    assert kinds(objs).count("HTTPRoute") == 1 and "Gateway" not in kinds(objs)


def test_gateway_gke_and_gateway_together_is_refused(tmp_path: Path) -> None:
    """gateway-gke includes gateway: listing both would add the route twice, and kustomize refuses that."""
    message = render_error("gke-t4", ("gateway", "gateway-gke"), tmp_path)
    assert "HTTPRoute" in message and "t4serve" in message
