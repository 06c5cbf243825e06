"""The runner: the `vllm bench serve` command line per cell, progress, failed runs and the result folder.

The client here is a small script standing in for `vllm bench serve` (it writes a result JSON the way vLLM's does);
the real client runs against the stand-in server in tests/image/test_bench.py.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from t4serve.bench import grid
from t4serve.bench.results import Run, read_runs
from t4serve.bench.runner import BenchOptions, Progress, bench_argv, raw_name, run_bench, served_model_name
from t4serve.errors import BenchError

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "vllm_standin.py"

# Writes vLLM's result JSON from its own arguments; fails every run whose seed ends in 2 (repeat 2).
FAKE_CLIENT = """#!{python}
import json, os, sys
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
assert args[:2] == ["bench", "serve"], args
seed = int(value("--seed"))
if seed % 10 == 2:
    print("Traceback: ValueError: Initial test run failed", file=sys.stderr)
    sys.exit(1)
c = int(value("--max-concurrency"))
result = {{"completed": int(value("--num-prompts")), "failed": 0, "output_throughput": 10.0 * c + seed % 10,
          "median_tpot_ms": 20.0, "median_ttft_ms": float(value("--random-input-len")), "mean_ttft_ms": 1.0,
          "total_output_tokens": 8, "duration": 1.0, "model_id": value("--model"), "client_pid": os.getpid()}}
with open(value("--result-dir") + "/" + value("--result-filename"), "w") as f:
    json.dump(result, f)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def client_script(tmp_path: Path, template: str) -> Path:
    """One of the scripts above, written as `tmp_path/fake-vllm` for BenchOptions.vllm."""
    client = tmp_path / "fake-vllm"
    client.write_text(template.format(python=sys.executable))
    client.chmod(0o755)
    return client


def client_package(tmp_path: Path, template: str, import_s: float = 0.0) -> Path:
    """A stand-in for what the sweep's client imports of vLLM: `vllm.benchmarks.serve` (`add_cli_args`, and `main`
    running one of the scripts above with `sys.argv` as `vllm bench serve ARGS`), a parser that keeps the arguments
    as given (`vllm.utils.argparse_utils.FlexibleArgumentParser`), a detected platform (`vllm.platforms`); the
    `vllm` package's import takes `import_s` seconds (vLLM's import is what the sweep's client pays once). Returns
    the folder to put on PYTHONPATH."""
    root = tmp_path / "client-package"
    for sub in ("benchmarks", "utils", "platforms"):
        (root / "vllm" / sub).mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text(f"import time\ntime.sleep({import_s})\n")
    (root / "vllm" / "benchmarks" / "__init__.py").write_text("")
    (root / "vllm" / "utils" / "__init__.py").write_text("")
    (root / "vllm" / "utils" / "argparse_utils.py").write_text(
        "import argparse\n\n\nclass FlexibleArgumentParser(argparse.ArgumentParser):\n"
        "    def parse_args(self, args=None, namespace=None):\n        return argparse.Namespace(argv=list(args))\n")
    (root / "vllm" / "platforms" / "__init__.py").write_text(
        "class _Detected:\n    def is_unspecified(self):\n        return False\n\n\ncurrent_platform = _Detected()\n")
    body = template.format(python=sys.executable).split("\n", 1)[1]
    (root / "vllm" / "benchmarks" / "serve.py").write_text(
        "def add_cli_args(parser):\n    pass\n\n\ndef main(ns):\n    import sys\n"
        "    sys.argv = ['vllm', 'bench', 'serve', *ns.argv]\n" + textwrap.indent(body, "    "))
    return root


def bench_to_the_end(opts: BenchOptions, environ: dict[str, str], stream: io.StringIO) -> None:
    """run_bench, where only a missing matplotlib may stop it (after the tables are written)."""
    try:
        run_bench(opts, environ=environ, stream=stream)
    except Exception as exc:
        assert "matplotlib" in str(exc)


def start_standin(extra_env: dict[str, str]) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    env = {**os.environ, "T4SERVE_STANDIN_LOAD_SECONDS": "0", **extra_env}
    argv = [sys.executable, str(STANDIN), "serve", "tiny", "--port", str(port), "--served-model-name", "served-qat"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.02)
    return f"http://127.0.0.1:{port}", proc


@pytest.fixture
def standin_url() -> Iterator[str]:
    url, proc = start_standin({})
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_bench_argv_is_the_published_sweep() -> None:
    opts = BenchOptions(["qat"], [512], [4], 3, 128, Path("out"), vllm="/opt/venv/bin/vllm")
    cell = grid.Cell(512, 4, 2)
    argv = bench_argv(opts, "http://h:8000", "gemma", "google/x", cell, Path("out/raw/r.json"))
    text = " ".join(argv)
    assert argv[:3] == ["/opt/venv/bin/vllm", "bench", "serve"]
    for part in (
        "--base-url http://h:8000",
        "--model gemma",
        "--tokenizer google/x",
        "--dataset-name random",
        "--random-input-len 512",
        "--random-output-len 128",
        "--num-prompts 40",  # 10 x c: a steady state
        "--max-concurrency 4",
        "--ignore-eos",
        "--temperature 0",
        "--num-warmups 2",
        "--seed 5120402",
        "--save-result --result-dir out/raw --result-filename r.json",
        "--goodput ttft:2000 tpot:100",
        "--save-detailed",
    ):
        assert part in text
    slo = dataclasses.replace(opts, slo_ttft_ms=750.0, slo_tpot_ms=62.5)
    assert "--goodput ttft:750 tpot:62.5" in " ".join(bench_argv(slo, "http://h:8000", "gemma", "g", cell, Path("r")))


def test_raw_name_is_a_safe_file_name() -> None:
    assert raw_name("google/gemma-4-E2B-it", grid.Cell(512, 4, 1)) == "google_gemma-4-E2B-it_in512_c4_r1.json"


def test_progress_prints_count_and_eta() -> None:
    out = io.StringIO()
    progress = Progress(4, out)
    progress.start -= 10  # ten seconds in, one of four runs done: 30 s left
    progress.step("qat in=512 c=1 r=1", "62.27 tok/s")
    line = out.getvalue()
    assert "1/4 qat in=512 c=1 r=1: 62.27 tok/s" in line
    assert "elapsed 10s, ETA 30s" in line


def test_served_model_name_and_its_failure(standin_url: str) -> None:
    assert served_model_name(standin_url) == "served-qat"
    with pytest.raises(BenchError, match="does not list a model"):
        served_model_name(f"http://127.0.0.1:{free_port()}", timeout=1)


def test_run_bench_writes_the_folder_and_keeps_failed_runs(tmp_path: Path, standin_url: str) -> None:
    client = client_script(tmp_path, FAKE_CLIENT)
    out = tmp_path / "result"
    opts = BenchOptions(
        models=["qat", "bf16"],
        inputs=[32],
        concurrencies=[1, 2],
        repeats=2,
        output_len=8,
        output=out,
        base_urls={"qat": standin_url, "bf16": f"http://127.0.0.1:{free_port()}"},
        tokenizers={"qat": "tok", "bf16": "tok"},
        ceilings={"qat": 100.0},
        vllm=str(client), client="per-run",
    )
    progress = io.StringIO()
    try:
        runs_file = run_bench(opts, environ={}, stream=progress)
    except Exception as exc:  # only a missing matplotlib may stop it, after the tables are written
        assert "matplotlib" in str(exc)
        runs_file = None
    assert (out / "runs.json").is_file() and (out / "runs.csv").is_file() and (out / "report.md").is_file()
    raw = sorted(p.name for p in (out / "raw").glob("*.json"))
    assert raw == ["qat_in32_c1_r1.json", "qat_in32_c2_r1.json"]
    assert "8/8" in progress.getvalue()
    report = (out / "report.md").read_text()
    assert "| 1 | 11.00 | 20.00 | FAILED | - |" in report  # qat's tok/s and TPOT, bf16's
    assert "repeat 2: `vllm bench serve` exited 1 without a result" in report
    assert "bf16, input 32, c=1: FAILED (no repeat succeeded)" in report
    assert "the server at http://127.0.0.1:" in report
    if runs_file is not None:
        assert runs_file.runs[0].seed == 320_101
        assert all(
            (out / name).stat().st_size > 1000 for name in ("throughput_vs_concurrency.png", "ttft_vs_input.png")
        )
    data = json.loads((out / "runs.json").read_text())
    assert [r["seed"] for r in data["runs"] if r["model"] == "bf16"] == [320_101, 320_102, 320_201, 320_202]


def test_roofline_ceilings_given_first_then_headers_and_unknown_models_get_a_note(tmp_path: Path) -> None:
    from t4serve.bench.runner import roofline_ceilings
    from t4serve.gpus import known_gpu

    environ = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    t4, l4 = known_gpu("t4"), known_gpu("l4")
    assert t4 is not None and l4 is not None
    ceilings, notes = roofline_ceilings(["bf16", "qat", "org/not-here"], {"bf16": 42.0}, environ, t4)
    assert ceilings["bf16"] == 42.0
    qat = ceilings["qat"]
    assert qat is not None and qat > 100  # int4 weights read 2.47x fewer bytes than bf16's ~60 tok/s
    assert any(n.startswith("qat: roofline ceiling on Tesla T4") for n in notes)
    assert ceilings["org/not-here"] is None
    assert any(n.startswith("org/not-here: no roofline ceiling") for n in notes)
    # The card that runs the sweep, not always a T4: an L4 reads its weights faster.
    on_l4, l4_notes = roofline_ceilings(["qat"], {}, environ, l4)
    assert on_l4["qat"] is not None and on_l4["qat"] > qat and "on NVIDIA L4" in l4_notes[0]
    # No known card here: no figure, and the note says why and how to give one.
    none, why = roofline_ceilings(["qat"], {}, environ, None, "no GPU visible here (NVML found none)")
    assert none == {"qat": None} and why == ["qat: no roofline ceiling: no GPU visible here (NVML found none) "
                                             "(--ceiling qat=N gives one)"]


def test_the_sweeps_card_is_its_first_gpu_by_name() -> None:
    from t4serve.bench.runner import sweep_gpu

    card, why = sweep_gpu({})  # this machine: no NVIDIA GPU
    assert card is None and why.startswith("no GPU visible here")


def serve_environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment `t4serve serve` runs in here: offline, folders under tmp_path, no telemetry, its own port, and
    the stand-in for `vllm serve` first on PATH (a script that runs tests/standin/vllm_standin.py with this Python, so
    the --middleware t4serve passes imports), supervisord from this venv after it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    vllm = bin_dir / "vllm"
    vllm.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    vllm.chmod(0o755)
    return {
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "T4SERVE_CACHE_DIR": str(tmp_path / "cache"),
        "T4SERVE_PORT": str(free_port()),
        "T4SERVE_TELEMETRY_PORT": "0",
        "T4SERVE_SHUTDOWN_TIMEOUT": "5",
        "TMPDIR": str(tmp_path),
        "T4SERVE_STANDIN_LOAD_SECONDS": "0",
        **extra,
    }


def test_planned_servers_are_t4serve_serve_with_the_first_models_sized_settings(tmp_path: Path) -> None:
    from t4serve.bench.servers import plan_servers
    from t4serve.config.settings import Settings
    from t4serve.pipeline import gather_facts, prepare
    from t4serve.planning.plan import sized_settings

    token_file = tmp_path / "hf_token"
    token_file.write_text("hf_benchtokennotreal\n")
    environ = serve_environ(tmp_path, HF_TOKEN_FILE=str(token_file), T4SERVE_API_KEY=API_KEY)
    servers, _notes = plan_servers(["qat", "bf16"], environ, tmp_path / "out")
    qat, bf16 = servers["qat"], servers["bf16"]
    assert qat.argv() == bf16.argv() == [sys.executable, "-m", "t4serve", "serve"]
    assert qat.state_dir == tmp_path / "out" / "servers" / "qat" != bf16.state_dir
    assert qat.settings == {"T4SERVE_MODEL": "qat", "T4SERVE_STATE_DIR": str(qat.state_dir),
                            "T4SERVE_ON_CONFIG_ERROR": "exit"}  # fmt: skip
    # The second model carries the first one's sized flags (on this machine's GPU, or none without one).
    first = Settings.from_environ(environ, overrides={"T4SERVE_MODEL": "qat"})
    reference, _ = prepare(first, gather_facts(first, environ))
    assert {k: v for k, v in bf16.settings.items() if k not in ("T4SERVE_MODEL", "T4SERVE_STATE_DIR",
                                                               "T4SERVE_ON_CONFIG_ERROR")} == sized_settings(reference)
    # serve reads the secrets from the environment itself: bench passes none.
    for server in servers.values():
        text = repr(server) + server.describe()
        assert "hf_benchtokennotreal" not in text and API_KEY not in text


def test_a_server_that_t4serve_serve_refuses_fails_every_cell_of_its_model_visibly(tmp_path: Path) -> None:
    """The real `t4serve serve`, strict preflight, no build manifest: it exits 3 before anything starts; its runs
    fail at once, in the sweep's order, and it is started once only (no client is ever started either)."""
    environ = serve_environ(tmp_path, T4SERVE_MANIFEST=str(tmp_path / "no-manifest.json"), T4SERVE_PREFLIGHT="strict")
    out = tmp_path / "result"
    opts = BenchOptions(["bf16"], [512], [1, 4], 2, 16, out, ready_timeout_s=60, ceilings={"bf16": 50.0})
    stream = io.StringIO()
    bench_to_the_end(opts, environ, stream)
    runs = read_runs(out).runs
    assert [(r.concurrency, r.repeat) for r in runs] == [(1, 1), (4, 1), (1, 2), (4, 2)]  # rounds: repeat by repeat
    assert all(r.figures is None and r.error == "t4serve serve exited with code 3 before it was ready" for r in runs)
    assert all(r.telemetry is not None and r.telemetry.error == "server not running" for r in runs)
    assert stream.getvalue().count("FAILED") == 4 and stream.getvalue().count("starting bf16") == 1
    # Its log is kept beside the runs: preflight's table says which check failed.
    assert "manifest" in stream.getvalue() and "preflight failed" in stream.getvalue()
    assert sorted(p.name for p in (out / "raw").iterdir()) == ["server_bf16_1.log"]


API_KEY = "sk-bench-SECRET-key"
# `vllm bench serve` reads OPENAI_API_KEY for its Authorization header; this client asks the server with it.
KEYED_CLIENT = """#!{python}
import json, os, sys, urllib.request
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
key = os.environ.get("OPENAI_API_KEY")
headers = {{"Authorization": "Bearer " + key}} if key else {{}}
request = urllib.request.Request(value("--base-url") + "/v1/models", headers=headers)
urllib.request.urlopen(request, timeout=5).read()
result = {{"completed": 1, "failed": 0, "output_throughput": 1.0, "median_tpot_ms": 1.0, "median_ttft_ms": 1.0,
          "mean_ttft_ms": 1.0, "total_output_tokens": 8, "duration": 1.0, "model_id": value("--model")}}
with open(value("--result-dir") + "/" + value("--result-filename"), "w") as f:
    json.dump(result, f)
"""


@pytest.mark.parametrize("given_as", ["T4SERVE_API_KEY_FILE", "OPENAI_API_KEY"])
def test_run_bench_sends_the_api_key_to_a_keyed_server(tmp_path: Path, given_as: str) -> None:
    url, proc = start_standin({"VLLM_API_KEY": API_KEY})
    try:
        client = client_script(tmp_path, KEYED_CLIENT)
        key_file = tmp_path / "api_key"
        key_file.write_text(API_KEY)
        out = tmp_path / "result"
        opts = BenchOptions(["qat"], [32], [1], 1, 8, out, base_urls={"qat": url}, tokenizers={"qat": "tok"},
                            ceilings={"qat": 100.0}, vllm=str(client), client="per-run")  # fmt: skip
        environ = {given_as: str(key_file) if given_as.endswith("_FILE") else API_KEY}
        assert served_model_name(url, api_key=API_KEY) == "served-qat"
        with pytest.raises(BenchError, match="wants an API key and none was given"):
            served_model_name(url)
        try:
            runs_file = run_bench(opts, environ=environ, stream=io.StringIO())
        except Exception as exc:  # only a missing matplotlib may stop it, after the tables are written
            assert "matplotlib" in str(exc)
        runs_file = read_runs(out)
        assert [r.error for r in runs_file.runs] == [None], (out / "report.md").read_text()
        for path in out.rglob("*"):
            if path.is_file() and path.suffix in (".json", ".csv", ".md", ".log"):
                assert API_KEY not in path.read_text(encoding="utf-8", errors="replace"), path
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_bench_starts_t4serve_serve_waits_for_its_canary_and_stops_it_as_docker_stop_does(tmp_path: Path) -> None:
    """`t4serve bench` without --base-url: the real `t4serve serve` (preflight, plan, supervisord, the vLLM wrapper,
    the canary) with the stand-in as `vllm`, an API key, and a client that asks the server with the key."""
    from t4serve.supervise.state import RUN_SPEC_FILE, read_run_spec, read_state

    client = client_script(tmp_path, KEYED_CLIENT)
    environ = serve_environ(tmp_path, T4SERVE_PREFLIGHT="warn", T4SERVE_API_KEY=API_KEY)
    out = tmp_path / "result"
    opts = BenchOptions(["qat"], [32], [1], 1, 8, out, tokenizers={"qat": "tok"}, ceilings={"qat": 100.0},
                        vllm=str(client), client="per-run", ready_timeout_s=90)  # fmt: skip
    stream = io.StringIO()
    bench_to_the_end(opts, environ, stream)
    runs_file = read_runs(out)
    assert [r.error for r in runs_file.runs] == [None], stream.getvalue()
    assert "starting qat: T4SERVE_MODEL=qat" in stream.getvalue()
    state_dir = out / "servers" / "qat"
    state = read_state(state_dir)
    # Ready only after the canary; then stopped by SIGTERM, which the wrapper records as draining.
    phases = [m.phase for m in state.phases]
    assert phases.index("canary") < phases.index("ready") < phases.index("stopping"), phases
    assert state.canary is not None and state.canary.ok
    spec = read_run_spec(state_dir / RUN_SPEC_FILE)
    assert spec.argv[:3] == ["vllm", "serve", "google/gemma-4-E2B-it-qat-w4a16-ct"]
    assert "--middleware" in spec.argv and "--shutdown-timeout" in spec.argv
    log = (out / "raw" / "server_qat_1.log").read_text()
    assert "t4serve: preflight:" in log and "starting supervisord" in log
    # The key reached vLLM only through the environment: in no file of the result folder.
    for path in out.rglob("*"):
        if path.is_file():
            assert API_KEY not in path.read_text(encoding="utf-8", errors="replace"), path


# A client that finishes its first cell, then stops the sweep as Ctrl-C, `docker stop` or a CI timeout would:
# SIGTERM to the process running the sweep (its parent) while it waits for the second cell.
INTERRUPTING_CLIENT = """#!{python}
import json, os, signal, sys, time
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
name = value("--result-filename")
if "_c2_" in name:
    os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(30)
result = {{"completed": 4, "failed": 0, "output_throughput": 11.0, "median_tpot_ms": 9.0, "median_ttft_ms": 50.0,
          "mean_ttft_ms": 55.0, "total_output_tokens": 32, "duration": 2.9, "client_pid": os.getpid()}}
with open(value("--result-dir") + "/" + name, "w") as f:
    json.dump(result, f)
"""


@pytest.mark.parametrize("kind", ["per-run", "sweep"])
def test_a_stopped_sweep_keeps_what_finished_and_says_it_is_partial(
    tmp_path: Path, standin_url: str, kind: str
) -> None:
    from t4serve.bench.results import read_runs
    from t4serve.bench.runner import Interrupted

    client = client_script(tmp_path, INTERRUPTING_CLIENT)
    # The sweep's client runs in bench's environ: the stand-in for vLLM's benchmark on its PYTHONPATH.
    environ = {"PYTHONPATH": str(client_package(tmp_path, INTERRUPTING_CLIENT))}
    out = tmp_path / "result"
    opts = BenchOptions(models=["qat"], inputs=[32], concurrencies=[1, 2, 4], repeats=1, output_len=8, output=out,
                        base_urls={"qat": standin_url}, tokenizers={"qat": "tok"}, ceilings={"qat": 100.0},
                        vllm=str(client), client=kind, cell_timeout_s=60)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as caught:
        run_bench(opts, environ=environ, stream=io.StringIO())
    assert caught.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before  # the sweep's handler is gone again
    runs_file = read_runs(out)
    assert [(r.concurrency, r.figures is not None) for r in runs_file.runs] == [(1, True)]
    assert runs_file.planned_runs == 3 and runs_file.interrupted == "stopped by SIGTERM" and runs_file.partial
    report = (out / "report.md").read_text()
    assert "**Partial**: 1 of 3 runs finished (stopped by SIGTERM)" in report
    assert "| 1 | 11.00 |" in report and "| 2 | not run |" in report and "| 4 | not run |" in report
    assert not list(out.glob(".*t4serve-tmp"))  # no half-written runs.json left behind
    # The client (the sweep's process, or the run's) does not outlive the sweep.
    pid = json.loads((out / "raw" / "qat_in32_c1_r1.json").read_text())["client_pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_runs_json_is_current_after_every_run(tmp_path: Path, standin_url: str) -> None:
    """Each finished run is on disk before the next one starts: a kill -9 loses at most the run in progress."""
    from t4serve.bench.results import read_runs

    seen: list[int] = []
    client = client_script(tmp_path, FAKE_CLIENT)
    out = tmp_path / "result"
    opts = BenchOptions(models=["qat"], inputs=[32], concurrencies=[1, 2], repeats=1, output_len=8, output=out,
                        base_urls={"qat": standin_url}, tokenizers={"qat": "tok"}, ceilings={"qat": 100.0},
                        vllm=str(client), client="per-run")
    import t4serve.bench.runner as runner

    real_run_cell = runner.run_cell

    def spying_run_cell(*args: Any, **kwargs: Any) -> Run:
        seen.append(len(read_runs(out).runs))
        return real_run_cell(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "run_cell", spying_run_cell)
        bench_to_the_end(opts, {}, io.StringIO())
    assert seen == [0, 1]
    final = read_runs(out)
    assert len(final.runs) == 2 and not final.partial


def test_a_warmup_run_precedes_each_cell_and_is_kept_apart(tmp_path: Path, standin_url: str) -> None:
    """--warmup-run: one run of each cell (seed repeat 0) before its repeats, in raw/warmup/, never in the tables."""
    client = client_script(tmp_path, FAKE_CLIENT)
    out = tmp_path / "result"
    opts = BenchOptions(models=["qat"], inputs=[32], concurrencies=[1, 4], repeats=1, output_len=8, output=out,
                        base_urls={"qat": standin_url}, tokenizers={"qat": "tok"}, ceilings={"qat": 100.0},
                        vllm=str(client), client="per-run", warmup_run=True)
    progress = io.StringIO()
    bench_to_the_end(opts, {}, progress)
    assert sorted(p.name for p in (out / "raw" / "warmup").glob("*.json")) == ["qat_in32_c1_r0.json",
                                                                               "qat_in32_c4_r0.json"]
    warm = json.loads((out / "raw" / "warmup" / "qat_in32_c4_r0.json").read_text())
    assert warm["output_throughput"] == 40.0  # the fake client's 10 x c + seed % 10: seed 320_400, repeat 0
    data = json.loads((out / "runs.json").read_text())
    assert [(r["concurrency"], r["repeat"], r["seed"]) for r in data["runs"]] == [(1, 1, 320_101), (4, 1, 320_401)]
    assert any("--warmup-run" in note for note in data["notes"])
    lines = progress.getvalue().splitlines()
    assert [line.strip()[:36] for line in lines if "warm-up" in line] == [
        "warm-up qat in=32 c=1 (not recorded)", "warm-up qat in=32 c=4 (not recorded)"]
    assert "2/2" in progress.getvalue()
    # `bench report` rebuilding from raw/ alone reads raw/*.json, not the warm-ups.
    from t4serve.bench.results import runs_from_raw

    assert sorted(r.repeat for r in runs_from_raw(out).runs) == [1, 1]


def two_standins() -> tuple[dict[str, str], list[subprocess.Popen[bytes]]]:
    first, a = start_standin({})
    second, b = start_standin({})
    return {"A": first, "B": second}, [a, b]


def test_resident_servers_are_interleaved_pair_by_pair_by_one_client_process(tmp_path: Path) -> None:
    """--base-url: each cell's repeat a pair, back to back, A B then B A; the sweep's one client process (vLLM's
    import paid once, by the first run, a warm-up here) runs every run; each run's start and end are recorded, and
    the split (start-up against measured time) printed and reported."""
    environ = {"PYTHONPATH": str(client_package(tmp_path, FAKE_CLIENT, import_s=0.5))}
    urls, procs = two_standins()
    try:
        out = tmp_path / "result"
        opts = BenchOptions(["A", "B"], [32], [1, 4], 3, 8, out, base_urls=urls, tokenizers={"A": "t", "B": "t"},
                            ceilings={"A": 100.0, "B": 100.0}, warmup_run=True)  # fmt: skip
        stream = io.StringIO()
        bench_to_the_end(opts, environ, stream)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
    runs_file = read_runs(out)
    assert (runs_file.order, runs_file.client, runs_file.schema) == ("interleaved", "sweep", 2)
    order = [(r.model, r.concurrency, r.repeat) for r in runs_file.runs]
    assert order == [("A", 1, 1), ("B", 1, 1), ("B", 1, 2), ("A", 1, 2), ("A", 1, 3), ("B", 1, 3),
                     ("A", 4, 1), ("B", 4, 1), ("B", 4, 2), ("A", 4, 2), ("A", 4, 3), ("B", 4, 3)]
    # The fake client fails every repeat 2: those pairs are incomplete, the others measured.
    assert [r.error is None for r in runs_file.runs] == [True, True, False, False, True, True] * 2
    assert all(r.num_prompts == 10 * r.concurrency for r in runs_file.runs)  # 10 x c by default
    # The warm-ups (2 x c requests) ran before each cell's first pair, in the same client.
    warm = {p.name: json.loads(p.read_text()) for p in (out / "raw" / "warmup").glob("*.json")}
    assert sorted(warm) == ["A_in32_c1_r0.json", "A_in32_c4_r0.json", "B_in32_c1_r0.json", "B_in32_c4_r0.json"]
    assert warm["A_in32_c4_r0.json"]["completed"] == 8
    measured = [json.loads((out / "raw" / r.raw_file).read_text()) for r in runs_file.runs if r.raw_file]
    pids = {d["client_pid"] for d in [*measured, *warm.values()]}
    assert len(pids) == 1 and os.getpid() not in pids  # one process, not this one
    # Timing: each run started after the one before it ended; vLLM's import (0.5 s here) paid once, by the warm-up
    # that started the client, carried to the first recorded run.
    timings = [r.timing for r in runs_file.runs]
    assert all(t is not None for t in timings)
    assert all(a.ended <= b.started for a, b in itertools.pairwise(t for t in timings if t))
    starts = [t.client_start_s for t in timings if t]
    assert starts[0] is not None and starts[0] >= 0.5 and all(s == 0.0 for s in starts[1:])
    text = stream.getvalue()
    assert "client start-up: 1 start(s)" in text and "8 run(s):" in text
    assert "[client start-up " in next(line for line in text.splitlines() if "warm-up A in=32 c=1" in line)
    report = (out / "report.md").read_text()
    assert "## client time" in report and "client start-up: 1 start(s)" in report
    header, row = ([c.strip() for c in line.strip("|").split("|")] for line in report.splitlines()
                   if line.startswith(("| c |", "| 4 |")))
    cell = dict(zip(header, row, strict=True))
    # A and B answer alike (10 x c + seed % 10): every pair ratio 1; repeat 2 failed, so two pairs.
    assert (cell["ratio"], cell["decided"]) == ("1.00x [1.00 - 1.00] (2 pairs)", "no")


def test_a_run_past_its_timeout_stops_the_sweeps_client_and_the_next_run_starts_another(
    tmp_path: Path, standin_url: str
) -> None:
    sleepy = FAKE_CLIENT.replace("c = int(", "import time\nif seed % 10 == 1 and int(value('--max-concurrency')) == 2:"
                                 "\n    time.sleep(60)\nc = int(", 1)
    environ = {"PYTHONPATH": str(client_package(tmp_path, sleepy))}
    out = tmp_path / "result"
    opts = BenchOptions(["qat"], [32], [1, 2, 4], 1, 8, out, base_urls={"qat": standin_url}, tokenizers={"qat": "t"},
                        ceilings={"qat": 100.0}, cell_timeout_s=3)  # fmt: skip
    began = time.monotonic()
    bench_to_the_end(opts, environ, io.StringIO())
    assert time.monotonic() - began < 30
    runs = read_runs(out).runs
    assert [r.error is None for r in runs] == [True, False, True]
    assert "ran past 3 s and was stopped" in (runs[1].error or "")
    assert [r.timing.client_start_s > 0 for r in runs if r.timing and r.timing.client_start_s is not None] == [
        True, False, True]
    pids = [json.loads((out / "raw" / r.raw_file).read_text())["client_pid"] for r in runs if r.raw_file]
    assert len(set(pids)) == 2


def test_a_client_that_cannot_import_vllm_fails_every_run_once_and_says_how_to_fix_it(
    tmp_path: Path, standin_url: str
) -> None:
    out = tmp_path / "result"
    opts = BenchOptions(["qat"], [32], [1, 2], 2, 8, out, base_urls={"qat": standin_url}, tokenizers={"qat": "t"},
                        ceilings={"qat": 100.0})  # fmt: skip
    bench_to_the_end(opts, {"PYTHONPATH": str(tmp_path / "nothing-here")}, io.StringIO())
    runs = read_runs(out).runs
    assert len(runs) == 4 and all(r.figures is None for r in runs)
    error = runs[0].error or ""
    assert "cannot import vLLM's benchmark (vllm.benchmarks.serve)" in error
    assert "--client per-run --vllm CMD" in error and all(r.error == error for r in runs)
    assert "ModuleNotFoundError" in error  # the cause, as the import raised it
    assert (out / "raw" / "client.log").is_file()
    # One attempt to start it, by the first run; the others failed at once.
    assert [bool(r.timing and r.timing.client_start_s) for r in runs] == [True, False, False, False]


def test_servers_bench_starts_run_in_rounds_one_at_a_time(tmp_path: Path) -> None:
    """No --base-url, two models: the real `t4serve serve` per model, one at a time; round 1 A then B, round 2 B
    (still running) then A: three starts for two repeats, each server stopped before the next one starts."""
    environ = serve_environ(tmp_path, T4SERVE_PREFLIGHT="warn", PYTHONPATH=str(client_package(tmp_path, FAKE_CLIENT)))
    out = tmp_path / "result"
    opts = BenchOptions(["qat", "bf16"], [32], [1], 2, 8, out, tokenizers={"qat": "t", "bf16": "t"},
                        ceilings={"qat": 100.0, "bf16": 50.0}, ready_timeout_s=90, num_prompts=4)  # fmt: skip
    stream = io.StringIO()
    bench_to_the_end(opts, environ, stream)
    runs_file = read_runs(out)
    assert runs_file.order == "rounds"
    # The fake client fails repeat 2; the order is what counts here.
    assert [(r.model, r.repeat) for r in runs_file.runs] == [("qat", 1), ("bf16", 1), ("bf16", 2), ("qat", 2)]
    assert sorted(p.name for p in (out / "raw").glob("server_*.log")) == [
        "server_bf16_1.log", "server_qat_1.log", "server_qat_2.log"]
    assert "starting qat (start 2):" in stream.getvalue()
    for log in (out / "raw").glob("server_*.log"):
        assert "vLLM stopped (exit 0)" in log.read_text(), log.name
    # One server at a time: each server's log ends (stopped) before the next one's run starts.
    first, second, third, fourth = (r.timing for r in runs_file.runs)
    assert first and second and third and fourth and first.ended < second.started and third.ended < fourth.started


def test_a_sweep_that_measured_nothing_exits_6_without_matplotlib_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 45: without matplotlib a sweep that measured nothing exited 2 (the plots' error), not the documented 6.
    The real sweep, against a --base-url where no server answers."""
    from t4serve.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # stands for a Python without matplotlib installed
    client = client_script(tmp_path, FAKE_CLIENT)
    out = tmp_path / "result"
    code = main(["bench", "--models", "qat", "--inputs", "32", "--concurrency", "1", "--repeats", "1",
                 "--output-len", "8", "--base-url", f"qat=http://127.0.0.1:{free_port()}", "--tokenizer", "tok",
                 "--ceiling", "qat=100", "--client", "per-run", "--vllm", str(client), "--ready-timeout", "1",
                 "--output", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 6, err
    assert "t4serve bench measured nothing" in err and "no plots: cannot draw the benchmark plots" in err
    assert (out / "report.md").is_file() and (out / "runs.json").is_file()
