"""The runner: the `vllm bench serve` command line per cell, progress, failed runs and the result folder.

The client here is a small script standing in for `vllm bench serve` (it writes a result JSON the way vLLM's does);
the real client runs against the stand-in server in tests/image/test_bench.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import socket
import subprocess
import sys
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
import json, sys
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
          "total_output_tokens": 8, "duration": 1.0, "model_id": value("--model")}}
with open(value("--result-dir") + "/" + value("--result-filename"), "w") as f:
    json.dump(result, f)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        "--num-prompts 16",
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
    client = tmp_path / "fake-vllm"
    client.write_text(FAKE_CLIENT.format(python=sys.executable))
    client.chmod(0o755)
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
        vllm=str(client),
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
    assert "| 1 | 11.00 | FAILED |" in report
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


def test_roofline_ceilings_given_first_then_headers_and_unknown_models_get_a_note(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from t4serve.bench.runner import roofline_ceilings

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    ceilings, notes = roofline_ceilings(["bf16", "qat", "org/not-here"], {"bf16": 42.0})
    assert ceilings["bf16"] == 42.0
    qat = ceilings["qat"]
    assert qat is not None and qat > 100  # int4 weights read 2.47x fewer bytes than bf16's ~60 tok/s
    assert ceilings["org/not-here"] is None
    assert any(n.startswith("org/not-here: no roofline ceiling") for n in notes)


def test_planned_servers_share_every_flag_but_the_checkpoint_and_its_name(tmp_path: Path) -> None:
    from t4serve.bench.runner import plan_servers

    environ = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "T4SERVE_STATE_DIR": str(tmp_path / "s"),
               "T4SERVE_CACHE_DIR": str(tmp_path / "c"), "PATH": os.environ.get("PATH", "")}
    servers, notes = plan_servers(["qat", "bf16"], environ)
    qat, bf16 = servers["qat"].argv, servers["bf16"].argv
    assert qat[:3] == ["vllm", "serve", "google/gemma-4-E2B-it-qat-w4a16-ct"]
    assert bf16[:3] == ["vllm", "serve", "google/gemma-4-E2B-it"]
    assert qat[3:5] == ["--served-model-name", "google/gemma-4-E2B-it-qat-w4a16-ct"]
    assert bf16[3:5] == ["--served-model-name", "google/gemma-4-E2B-it"]
    assert qat[5:] == bf16[5:] and "--served-model-name" not in qat[5:]
    assert notes == []


def test_a_server_that_dies_while_starting_fails_every_cell_of_its_model_visibly(tmp_path: Path) -> None:
    from t4serve.bench import grid
    from t4serve.bench.runner import BenchOptions, PlannedServer, Progress, _run_model

    opts = BenchOptions(["bf16"], [512], [1, 4], 2, 16, tmp_path, ready_timeout_s=30)
    cells = grid.cells(opts.inputs, opts.concurrencies, opts.repeats)
    dead = PlannedServer(argv=[sys.executable, "-c", "raise SystemExit(3)"], env={}, url="http://127.0.0.1:9",
                         tokenizer="unused")
    out = io.StringIO()
    runs: list[Run] = []
    _run_model(opts, "bf16", cells, tmp_path, dead, Progress(len(cells), out), runs.append)
    assert len(runs) == len(cells) == 4
    assert [(r.concurrency, r.repeat) for r in runs] == [(c.concurrency, c.repeat) for c in cells]
    assert all(r.figures is None and r.error for r in runs)
    assert all(r.telemetry is not None and r.telemetry.error == "server not running" for r in runs)
    assert out.getvalue().count("FAILED") == 4


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
        client = tmp_path / "fake-vllm"
        client.write_text(KEYED_CLIENT.format(python=sys.executable))
        client.chmod(0o755)
        key_file = tmp_path / "api_key"
        key_file.write_text(API_KEY)
        out = tmp_path / "result"
        opts = BenchOptions(["qat"], [32], [1], 1, 8, out, base_urls={"qat": url}, tokenizers={"qat": "tok"},
                            ceilings={"qat": 100.0}, vllm=str(client))  # fmt: skip
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


def test_a_started_server_gets_the_key_as_vllm_api_key(tmp_path: Path) -> None:
    from t4serve.bench.runner import PlannedServer, running_server
    from t4serve.config.secrets import Secret

    port = free_port()
    argv = [sys.executable, str(STANDIN), "serve", "tiny", "--port", str(port), "--served-model-name", "served-qat"]
    url = f"http://127.0.0.1:{port}"
    server = PlannedServer(argv=argv, env={"T4SERVE_STANDIN_LOAD_SECONDS": "0"}, url=url, tokenizer="tok",
                           api_key=Secret(API_KEY, "T4SERVE_API_KEY"))  # fmt: skip
    assert API_KEY not in repr(server)
    with running_server(server, tmp_path / "server.log", ready_timeout=20):
        # The stand-in enforces VLLM_API_KEY as vLLM does: a 401 without the key proves the server got it.
        with pytest.raises(BenchError, match="wants an API key and none was given"):
            served_model_name(url)
        assert served_model_name(url, api_key=API_KEY) == "served-qat"
    assert API_KEY not in (tmp_path / "server.log").read_text()


def test_a_started_server_gets_the_hub_token_from_hf_token_file_as_serve_gives_it(tmp_path: Path) -> None:
    # serve reads HF_TOKEN_FILE and hands vLLM HF_TOKEN; a server bench starts must get the same, or a gated
    # checkpoint that is not cached yet would fail to download only under bench.
    from t4serve.bench.runner import plan_servers, server_environment

    token_file = tmp_path / "hf_token"
    token_file.write_text("hf_benchtokennotreal\n")
    environ = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "T4SERVE_STATE_DIR": str(tmp_path / "s"),
               "T4SERVE_CACHE_DIR": str(tmp_path / "c"), "PATH": os.environ.get("PATH", ""),
               "HF_TOKEN_FILE": str(token_file)}  # fmt: skip
    servers, _notes = plan_servers(["qat"], environ)
    server = servers["qat"]
    assert "hf_benchtokennotreal" not in repr(server) and "hf_benchtokennotreal" not in " ".join(server.argv)
    env = server_environment(server, environ)
    assert env["HF_TOKEN"] == "hf_benchtokennotreal"
    assert "HF_TOKEN_FILE" not in env and "VLLM_API_KEY" not in env


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
          "mean_ttft_ms": 55.0, "total_output_tokens": 32, "duration": 2.9}}
with open(value("--result-dir") + "/" + name, "w") as f:
    json.dump(result, f)
"""


def test_a_stopped_sweep_keeps_what_finished_and_says_it_is_partial(tmp_path: Path, standin_url: str) -> None:
    from t4serve.bench.results import read_runs
    from t4serve.bench.runner import Interrupted

    client = tmp_path / "fake-vllm"
    client.write_text(INTERRUPTING_CLIENT.format(python=sys.executable))
    client.chmod(0o755)
    out = tmp_path / "result"
    opts = BenchOptions(models=["qat"], inputs=[32], concurrencies=[1, 2, 4], repeats=1, output_len=8, output=out,
                        base_urls={"qat": standin_url}, tokenizers={"qat": "tok"}, ceilings={"qat": 100.0},
                        vllm=str(client), cell_timeout_s=60)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as caught:
        run_bench(opts, environ={}, stream=io.StringIO())
    assert caught.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before  # the sweep's handler is gone again
    runs_file = read_runs(out)
    assert [(r.concurrency, r.figures is not None) for r in runs_file.runs] == [(1, True)]
    assert runs_file.planned_runs == 3 and runs_file.interrupted == "stopped by SIGTERM" and runs_file.partial
    report = (out / "report.md").read_text()
    assert "**Partial**: 1 of 3 runs finished (stopped by SIGTERM)" in report
    assert "| 1 | 11.00 |" in report and "| 2 | not run |" in report and "| 4 | not run |" in report
    assert not list(out.glob(".*t4serve-tmp"))  # no half-written runs.json left behind


def test_runs_json_is_current_after_every_run(tmp_path: Path, standin_url: str) -> None:
    """Each finished run is on disk before the next one starts: a kill -9 loses at most the run in progress."""
    from t4serve.bench.results import read_runs

    seen: list[int] = []
    client = tmp_path / "fake-vllm"
    client.write_text(FAKE_CLIENT.format(python=sys.executable))
    client.chmod(0o755)
    out = tmp_path / "result"
    opts = BenchOptions(models=["qat"], inputs=[32], concurrencies=[1, 2], repeats=1, output_len=8, output=out,
                        base_urls={"qat": standin_url}, tokenizers={"qat": "tok"}, ceilings={"qat": 100.0},
                        vllm=str(client))
    import t4serve.bench.runner as runner

    real_run_cell = runner.run_cell

    def spying_run_cell(*args: Any, **kwargs: Any) -> Run:
        seen.append(len(read_runs(out).runs))
        return real_run_cell(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "run_cell", spying_run_cell)
        try:
            run_bench(opts, environ={}, stream=io.StringIO())
        except Exception as exc:  # only a missing matplotlib may stop it, after the tables are written
            assert "matplotlib" in str(exc)
    assert seen == [0, 1]
    final = read_runs(out)
    assert len(final.runs) == 2 and not final.partial
