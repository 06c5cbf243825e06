"""components/inference-pool and inference-pool-gke: a T4 fleet behind the Gateway API Inference Extension. The pool,
its route and llm-d-router's endpoint picker render over every cloud overlay (k8s_manifests.combinations; the schemas,
the rules and Checkov cover them with the rest), and here: the InferencePool against the extension's v1 CRD (v1.6.0),
the picker's configuration against its EndpointPickerConfig format (v0.10.0, tests/unit/data/endpoint-picker), its
numbers recomputed from t4serve's plan (the KV block size, the T4's KV cache, max_model_len), the pool wired to
t4serve's pods and to the picker, the picker's pod under Pod Security's restricted profile with read-only RBAC and its
own NetworkPolicy, the components that exclude it refusing to render with a message naming both, and the namespace
following it. Each rule has a broken render it must catch. What the picker scrapes on a pod is checked against the
stand-in's real /metrics in tests/image/test_inference_pool_metrics.py."""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from k8s_manifests import (
    COMPONENTS,
    DEPLOY,
    DOCS,
    T4SERVE,
    Obj,
    container,
    deployment,
    documented_recipes,
    kinds,
    one,
    pod_spec,
    render_combination,
    render_recipe,
)
from sample_facts import t4
from test_kubernetes import (
    CLUSTER_SCOPED,
    CRD_DIR,
    K8S_VERSIONS,
    admits,
    namespace_problems,
    restricted_problems,
    settings_of,
    validation_errors,
)

from t4serve.apiguard import OPEN_PATHS
from t4serve.config.kvflags import BLOCK_SIZE_FLAG
from t4serve.pipeline import ensure_model
from t4serve.planning import kvcache
from t4serve.planning.plan import Plan, plan

PICKER_DATA = Path(__file__).parent / "data" / "endpoint-picker" / "llm-d-router_v0.10.0.json"
PICKER = json.loads(PICKER_DATA.read_text())
POOL_SCHEMA = CRD_DIR / "inference.networking.k8s.io_inferencepool_v1.json"
POOL_API = "inference.networking.k8s.io"
PICKER_NAME = "t4serve-endpoint-picker"
PICKER_CONFIG_KEY = "endpoint-picker.yaml"
# The other ways in set a request timeout of this many seconds (components/gateway-gke, components/ingress).
WAY_IN_TIMEOUT_S = 600
GOOGLE_HEALTH_CHECK_RANGES = {"130.211.0.0/22", "35.191.0.0/16"}
PROXY_ONLY_PLACEHOLDER = "set-your-proxy-only-subnet-range"
# Verbs that change the cluster: the picker's Role grants none.
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Obj]]:
    """The pool over every overlay, and GKE's variant over GKE's two."""
    renders = {}
    for overlay in sorted(p.name for p in (DEPLOY / "overlays").iterdir() if p.is_dir()):
        renders[overlay] = render_combination(overlay, ("inference-pool",), tmp_path_factory.mktemp("pool"))
    for overlay in ("gke-t4", "gke-autopilot"):
        renders[f"{overlay}-gke"] = render_combination(overlay, ("inference-pool-gke",), tmp_path_factory.mktemp("gke"))
    return renders


def t4_plan(objs: list[Obj]) -> Plan:
    """The plan `t4serve serve` makes on a T4 with the render's settings (the base's: QAT)."""
    settings = settings_of(objs)
    return plan(settings, ensure_model(settings, t4()))


def picker(objs: list[Obj]) -> Obj:
    return one(objs, "Deployment", PICKER_NAME)


def picker_container(objs: list[Obj]) -> Obj:
    (ctr,) = picker(objs)["spec"]["template"]["spec"]["containers"]
    result: Obj = ctr
    return result


def args_of(ctr: Obj) -> dict[str, str]:
    """The picker's `--flag=value` arguments (llm-d-router's flags are pflag: `--flag=value` or `--flag value`)."""
    out = {}
    for arg in ctr["args"]:
        name, eq, value = arg.partition("=")
        assert name.startswith("--") and eq, f"argument {arg!r} is not --flag=value"
        out[name[2:]] = value
    return out


def picker_config(objs: list[Obj]) -> Obj:
    """The EndpointPickerConfig the picker reads: the file --config-file names, in the ConfigMap mounted there."""
    ctr = picker_container(objs)
    path = Path(args_of(ctr)["config-file"])
    mount = next(m for m in ctr["volumeMounts"] if Path(m["mountPath"]) == path.parent)
    volume = next(v for v in picker(objs)["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    config_map = one(objs, "ConfigMap", volume["configMap"]["name"])
    config: Obj = yaml.safe_load(config_map["data"][path.name])
    return config


def plugin_params(config: Obj, plugin_type: str) -> Obj:
    (spec,) = [p for p in config["plugins"] if p["type"] == plugin_type]
    params: Obj = spec.get("parameters", {})
    return params


def weights(config: Obj) -> dict[str, float]:
    (profile,) = config["schedulingProfiles"]
    names = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
    return {names[p["pluginRef"]]: float(p["weight"]) for p in profile["plugins"] if "weight" in p}


# ----------------------------------------------------------------------------------------------------------- rules


def config_problems(objs: list[Obj]) -> list[str]:
    """The picker's configuration: valid for llm-d-router v0.10.0, every reference declared, and its numbers t4serve's
    on a T4."""
    config = picker_config(objs)
    validator = jsonschema.Draft202012Validator(PICKER["config_schema"])
    problems = [f"config: {'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(config)]
    if problems:
        return problems
    declared = {p.get("name", p["type"]) for p in config["plugins"]}
    refs = [p["pluginRef"] for profile in config["schedulingProfiles"] for p in profile["plugins"]]
    for source in config.get("dataLayer", {}).get("sources", []):
        refs += [source["pluginRef"], *(e["pluginRef"] for e in source["extractors"])]
    problems += [f"config: pluginRef {r} names no plugin" for r in refs if r not in declared]

    # What the picker scrapes: the pods' metrics path, which t4serve's API-key guard leaves open, over plain HTTP.
    source = plugin_params(config, "metrics-data-source")
    if source.get("path", "/metrics") not in OPEN_PATHS or source.get("path") != PICKER["scrape"]["path"]:
        problems.append(f"scrape: path {source.get('path')} is not the open {PICKER['scrape']['path']}")
    if source.get("scheme", "http") != "http":
        problems.append("scrape: t4serve's port serves plain HTTP")

    # The prefix index, in t4serve's KV blocks and a T4's KV cache.
    the_plan = t4_plan(objs)
    served_block = int(the_plan.argv[the_plan.argv.index(BLOCK_SIZE_FLAG) + 1])
    prefix = plugin_params(config, "approx-prefix-cache-producer")
    block = prefix.get("blockSizeTokens")
    floor = PICKER["approx_prefix"]["minBlockSizeTokens"]
    expected_block = -(-floor // served_block) * served_block
    if block != expected_block:
        problems.append(f"prefix: blockSizeTokens {block}, expected {expected_block}: the least multiple of the "
                        f"served block size {served_block} at or above the picker's floor {floor}")  # fmt: skip
    if prefix.get("autoTune", True):
        problems.append("prefix: autoTune would size each pod's index from num_gpu_blocks, which Gemma 4's KV groups "
                        "share")  # fmt: skip
    assert the_plan.sizing is not None
    kv_tokens, max_model_len = int(the_plan.sizing.kv_tokens.value), int(the_plan.sizing.max_model_len.value)
    if block and prefix.get("lruCapacityPerServer") != kv_tokens // block:
        problems.append(f"prefix: lruCapacityPerServer {prefix.get('lruCapacityPerServer')}, the plan's KV cache on a "
                        f"T4 holds {kv_tokens} tokens = {kv_tokens // block} blocks of {block}")  # fmt: skip
    if prefix.get("maxPrefixTokensToMatch") != max_model_len:
        problems.append(f"prefix: maxPrefixTokensToMatch {prefix.get('maxPrefixTokensToMatch')}, the plan admits "
                        f"prompts up to max_model_len {max_model_len}")  # fmt: skip

    # The scorers that matter on a T4: the prefix first, then the queue, then KV use.
    w = weights(config)
    order = ["prefix-cache-scorer", "queue-scorer", "kv-cache-utilization-scorer"]
    if set(w) != set(order) or not w[order[0]] > w[order[1]] > w[order[2]] > 0:
        problems.append(f"scorers: weights {w}, expected prefix > queue > KV use > 0")
    return problems


def pool_problems(objs: list[Obj]) -> list[str]:
    """The pool, its route and its picker wired together and to t4serve's pods."""
    problems: list[str] = []
    pool = one(objs, "InferencePool")
    spec = pool["spec"]
    server_pods = deployment(objs)["spec"]["template"]
    picker_pods = picker(objs)["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in container(objs)["ports"]}
    selector = spec["selector"]["matchLabels"]
    if any(server_pods["metadata"]["labels"].get(k) != v for k, v in selector.items()):
        problems.append(f"pool: selector {selector} does not select t4serve's pods")
    if all(picker_pods["metadata"]["labels"].get(k) == v for k, v in selector.items()):
        problems.append("pool: selector selects the picker's own pods")
    if [p["number"] for p in spec["targetPorts"]] != [ports["http"]] or ports["http"] != settings_of(objs).port:
        problems.append(f"pool: targetPorts {spec['targetPorts']} are not the API port {ports['http']}")

    # The pool's picker: its Service, the port it serves ext_proc on, and the pool it serves.
    ref = spec["endpointPickerRef"]
    service = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}.get(ref["name"])
    ctr = picker_container(objs)
    args = args_of(ctr)
    picker_ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    if service is None or ref.get("kind", "Service") != "Service" or ref.get("group", "") != "":
        problems.append(f"pool: endpointPickerRef {ref} names no Service of the render")
    else:
        if any(picker_pods["metadata"]["labels"].get(k) != v for k, v in service["spec"]["selector"].items()):
            problems.append(f"pool: Service {ref['name']} does not select the picker's pods")
        # The CRD's CEL rule (derive.py drops CEL): a Service reference needs its port.
        by_port = {p["port"]: p for p in service["spec"]["ports"]}
        target = by_port.get(ref.get("port", {}).get("number"), {}).get("targetPort")
        if picker_ports.get(target, target) != int(args["grpc-port"]):
            problems.append(f"pool: endpointPickerRef port {ref.get('port')} does not reach the picker's --grpc-port")
    if args.get("pool-name") != pool["metadata"]["name"] or args.get("pool-group") != POOL_API:
        problems.append(f"picker: --pool-name {args.get('pool-name')} / --pool-group {args.get('pool-group')} are "
                        f"not the pool {pool['metadata']['name']}")  # fmt: skip
    env = {e["name"]: e for e in ctr.get("env", [])}
    if env.get("NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "metadata.namespace":
        problems.append("picker: NAMESPACE (the pool's namespace) is not its own, from the downward API")
    for probe in ("readinessProbe", "livenessProbe"):
        if ctr.get(probe, {}).get("grpc", {}).get("port") != int(args["grpc-health-port"]):
            problems.append(f"picker: {probe} does not ask --grpc-health-port")
    if picker_ports.get("metrics") != int(args["metrics-port"]) or picker_ports.get("grpc-health") != int(
        args["grpc-health-port"]
    ):
        problems.append(f"picker: its ports {picker_ports} differ from its flags")

    # The route sends everything to the pool, nothing to the Service, within the other ways in's timeout.
    route = one(objs, "HTTPRoute")["spec"]
    backends = [b for rule in route["rules"] for b in rule["backendRefs"]]
    if backends != [{"group": POOL_API, "kind": "InferencePool", "name": pool["metadata"]["name"]}]:
        problems.append(f"route: backendRefs {backends} are not the pool alone")
    timeouts = [rule.get("timeouts", {}).get("request") for rule in route["rules"]]
    policies = [o for o in objs if o["kind"] == "GCPBackendPolicy" and o["spec"]["targetRef"]["kind"] == pool["kind"]]
    if policies:
        if timeouts != [None] or policies[0]["spec"]["default"]["timeoutSec"] != WAY_IN_TIMEOUT_S:
            problems.append("route: on GKE the backend policy's timeoutSec carries the timeout, not the route")
    elif timeouts != [f"{WAY_IN_TIMEOUT_S}s"]:
        problems.append(f"route: request timeouts {timeouts}, expected {WAY_IN_TIMEOUT_S}s")

    # The picker's pod: Pod Security's restricted profile, a read-only root, no GPU, a grace period at least the
    # pool's pods'.
    pod = picker_pods["spec"]
    problems += [f"picker restricted: {p}" for p in restricted_problems(pod)]
    if ctr.get("securityContext", {}).get("readOnlyRootFilesystem") is not True:
        problems.append("picker: readOnlyRootFilesystem must be true")
    if any("nvidia.com/gpu" in ctr.get("resources", {}).get(k, {}) for k in ("requests", "limits")):
        problems.append("picker: asks for a GPU")
    if pod.get("terminationGracePeriodSeconds", 30) < pod_spec(objs)["terminationGracePeriodSeconds"]:
        problems.append("picker: grace period shorter than the pool's pods'")

    # RBAC: read-only, in the namespace, bound to the service account the picker runs as.
    if any(o["kind"] in ("ClusterRole", "ClusterRoleBinding") for o in objs):
        problems.append("rbac: the picker needs no cluster-wide role")
    role = one(objs, "Role", PICKER_NAME)
    granted = {(group, resource): set(rule["verbs"]) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"]}  # fmt: skip
    if any(verbs & WRITE_VERBS for verbs in granted.values()):
        problems.append(f"rbac: the Role writes: {granted}")
    for need in ((POOL_API, "inferencepools"), ("", "pods")):
        if not {"get", "list", "watch"} <= granted.get(need, set()):
            problems.append(f"rbac: the picker cannot read {need[1]}")
    binding = one(objs, "RoleBinding", PICKER_NAME)
    subject = {"kind": "ServiceAccount", "name": pod.get("serviceAccountName"),
               "namespace": picker(objs)["metadata"].get("namespace")}  # fmt: skip
    if binding["roleRef"]["name"] != role["metadata"]["name"] or binding["subjects"] != [subject]:
        problems.append(f"rbac: the RoleBinding binds {binding['subjects']}, the picker runs as {subject}")
    if not pod.get("serviceAccountName") or pod.get("automountServiceAccountToken") is False:
        problems.append("rbac: the picker needs its service account's token")

    # Who reaches the picker: the gateway's proxies on ext_proc, Prometheus on its metrics, nobody else.
    policies_np = [o for o in objs if o["kind"] == "NetworkPolicy"]
    for (source, port), expected in {("envoy-gateway-system", "grpc"): True, ("envoy-gateway-system", "metrics"): False,
                                     ("monitoring", "metrics"): True, ("monitoring", "grpc"): False,
                                     ("other-team", "grpc"): False}.items():  # fmt: skip
        got = any(admits(p, picker_pods, picker_ports, source, {"app": "x"}, picker_ports[port]) for p in policies_np
                  if _selects_pods(p, picker_pods))  # fmt: skip
        if got != expected:
            problems.append(f"picker network: {source} {'reaches' if got else 'cannot reach'} {port}")
    return problems


def _selects_pods(policy: Obj, template: Obj) -> bool:
    selector = policy["spec"]["podSelector"]
    labels = template["metadata"]["labels"]
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


def gke_problems(objs: list[Obj]) -> list[str]:
    """GKE's Inference Gateway: the route on its Gateway, the pool's health check where the key leaves it open, the
    load balancer's sources admitted to the ports they use, and the proxy-only subnet set."""
    problems: list[str] = []
    gateway = one(objs, "Gateway")
    route = one(objs, "HTTPRoute")["spec"]
    if route["parentRefs"] != [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                "name": gateway["metadata"]["name"]}]:  # fmt: skip
        problems.append(f"gke: the route's parentRefs {route['parentRefs']} are not the Gateway")
    if gateway["spec"]["gatewayClassName"] not in ("gke-l7-regional-external-managed", "gke-l7-rilb"):
        problems.append(f"gke: class {gateway['spec']['gatewayClassName']} is not one GKE's Inference Gateway serves")
    pool = {"group": POOL_API, "kind": "InferencePool", "name": one(objs, "InferencePool")["metadata"]["name"]}
    check = one(objs, "HealthCheckPolicy")["spec"]
    http = check["default"]["config"]["httpHealthCheck"]
    port = {p["name"]: p["containerPort"] for p in container(objs)["ports"]}["http"]
    if check["targetRef"] != pool or http["requestPath"] not in OPEN_PATHS or http["port"] != port:
        problems.append(f"gke: the health check {check} does not ask an open path of the pool's port")
    policy = one(objs, "NetworkPolicy", "t4serve-gke-inference-gateway")
    server, picker_pods = deployment(objs)["spec"]["template"], picker(objs)["spec"]["template"]
    if not (_selects_pods(policy, server) and _selects_pods(policy, picker_pods)):
        problems.append("gke: the load balancer's policy does not select both t4serve's and the picker's pods")
    ranges: dict[str, set[str]] = {}
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            ranges.setdefault(peer["ipBlock"]["cidr"], set()).update(p["port"] for p in rule["ports"])
    health = {cidr for cidr, named in ranges.items() if named == {"http", "grpc-health"}}
    proxies = [cidr for cidr, named in ranges.items() if named == {"http", "grpc"}]
    if health != GOOGLE_HEALTH_CHECK_RANGES:
        problems.append(f"gke: health checkers admitted from {health}, Google's are {GOOGLE_HEALTH_CHECK_RANGES}")
    if len(proxies) != 1:
        problems.append(f"gke: the proxy-only subnet is not admitted once: {ranges}")
    else:
        try:
            ipaddress.ip_network(proxies[0])
        except ValueError:
            problems.append(f"gke: the proxy-only subnet's range is {proxies[0]!r}: set yours (docs/kubernetes.md)")
    return problems


def test_the_pool_holds_every_rule_over_every_cloud(pools: dict[str, list[Obj]]) -> None:
    problems = []
    for name, objs in pools.items():
        problems += [f"{name}: {p}" for p in pool_problems(objs) + config_problems(objs) + namespace_problems(objs)]
        for version in K8S_VERSIONS:
            problems += [f"{name} {o['kind']}: {e}" for o in objs for e in validation_errors(o, version)]
    assert problems == []
    expected = {"InferencePool", "HTTPRoute", "ServiceAccount", "Role", "RoleBinding"}
    for name, objs in pools.items():
        assert expected <= set(kinds(objs)), name
        assert kinds(objs).count("Deployment") == 2 and kinds(objs).count("Service") == 2, name
        assert "Gateway" in kinds(objs) if name.endswith("-gke") else "Gateway" not in kinds(objs)


def test_the_picker_is_told_t4serves_block_size_and_a_t4s_cache(pools: dict[str, list[Obj]]) -> None:
    objs = pools["gke-t4"]
    the_plan = t4_plan(objs)
    served = int(the_plan.argv[the_plan.argv.index(BLOCK_SIZE_FLAG) + 1])
    # The block size vLLM is given is the one t4serve's KV accounting counts in.
    assert served == kvcache.DEFAULT_BLOCK_SIZE == 16
    prefix = plugin_params(picker_config(objs), "approx-prefix-cache-producer")
    assert prefix["blockSizeTokens"] % served == 0 and prefix["blockSizeTokens"] >= 64
    assert the_plan.sizing is not None
    print(f"\npicker: blocks of {prefix['blockSizeTokens']} tokens = {prefix['blockSizeTokens'] // served} of "
          f"t4serve's {served}; {prefix['lruCapacityPerServer']:,} per pod = the plan's "
          f"{int(the_plan.sizing.kv_tokens.value):,} KV tokens on a T4; prompts matched up to "
          f"{prefix['maxPrefixTokensToMatch']:,} tokens")  # fmt: skip


Mutation = Callable[[list[Obj]], None]


def _edit_config(edit: Callable[[Obj], None]) -> Mutation:
    """Edit the picker's configuration file where the picker reads it."""

    def mutate(objs: list[Obj]) -> None:
        volume = next(v for v in picker(objs)["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
        config_map = one(objs, "ConfigMap", volume["configMap"]["name"])
        config = yaml.safe_load(config_map["data"][PICKER_CONFIG_KEY])
        edit(config)
        config_map["data"][PICKER_CONFIG_KEY] = yaml.safe_dump(config)

    return mutate


def _prefix(key: str, value: Any) -> Callable[[Obj], None]:
    def edit(config: Obj) -> None:
        params = next(p for p in config["plugins"] if p["type"] == "approx-prefix-cache-producer")["parameters"]
        params[key] = value

    return edit


def _weight(ref: str, value: float) -> Callable[[Obj], None]:
    def edit(config: Obj) -> None:
        next(p for p in config["schedulingProfiles"][0]["plugins"] if p["pluginRef"] == ref)["weight"] = value

    return edit


def _path(kind: str, name: str | None, path: tuple[str | int, ...], value: Any) -> Mutation:
    """Set (None: delete) a field of a rendered object."""

    def mutate(objs: list[Obj]) -> None:
        node: Any = one(objs, kind, name)
        for key in path[:-1]:
            node = node[key]
        if value is None:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return mutate


def _arg(flag: str, value: str) -> Mutation:
    def mutate(objs: list[Obj]) -> None:
        ctr = picker_container(objs)
        ctr["args"] = [a if not a.startswith(f"--{flag}=") else f"--{flag}={value}" for a in ctr["args"]]

    return mutate


def _add_rule(rule: Obj) -> Mutation:
    def mutate(objs: list[Obj]) -> None:
        one(objs, "Role", PICKER_NAME)["rules"].append(rule)

    return mutate


CONFIG_BREAKAGES: dict[str, tuple[Mutation, str]] = {
    "block of 16 (raised to 64 by the picker)": (_edit_config(_prefix("blockSizeTokens", 16)), "prefix:"),
    "block not a whole number of t4serve's": (_edit_config(_prefix("blockSizeTokens", 72)), "prefix:"),
    "autoTune on": (_edit_config(_prefix("autoTune", True)), "prefix:"),
    "the picker's default capacity": (_edit_config(_prefix("lruCapacityPerServer", 31250)), "prefix:"),
    "matching past max_model_len": (_edit_config(_prefix("maxPrefixTokensToMatch", 131072)), "prefix:"),
    "misspelt parameter": (_edit_config(_prefix("blockSizeToken", 64)), "config:"),
    "queue before the prefix": (_edit_config(_weight("queue-scorer", 5)), "scorers:"),
    "KV use before the queue": (_edit_config(_weight("kv-cache-utilization-scorer", 3)), "scorers:"),
    "unknown plugin type": (_edit_config(lambda c: c["plugins"].append({"type": "prefix-scorer"})), "config:"),
    "reference to no plugin": (_edit_config(lambda c: c["schedulingProfiles"][0]["plugins"].append(
        {"pluginRef": "lora-affinity-scorer"})), "config:"),
    "guarded scrape path": (_edit_config(lambda c: c["plugins"][0]["parameters"].update(path="/v1/metrics")),
                            "scrape:"),
    "old apiVersion": (_edit_config(lambda c: c.update(apiVersion="inference.networking.x-k8s.io/v1alpha1")),
                       "config:"),
}  # fmt: skip
POOL_BREAKAGES: dict[str, tuple[Mutation, str]] = {
    "selector matches nothing": (_path("InferencePool", None, ("spec", "selector", "matchLabels"),
                                       {"app": "vllm"}), "pool:"),
    "selector matches the picker too": (_path("InferencePool", None, ("spec", "selector", "matchLabels"),
                                              {"app.kubernetes.io/part-of": "t4serve"}), "pool:"),
    "wrong target port": (_path("InferencePool", None, ("spec", "targetPorts"), [{"number": 8080}]), "pool:"),
    "picker port missing": (_path("InferencePool", None, ("spec", "endpointPickerRef", "port"), None), "pool:"),
    "picker on its metrics port": (_path("InferencePool", None, ("spec", "endpointPickerRef", "port"),
                                         {"number": 9090}), "pool:"),
    "picker Service misnamed": (_path("InferencePool", None, ("spec", "endpointPickerRef", "name"), "epp"), "pool:"),
    "another pool's picker": (_arg("pool-name", "vllm-pool"), "picker:"),
    "health probe elsewhere": (_arg("grpc-health-port", "9004"), "picker:"),
    "route to the Service": (_path("HTTPRoute", None, ("spec", "rules", 0, "backendRefs"),
                                   [{"name": "t4serve", "port": 8000}]), "route:"),
    "route's default timeout": (_path("HTTPRoute", None, ("spec", "rules", 0, "timeouts"), None), "route:"),
    "picker as root": (_path("Deployment", PICKER_NAME, ("spec", "template", "spec", "securityContext",
                                                          "runAsNonRoot"), False), "picker restricted:"),
    "picker grace shorter than the pods'": (_path("Deployment", PICKER_NAME, ("spec", "template", "spec",
                                                                              "terminationGracePeriodSeconds"), 30),
                                            "picker:"),
    "picker writes pods": (_add_rule({"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}), "rbac:"),
    "binding to another account": (_path("RoleBinding", PICKER_NAME, ("subjects", 0, "name"), "default"), "rbac:"),
    "picker open to every namespace": (_path("NetworkPolicy", PICKER_NAME, ("spec", "ingress", 0, "from"),
                                             [{"namespaceSelector": {}}]), "picker network:"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CONFIG_BREAKAGES) + list(POOL_BREAKAGES))
def test_each_rule_catches_its_drift(pools: dict[str, list[Obj]], name: str) -> None:
    objs = copy.deepcopy(pools["eks-g4dn"])
    mutate, prefix = {**CONFIG_BREAKAGES, **POOL_BREAKAGES}[name]
    mutate(objs)
    problems = config_problems(objs) if name in CONFIG_BREAKAGES else pool_problems(objs)
    assert any(p.startswith(prefix) for p in problems), problems


def test_the_pool_schema_rejects_what_the_api_server_would(pools: dict[str, list[Obj]]) -> None:
    """The extension's v1 CRD, derived whole: a field of the old v1alpha2 pool and a port out of range fail."""
    assert "v1.6.0" in json.loads(POOL_SCHEMA.read_text())["$comment"]
    pool = one(pools["aks-t4"], "InferencePool")
    for path, value in ((("spec", "targetPortNumber"), 8000), (("spec", "targetPorts"), [{"number": 0}]),
                        (("spec", "endpointPickerRef", "failureMode"), "FailSafe"), (("spec", "targetPorts"), [])):
        broken = copy.deepcopy(pool)
        node = broken
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        assert validation_errors(broken, K8S_VERSIONS[0]), path  # fmt: skip


# ------------------------------------------------------------------------------------------------ GKE's variant


def test_gke_routes_through_its_inference_gateway(pools: dict[str, list[Obj]], tmp_path: Path) -> None:
    for name in ("gke-t4-gke", "gke-autopilot-gke"):
        problems = gke_problems(pools[name])
        # Shipped with the range unset (yours): only that is wrong, and it says so.
        assert problems == [f"gke: the proxy-only subnet's range is {PROXY_ONLY_PLACEHOLDER!r}: set yours "
                            "(docs/kubernetes.md)"], problems  # fmt: skip
    recipe = documented_recipes()["gke-inference-pool"]
    objs = render_recipe(recipe, tmp_path)
    assert gke_problems(objs) == [] and pool_problems(objs) == [] and config_problems(objs) == []
    broken = copy.deepcopy(objs)
    one(broken, "HealthCheckPolicy")["spec"]["default"]["config"]["httpHealthCheck"]["requestPath"] = "/"
    assert any("health check" in p for p in gke_problems(broken))
    broken = copy.deepcopy(objs)
    one(broken, "NetworkPolicy", "t4serve-gke-inference-gateway")["spec"]["ingress"][1]["from"].pop()
    assert any("health checkers" in p for p in gke_problems(broken))


# ------------------------------------------------------------------------------- ways in that exclude each other


def render_error(overlay: str, components: tuple[str, ...], folder: Path) -> str:
    with pytest.raises(RuntimeError) as failed:
        render_combination(overlay, components, folder)
    return str(failed.value)


@pytest.mark.parametrize(
    ("overlay", "components", "named"),
    [
        ("gke-t4", ("gateway", "inference-pool"), "way-in-gateway-or-ingress-excludes-inference-pool"),
        ("eks-g4dn", ("inference-pool", "ingress"), "way-in-inference-pool-excludes-gateway-and-ingress"),
        ("aks-t4", ("ingress", "inference-pool"), "way-in-gateway-or-ingress-excludes-inference-pool"),
        ("gke-autopilot", ("gateway-gke", "inference-pool-gke"), "way-in-gateway-or-ingress-excludes-inference-pool"),
        ("gke-t4", ("inference-pool-gke", "gateway-gke"), "way-in-inference-pool-excludes-gateway-and-ingress"),
    ],
)
def test_a_route_to_the_service_and_the_pool_refuse_to_render_together(
    overlay: str, components: tuple[str, ...], named: str, tmp_path: Path
) -> None:
    message = render_error(overlay, components, tmp_path)
    later = components[-1].removesuffix("-gke")
    assert f"components/{components[-1]}" in message and named in message and "test failed" in message, message
    assert later in named


# ------------------------------------------------------------------------------------------------ the namespace


@pytest.mark.parametrize(("overlay", "component"), [("eks-g4dn", "inference-pool"), ("gke-t4", "inference-pool-gke")])
def test_the_pool_follows_the_namespace_set_below_it(overlay: str, component: str, tmp_path: Path) -> None:
    objs = render_combination(overlay, ("namespace", "monitoring", "keda", component), tmp_path, namespace="team-b")
    assert namespace_problems(objs) == []
    assert {o["metadata"].get("namespace") for o in objs if o["kind"] not in CLUSTER_SCOPED} == {"team-b"}
    assert one(objs, "RoleBinding", PICKER_NAME)["subjects"][0]["namespace"] == "team-b"
    assert pool_problems(objs) == []
    broken = copy.deepcopy(objs)
    one(broken, "RoleBinding", PICKER_NAME)["subjects"][0]["namespace"] = "t4serve"
    assert any("binds ServiceAccount" in p for p in namespace_problems(broken))


# ------------------------------------------------------------------------------------ pinned, and named in one place


def test_the_picker_image_is_pinned_by_version_in_one_place(pools: dict[str, list[Obj]]) -> None:
    for objs in pools.values():
        assert picker_container(objs)["image"] == PICKER["image"]
    tag = PICKER["image"].rpartition(":")[2]
    assert re.fullmatch(r"v\d+\.\d+\.\d+", tag) and tag == PICKER["version"]
    mentions = [p for p in DEPLOY.rglob("*.yaml") if "llm-d-router-endpoint-picker" in p.read_text()]
    assert mentions == [COMPONENTS / "inference-pool" / "kustomization.yaml"]
    component = yaml.safe_load(mentions[0].read_text())
    assert component["images"] == [{"name": "endpoint-picker", "newName": PICKER["image"].rpartition(":")[0],
                                    "newTag": tag}]  # fmt: skip
    assert yaml.safe_load((COMPONENTS / "inference-pool" / "deployment.yaml").read_text())["spec"]["template"][
        "spec"]["containers"][0]["image"] == "endpoint-picker"  # fmt: skip


def test_the_docs_install_the_versions_the_tests_check() -> None:
    """docs/kubernetes.md installs the extension's CRDs and names the picker at the versions of the test data."""
    text = DOCS.read_text()
    crd = re.search(r"gateway-api-inference-extension/releases/download/(v[\d.]+)/v1-manifests\.yaml", text)
    assert crd and crd.group(1) in json.loads(POOL_SCHEMA.read_text())["$comment"]
    assert f"llm-d-router {PICKER['version']}" in text
    assert "inference-pool" in text and "inference-pool-gke" in text


def envoy_gateway_manifests() -> list[Obj]:
    block = re.search(r"<!-- manifest: envoy-gateway -->\n```yaml\n(.*?)```", DOCS.read_text(), re.S)
    assert block, "docs/kubernetes.md shows no Envoy Gateway manifest"
    return [d for d in yaml.safe_load_all(block.group(1)) if d]


def test_the_documented_envoy_gateway_is_valid_and_takes_the_route() -> None:
    """The GatewayClass and Gateway the docs apply for Envoy Gateway, against Gateway API v1.6.1's CRDs; the pool's
    route attaches to that Gateway, and the proxies' namespace is the one the NetworkPolicies admit by label."""
    objs = envoy_gateway_manifests()
    schemas = {"GatewayClass": "gateway.networking.k8s.io_gatewayclass_v1.json",
               "Gateway": "gateway.networking.k8s.io_gateway_v1.json"}  # fmt: skip
    assert sorted(kinds(objs)) == sorted(schemas)
    for obj in objs:
        schema = json.loads((CRD_DIR / schemas[obj["kind"]]).read_text())
        assert "v1.6.1" in schema["$comment"]
        assert list(jsonschema.Draft202012Validator(schema).iter_errors(obj)) == [], obj["kind"]
    gateway, gateway_class = one(objs, "Gateway"), one(objs, "GatewayClass")
    assert gateway["spec"]["gatewayClassName"] == gateway_class["metadata"]["name"]
    assert gateway_class["spec"]["controllerName"] == "gateway.envoyproxy.io/gatewayclass-controller"
    route = yaml.safe_load((COMPONENTS / "inference-pool" / "httproute.yaml").read_text())
    assert route["spec"]["parentRefs"][0]["name"] == gateway["metadata"]["name"] == T4SERVE
    assert "kubectl label namespace envoy-gateway-system t4serve/gateway=true" in DOCS.read_text()
