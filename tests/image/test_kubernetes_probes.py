"""The rendered Kubernetes pod, run by a kubelet double (tests/image/kubelet.py) on the stand-in image: its own
command, environment, volumes, security context, probe commands, thresholds, preStop and grace period. Checks: ready
only after the canary (and never with a wrong one), a hang turns liveness red within its budget while a reload never
does, and termination runs preStop, then SIGTERM, and the in-flight request is drained.

The only change to the rendered pod is a test-only kustomize patch that shortens the probes' periodSeconds (and the
startup failureThreshold, so a start is still bounded), checked below to touch nothing else; the stand-in's knobs
make loading fast or slow. No GPU: T4SERVE_PREFLIGHT=warn, as in test_supervision."""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import yaml

from . import test_supervision
from .conftest import REPO
from .kubelet import PodRun

pytestmark = pytest.mark.image

# The stand-in image fixture of the supervision tests, reused as it is.
standin = test_supervision.standin


def _load_manifests() -> ModuleType:
    """tests/unit/k8s_manifests.py, the renderer the unit tests use (tests/unit is not a package)."""
    spec = importlib.util.spec_from_file_location("k8s_manifests", REPO / "tests" / "unit" / "k8s_manifests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


manifests = _load_manifests()
API_KEY = "sk-kubelet-double-0123456789"
SECRETS = {"t4serve-hf-token": {"hf_token": "hf_kubelet_double_token"}, "t4serve-api-key": {"api_key": API_KEY}}
# Test-only: probe periods of 1 s (the rendered 10-15 s would make each check take minutes); startup's threshold so
# that 1 s x 40 still bounds a start here. Commands, timeouts, liveness and readiness thresholds, preStop and the
# grace period stay as rendered.
PERIODS_PATCH = [
    {"op": "replace", "path": "/spec/template/spec/containers/0/startupProbe/periodSeconds", "value": 1},
    {"op": "replace", "path": "/spec/template/spec/containers/0/startupProbe/failureThreshold", "value": 40},
    {"op": "replace", "path": "/spec/template/spec/containers/0/readinessProbe/periodSeconds", "value": 1},
    {"op": "replace", "path": "/spec/template/spec/containers/0/livenessProbe/periodSeconds", "value": 1},
]
PATCHED_FIELDS = {("startupProbe", "periodSeconds"), ("startupProbe", "failureThreshold"),
                  ("readinessProbe", "periodSeconds"), ("livenessProbe", "periodSeconds")}  # fmt: skip


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """The base's pod template with the periods patch, and its ConfigMaps; checked to differ from the plain render
    only in the patched fields."""
    folder = tmp_path_factory.mktemp("kustomize-probe-periods")
    (folder / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(manifests.DEPLOY / "base", folder)],
        "patches": [{"target": {"kind": "Deployment", "name": "t4serve"}, "patch": json.dumps(PERIODS_PATCH)}],
    }))  # fmt: skip
    objs = manifests.render(folder)
    plain = manifests.container(manifests.render(manifests.DEPLOY / "base"))
    patched = copy.deepcopy(manifests.container(objs))
    for probe, key in PATCHED_FIELDS:
        plain[probe].pop(key)
        patched[probe].pop(key)
    assert patched == plain, "the test patch may change probe periods and the startup threshold only"
    pod = manifests.one(objs, "Deployment")["spec"]["template"]
    configmaps = {o["metadata"]["name"]: o["data"] for o in objs if o["kind"] == "ConfigMap"}
    return pod, configmaps


Run = Callable[..., PodRun]


@pytest.fixture
def run_pod(
    docker_bin: str, standin: str, rendered: tuple[dict[str, Any], dict[str, dict[str, str]]]
) -> Iterator[Run]:
    runs: list[PodRun] = []

    def start(knobs: dict[str, str], pod: dict[str, Any] | None = None) -> PodRun:
        template, configmaps = rendered
        env = {**test_supervision.BASE_ENV, **knobs}
        run = PodRun(docker_bin, pod or template, configmaps, standin, SECRETS, env)
        runs.append(run)
        run.start_probing()
        return run

    yield start
    for run in runs:
        run.remove()


def _post(port: int, path: str, body: dict[str, Any], key: str | None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wall(monotonic: float) -> float:
    """A host monotonic time on the wall clock the container's state.json uses (one kernel clock), mapped at the
    moment of the comparison, so a slew of the wall clock since the test began does not count."""
    return monotonic + (time.time() - time.monotonic())


def phase_began(state: dict[str, Any], phase: str) -> float:
    return float(next(m["began_at"] for m in state["phases"] if m["phase"] == phase))


def test_ready_only_after_the_canary_and_liveness_green_while_loading(run_pod: Run) -> None:
    pod = run_pod({"T4SERVE_STANDIN_LOAD_SECONDS": "5"})
    loading = lambda: any(": not ready: " in r.output for r in pod.verdict.of("startup"))  # noqa: E731
    assert pod.wait_until(loading, 60), pod.logs()[-3000:]
    # The liveness command, run while the model loads: alive (the kubelet would not run it yet; a reload would).
    during_load = pod.exec_probe("liveness-during-load", pod.ctr["livenessProbe"])
    assert during_load.ok and "alive, loading" in during_load.output, during_load.output
    assert pod.wait_until(lambda: pod.verdict.first_ready() is not None, 60), pod.logs()[-3000:]
    state = pod.state()
    startups = pod.verdict.of("startup")
    print(f"\nstartup probes: {len(startups)} ({sum(not r.ok for r in startups)} not ready), then ready; "
          f"first: {startups[0].output!r}")  # fmt: skip
    assert state["canary"]["ok"] and "391" in state["canary"]["text"]
    assert all(not r.ok for r in startups[:-1]) and startups[-1].ok
    assert all(r.output.startswith("t4serve healthcheck: not ready: ") for r in startups[:-1])
    # The first success came after the canary passed (the "ready" phase begins once it has). Compared by cause, not
    # with a slack: the wrapper stamps "ready", then writes the state, which the probe reads before it ends; a probe
    # that *started* before the stamp may still read the written state on a loaded machine (it did, 52 ms before).
    assert wall(startups[-1].ended) >= phase_began(state, "ready")
    # The probe before it read a state that was not yet ready: it started before the stamp (docker exec alone takes
    # longer than the wrapper's stamp-then-write).
    assert wall(startups[-2].started) < phase_began(state, "ready")
    # The kubelet's spacing: one probe per period (a slow probe delays the next, never overlaps it).
    period = pod.ctr["startupProbe"]["periodSeconds"]
    gaps = [b.started - a.started for a, b in itertools.pairwise(startups)]
    assert min(gaps) >= period * 0.9
    assert pod.wait_until(lambda: len(pod.verdict.of("liveness")) >= 3, 30)
    assert all(r.ok for r in pod.verdict.of("liveness"))
    # What the PodMonitor scrapes and the autoscalers read: the named port's /metrics.
    port = pod.host_port(next(p["containerPort"] for p in pod.ctr["ports"] if p["name"] == "http"))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert "vllm:num_requests_waiting" in response.read().decode()
    # The key from the pod's Secret guards every route that runs the model: /invocations (SageMaker's router, which
    # vLLM's own guard leaves open) as well as /v1/*. t4serve serve's real command line loads t4serve.apiguard.
    served = pod.state()["served_model_name"]
    prompt = {"model": served, "prompt": "17*23=", "max_tokens": 8}
    for path in ("/invocations", "/v1/completions"):
        assert _post(port, path, prompt, None)[0] == 401, path
        assert _post(port, path, prompt, "sk-wrong")[0] == 401, path
        status, body = _post(port, path, prompt, API_KEY)
        assert status == 200 and json.loads(body)["choices"][0]["text"] == "391", (path, status, body)


def test_a_wrong_canary_never_becomes_ready(
    run_pod: Run, rendered: tuple[dict[str, Any], dict[str, dict[str, str]]]
) -> None:
    pod_spec = copy.deepcopy(rendered[0])
    # A shorter startup budget for this one test: the answer is wrong for good, and 15 s show it.
    pod_spec["spec"]["containers"][0]["startupProbe"]["failureThreshold"] = 15
    pod = run_pod({"T4SERVE_STANDIN_MODE": "garbage", "T4SERVE_STANDIN_GARBAGE": "pad"}, pod_spec)
    assert pod.wait_until(lambda: pod.verdict.startup_failed_at is not None, 90), pod.logs()[-3000:]
    assert pod.verdict.first_ready() is None and pod.verdict.startup_succeeded_at is None
    last = pod.verdict.of("startup")[-1].output
    print(f"\nlast startup probe: {last}")
    assert "canary failed" in last


def test_a_hang_turns_liveness_red_within_its_budget(run_pod: Run) -> None:
    hang_after = 3.0
    pod = run_pod({"T4SERVE_STANDIN_MODE": "hang", "T4SERVE_STANDIN_HANG_AFTER": str(hang_after),
                   "T4SERVE_STANDIN_LOAD_SECONDS": "1"})  # fmt: skip
    assert pod.wait_until(lambda: pod.verdict.liveness_failed_at is not None, 120), pod.logs()[-3000:]
    state = pod.state()
    hung_at = phase_began(state, "ready") + hang_after
    probe = pod.ctr["livenessProbe"]
    # Each failed probe lasts at most its timeout, and the next one starts a period later at the latest.
    budget = probe["failureThreshold"] * (probe["periodSeconds"] + probe["timeoutSeconds"])
    took = wall(pod.verdict.liveness_failed_at) - hung_at  # type: ignore[operator]
    print(f"\nliveness red {took:.1f} s after the hang (budget {budget} s); "
          f"last: {pod.verdict.of('liveness')[-1].output}")  # fmt: skip
    assert 0 < took <= budget
    assert pod.verdict.of("liveness")[-1].output.endswith(": hung")
    # Readiness followed the hang, by cause rather than by how soon the kubelet double got to probe on a loaded
    # machine: every readiness answer read before the hang was ready, none that began after it, and the pod went
    # unready only after the hang (it needs failureThreshold misses, which liveness may cut short by stopping the pod).
    readiness = pod.verdict.of("readiness")
    before = [r for r in readiness if wall(r.ended) < hung_at]
    after = [r for r in readiness if wall(r.started) > hung_at]
    assert all(r.ok for r in before) and not any(r.ok for r in after), [(r.ok, r.output) for r in readiness]
    changes = pod.verdict.ready_changes
    if before:
        assert [ready for _, ready in changes][:1] == [True]
    assert all(wall(at) > hung_at for at, ready in changes if not ready)
    print(f"readiness: {len(before)} answers before the hang, {len(after)} after; changes {changes}")


def test_a_reload_inside_the_container_never_turns_liveness_red(run_pod: Run) -> None:
    # Each attempt loads for 4 s and dies 7 s after ready (past supervisord's startsecs), so supervisord restarts vLLM
    # inside the same container and it loads again while liveness keeps probing.
    pod = run_pod({"T4SERVE_STANDIN_MODE": "crash-after-ready", "T4SERVE_STANDIN_CRASH_AFTER": "7",
                   "T4SERVE_STANDIN_LOAD_SECONDS": "4", "T4SERVE_MAX_RESTARTS": "10"})  # fmt: skip
    cycled = pod.wait_until(lambda: [r for _, r in pod.verdict.ready_changes][:3] == [True, False, True], 90)
    assert cycled, (pod.verdict.ready_changes, pod.logs()[-3000:])
    assert pod.verdict.liveness_failed_at is None
    state = pod.state()
    loading = [r for r in pod.verdict.of("liveness") if r.ok and "alive, loading" in r.output]
    failed = [r for r in pod.verdict.of("liveness") if not r.ok]
    print(f"\nattempt {state['attempt']}; liveness: {len(pod.verdict.of('liveness'))} probes, {len(loading)} during "
          f"the reload, {len(failed)} failed (threshold {pod.ctr['livenessProbe']['failureThreshold']})")  # fmt: skip
    assert state["attempt"] >= 2 and loading


def test_termination_runs_prestop_then_sigterm_drains_the_in_flight_request(run_pod: Run) -> None:
    pod = run_pod({"T4SERVE_STANDIN_TOKEN_DELAY": "0.25", "T4SERVE_STANDIN_LOAD_SECONDS": "1"})
    assert pod.wait_until(lambda: pod.verdict.first_ready() is not None, 60), pod.logs()[-3000:]
    served = pod.state()["served_model_name"]
    port = pod.host_port(next(p["containerPort"] for p in pod.ctr["ports"] if p["name"] == "http"))
    tokens = 60  # 15 s of generation: longer than the preStop sleep, so SIGTERM lands mid-request
    result: dict[str, Any] = {}

    def request() -> None:
        body = json.dumps({"model": served, "prompt": "hello", "max_tokens": tokens, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=90) as response:
                result["status"] = response.status
                result["body"] = json.loads(response.read())
        except Exception as exc:  # recorded for the assertion message
            result["error"] = repr(exc)
        result["ended"] = time.monotonic()

    client = threading.Thread(target=request)
    client.start()
    time.sleep(1.0)
    pod.stop_probing()
    term = pod.terminate()
    client.join(timeout=90)
    state = pod.state()
    grace = pod.pod["spec"]["terminationGracePeriodSeconds"]
    prestop = pod.ctr["lifecycle"]["preStop"]["exec"]["command"]
    print(f"\npreStop {prestop} took {term.prestop_ended - term.began:.1f} s; the container exited "
          f"{term.exited_at - term.sigterm_at:.1f} s after SIGTERM (grace {grace} s); request: {result.get('status')}")
    assert term.prestop_rc == 0
    assert term.prestop_ended - term.began >= float(prestop[1]) - 0.5
    # SIGTERM only after preStop: the wrapper entered "stopping" after the hook had returned. By cause, without a
    # slack: the hook returned, then the double sent SIGTERM, then the wrapper stamped "stopping".
    assert wall(term.prestop_ended) <= wall(term.sigterm_at) <= phase_began(state, "stopping")
    assert result.get("status") == 200, result
    assert result["body"]["usage"]["completion_tokens"] == tokens
    assert result["ended"] > term.sigterm_at, "the request was not in flight at SIGTERM"
    assert not term.killed and term.exit_code == 0
    assert term.exited_at - term.began < grace
    assert "passing SIGTERM to vLLM" in pod.logs()
