"""The benchmark tools: `t4serve bench` started in the server's container in the background, and its progress, figures,
report and plots; a finished run's folder is copied to this host.
"""

from __future__ import annotations

import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

from t4serve.config.settings import default_of
from t4serve.errors import ConfigError, EngineError, T4ServeError
from t4serve.host.engine import API_PORT, Engine, client_json
from t4serve.mcp.calls import Progress, ToolGroup, blocking, guarded, in_thread, not_ready, redact, tail_text
from t4serve.mcp.models import BenchCell, BenchStart, BenchStatus
from t4serve.mcp.registry import READ_ONLY, hints, tool
from t4serve.mcp.servertools import read_status
from t4serve.untrusted import Untrusted, printable, read_tail_bounded

BENCH_TEXT_BYTES = 32 * 1024
RUN_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")
# In the container: its T4SERVE_CACHE_DIR (the cache volume) holds the runs.
BENCH_ROOT = f"{default_of('T4SERVE_CACHE_DIR')}/bench"
# A bench progress line ("[####......] 3/8 qat in=512 c=1 r=1: ..."): runs done and planned.
BENCH_PROGRESS = re.compile(r"^\[[#.]+\] ([0-9]+)/([0-9]+) ", re.MULTILINE)


class BenchTools(ToolGroup):
    """A benchmark's start and its status."""

    @tool("Start a benchmark", "bench", hints(read_only=False, destructive=False, idempotent=False, open_world=False))
    @guarded
    async def run_benchmark(
        self,
        inputs: Annotated[
            list[Annotated[int, Field(ge=1, le=32768)]] | None,
            Field(description="prompt lengths in tokens, 1 to 4 of them, each 1 to 32768 (default [512])",
                  min_length=1, max_length=4),
        ] = None,
        concurrency: Annotated[
            list[Annotated[int, Field(ge=1, le=32768)]] | None,
            Field(description="concurrent streams per cell, 1 to 6 values (default [1, 4])", min_length=1,
                  max_length=6),
        ] = None,
        repeats: Annotated[int, Field(description="runs per cell, each with its own seed (1 to 5)", ge=1, le=5)] = 1,
        output_len: Annotated[int, Field(description="tokens generated per request (1 to 2048)", ge=1, le=2048)] = 128,
        num_prompts: Annotated[
            int | None, Field(description="requests per run (1 to 1000; default 10 x concurrency)", ge=1,
                              le=1000)
        ] = None,
        ctx: Context | None = None,
    ) -> BenchStart:
        """Start `t4serve bench` against the running server, in its container, in the background; returns a run id.

        The sweep (vLLM's own `vllm bench serve` per input length, concurrency and repeat) runs on after this call;
        follow it with benchmark_status. One benchmark at a time; holds the deployment's lock while starting it."""
        inputs = inputs or [512]
        concurrency = concurrency or [1, 4]
        progress = Progress(ctx)
        with self.env.exclusive("run_benchmark", ctx):
            await progress.say("reading the server's state")
            status = await blocking(progress, "reading the server's state", lambda: read_status(self.env))
            if not status.ready or status.container is None:
                raise not_ready("run_benchmark", status, "a ready server in a container")
            container = status.container
            running = await blocking(progress, "looking for a running benchmark",
                                     lambda: self._read_bench(container, "running", BENCH_ROOT))  # fmt: skip
            if running["running"]:
                raise EngineError(
                    "run_benchmark: busy: a benchmark is running",
                    found=f"run {running['running'][0]} has not finished",
                    required="one benchmark at a time (two would share the GPU and skew both)",
                    fix=f"benchmark_status(run_id={running['running'][0]!r}) until it is done",
                )
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(self.env.clock()))
            run_id = f"{stamp}-{uuid.uuid4().hex[:6]}"
            folder = f"{BENCH_ROOT}/{run_id}"
            args = [
                "--models",
                str(status.model),
                "--base-url",
                f"http://127.0.0.1:{status.api_port or API_PORT}",
                "--inputs",
                ",".join(map(str, inputs)),
                "--concurrency",
                ",".join(map(str, concurrency)),
                "--repeats",
                str(repeats),
                "--output-len",
                str(output_len),
            ]
            if num_prompts is not None:
                args += ["--num-prompts", str(num_prompts)]
            await progress.say(f"starting t4serve bench as run {run_id}")
            done = await blocking(progress, "starting t4serve bench",
                                  lambda: self.engine.exec(container, ["sh", "-c", BENCH_SCRIPT, "sh", folder, *args],
                                                           detach=True))  # fmt: skip
        if done.returncode != 0:
            raise EngineError(
                "run_benchmark: docker exec failed",
                found=done.stderr.strip() or "no output",
                required="the running container to accept the command",
                fix="server_status, then try again",
            )
        await progress.say(f"run {run_id} started; follow it with benchmark_status")
        return BenchStart(
            run_id=run_id, container=container, output_dir=folder, poll=f"benchmark_status(run_id={run_id!r})"
        )

    def _read_bench(self, container: str, mode: str, folder: str) -> dict[str, Any]:
        done = self.engine.exec(container, ["python3", "-c", READ_BENCH, mode, folder])
        if done.returncode != 0:
            raise ConfigError(
                f"benchmark_status: no benchmark {Path(folder).name}",
                found=done.stderr.strip()[-300:] or "no output",
                required="a run id from run_benchmark",
                fix="call run_benchmark",
            )
        seen = client_json(done.stdout, "benchmark_status", ["python3", "-c", "READ_BENCH"])
        keys = {"running"} if mode == "running" else {"exit_code", "alive", "log", "report", "plots"}
        if not isinstance(seen, dict) or not keys <= set(seen):
            raise EngineError(
                "benchmark_status: the container's answer is not a benchmark's state",
                found=printable(done.stdout.strip()[:200]),
                required=f"READ_BENCH's JSON: {', '.join(sorted(keys))}",
                fix="check that the container runs this version of t4serve (rebuild the image)",
            )
        return seen

    # Copies a finished run's folder to this host's data folder; changes nothing on the deployment.
    @tool("Benchmark status and figures", "bench", READ_ONLY)
    @guarded
    async def benchmark_status(
        self,
        run_id: Annotated[str, Field(description="the id run_benchmark returned", pattern=RUN_ID.pattern)],
        ctx: Context | None = None,
    ) -> BenchStatus:
        """A benchmark's progress, and once it has ended its figures per cell, its report (report.md) and plots.

        When done, the result folder is copied to this host (T4SERVE_MCP_DATA_DIR/bench/RUN_ID) and read from there,
        so a finished run stays readable after the server stops. Changes nothing on the deployment."""
        progress = Progress(ctx)
        target = self.env.data_dir / "bench" / run_id
        if not target.is_dir():
            container = await blocking(progress, "looking for the container", self.engine.service)
            if container is None or container.state != "running":
                raise ConfigError(
                    "benchmark_status: no running t4serve container",
                    found=container.state if container else "none",
                    required="the container the benchmark runs in",
                    fix="the results stay in the t4serve-cache volume under bench/; start the server again to read "
                    "them",
                )
            folder = f"{BENCH_ROOT}/{run_id}"
            seen = await blocking(progress, "reading the benchmark", lambda: self._read_bench(container.id, "read",
                                                                                             folder))  # fmt: skip
            if seen["exit_code"] is None:
                return self._bench_status(run_id, seen, None)
            await blocking(progress, "copying the results to this host",
                           lambda: copy_in(self.engine, container.id, folder, target))  # fmt: skip
        return await in_thread(lambda: self._bench_status(run_id, read_host_bench(target), target))

    def _bench_status(self, run_id: str, seen: dict[str, Any], target: Path | None) -> BenchStatus:
        """The status from what was read (in the container while running, from the host copy once ended)."""
        from t4serve.bench.results import read_runs, summarize

        code = seen["exit_code"]
        gone = code is None and not seen["alive"]
        state: Literal["running", "done", "failed"] = (
            "failed" if gone or (code is not None and code != 0) else "running" if code is None else "done"
        )
        log = seen["log"]
        if gone:
            log += "\n(the benchmark's process is gone without an exit code: the container restarted or it was killed)"
        progress = BENCH_PROGRESS.findall(log)
        cells: list[BenchCell] = []
        plots: list[str] = []
        if target is not None:
            result = target / "result"
            if (result / "runs.json").is_file():
                try:
                    summaries = summarize(read_runs(result).runs)
                except T4ServeError:
                    summaries = []
                cells = [
                    BenchCell(model=c.model, input_len=c.input_len, concurrency=c.concurrency,
                              repeats_ok=c.repeats_ok, repeats_failed=c.repeats_failed,
                              completed_requests=c.completed, failed_requests=c.failed_requests,
                              throughput_tok_s=c.throughput, per_stream_tok_s=c.per_stream, ttft_ms=c.ttft_ms,
                              variation_pct=c.variation_pct, errors=[e[:300] for e in c.errors[:5]])
                    for c in summaries
                ]  # fmt: skip
            plots = [str(result / name) for name in seen["plots"]]
        return BenchStatus(
            run_id=run_id,
            state=state,
            exit_code=code,
            runs_done=int(progress[-1][0]) if progress else None,
            runs_planned=int(progress[-1][1]) if progress else None,
            log_tail=redact(tail_text(log, 8 * 1024), self.env.secrets()),
            report_md=tail_text(seen["report"], BENCH_TEXT_BYTES) if seen["report"] is not None else None,
            cells=cells,
            host_folder=str(target) if target is not None else None,
            plots=plots,
        )


# Runs in the container (sh): the run folder holds bench.log and exit-code beside bench's own result/ folder (bench
# refuses an output folder that holds files). The folder is the wrapper's own argument, so its process is found by it.
BENCH_SCRIPT = (
    'd=$1; shift; mkdir -p "$d" && t4serve bench --output "$d/result" "$@" >"$d/bench.log" 2>&1; '
    'echo $? >"$d/exit-code"'
)


def copy_in(engine: Engine, container: str, folder: str, target: Path) -> None:
    """Copy a finished run folder out of the container to `target`: into a temporary sibling first, then renamed, so
    `target` is complete or absent (an interrupted copy leaves no half folder that would be read as the result)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.copying-{uuid.uuid4().hex[:8]}"
    try:
        engine.copy_out(container, folder, staging)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def read_host_bench(target: Path) -> dict[str, Any]:
    """What READ_BENCH reads, from the copy on this host."""

    def read(path: Path, limit: int) -> str | None:
        try:
            return read_tail_bounded(path, limit, "the benchmark's file").decode("utf-8", "replace")
        except (OSError, Untrusted):  # absent, or not a regular file (a FIFO copied out would block a plain read)
            return None

    code = (read(target / "exit-code", 32) or "").strip()
    result = target / "result"
    return {
        "exit_code": int(code) if code.lstrip("-").isdigit() else None,
        "alive": False,
        "log": read(target / "bench.log", 16384) or "",
        "report": read(result / "report.md", 65536),
        "plots": sorted(p.name for p in result.glob("*.png")) if result.is_dir() else [],
    }


# Runs in the container (its Python). `read FOLDER`: a run's exit code, whether its wrapper still runs, its log tail,
# report and plot names. `running ROOT`: the runs under ROOT whose wrapper still runs and that have no exit code.
READ_BENCH = """
import json, os, sys
mode, d = sys.argv[1], sys.argv[2]
def alive(folder):
    want, me = folder.rstrip("/").encode(), str(os.getpid())
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid != me:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if want in f.read().split(b"\\0"):
                        return True
            except OSError:
                pass
    return False
def read(path, limit):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2); size = f.tell(); f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None
def code(folder):
    text = (read(os.path.join(folder, "exit-code"), 32) or "").strip()
    return int(text) if text.lstrip("-").isdigit() else None
if mode == "running":
    names = sorted(os.listdir(d)) if os.path.isdir(d) else []
    print(json.dumps({"running": [n for n in names if code(os.path.join(d, n)) is None and alive(os.path.join(d, n))]}))
    sys.exit(0)
if not os.path.isdir(d):
    sys.exit(f"no such folder {d}")
up = alive(d)  # before the exit code: a wrapper that ends in between has written it
result = os.path.join(d, "result")
plots = sorted(n for n in os.listdir(result) if n.endswith(".png")) if os.path.isdir(result) else []
print(json.dumps({"exit_code": code(d), "alive": up, "log": read(os.path.join(d, "bench.log"), 16384) or "",
                  "report": read(os.path.join(result, "report.md"), 65536), "plots": plots}))
"""
