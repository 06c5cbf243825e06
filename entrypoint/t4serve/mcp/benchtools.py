"""The benchmark tools: `t4serve bench start` in the server's container (a sweep in the background), and its
progress, figures, report and plots through `t4serve bench status`, both answering typed (t4serve.contract); a
finished run's folder is copied to this host with its answer.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from mcp.server.mcpserver import Context
from pydantic import Field

from t4serve.atomic import write_atomic
from t4serve.contract import RUN_ID, BenchResultAnswer, BenchRunsAnswer, BenchStartAnswer, read_answer
from t4serve.errors import ConfigError, EngineError
from t4serve.host.engine import API_PORT, Engine
from t4serve.mcp.calls import Progress, ToolGroup, blocking, guarded, in_thread, not_ready, tail_text
from t4serve.mcp.models import BenchCell, BenchStart, BenchStatus
from t4serve.mcp.registry import READ_ONLY, hints, tool
from t4serve.mcp.servertools import read_status
from t4serve.serde import from_dict, to_dict
from t4serve.untrusted import Untrusted, load_json_file

BENCH_TEXT_BYTES = 32 * 1024
# The container's answer for a finished run, kept in its host copy (what benchmark_status reads from then on).
ANSWER_FILE = "answer.json"
MAX_ANSWER_BYTES = 4 << 20
A = TypeVar("A")


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
            int | None, Field(description="requests per run (1 to 1000; default max(4 x concurrency, 8))", ge=1,
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
            runs = await blocking(progress, "looking for a running benchmark",
                                  lambda: self._ask(container, BenchRunsAnswer, ["bench", "status", "--json"]))
            running = [run.run_id for run in runs.runs if run.state == "running"]
            if running:
                raise EngineError(
                    "run_benchmark: busy: a benchmark is running",
                    found=f"run {running[0]} has not finished",
                    required="one benchmark at a time (two would share the GPU and skew both)",
                    fix=f"benchmark_status(run_id={running[0]!r}) until it is done",
                )
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
            await progress.say("starting t4serve bench in the container")
            started = await blocking(progress, "starting t4serve bench",
                                     lambda: self._ask(container, BenchStartAnswer,
                                                       ["bench", "start", "--json", "--", *args]))  # fmt: skip
        run_id = started.run.run_id
        await progress.say(f"run {run_id} started; follow it with benchmark_status")
        return BenchStart(run_id=run_id, container=container, output_dir=started.run.folder,
                          poll=f"benchmark_status(run_id={run_id!r})")  # fmt: skip

    def _ask(self, container: str, cls: type[A], args: Sequence[str]) -> A:
        """`t4serve ARGS` (a `--json` command) run in the container, its answer read as `cls` (t4serve.contract)."""
        argv = ["t4serve", *args]
        done = self.engine.exec(container, argv)
        return read_answer(cls, argv, done.returncode, done.stdout, done.stderr, self.engine.image_ref)

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
        kept = await in_thread(lambda: read_host_answer(target))
        if kept is not None:
            return self._bench_status(kept, target)
        container = await blocking(progress, "looking for the container", self.engine.service)
        if container is None or container.state != "running":
            raise ConfigError(
                f"benchmark_status: no benchmark {run_id} on this host, and no running server to ask",
                found=f"no copy of it in {target.parent}; the t4serve container is "
                + (container.state if container else "absent"),
                required="a run id run_benchmark returned: kept on this host once it ended and benchmark_status saw "
                "it, else in the running server's container",
                fix="check the run id; a benchmark that ended while the server ran is in the t4serve-cache volume "
                "under bench/: start the server again and call benchmark_status",
            )
        answer = await blocking(progress, "reading the benchmark",
                                lambda: self._ask(container.id, BenchResultAnswer,
                                                  ["bench", "status", "--json", run_id]))  # fmt: skip
        if answer.run.run_id != run_id:
            raise EngineError(
                f"benchmark_status: the container answered for another benchmark ({answer.run.run_id})",
                found=f"asked for {run_id}, answered {answer.run.run_id}",
                required="the answer for the run id asked",
                fix="call benchmark_status again; if it persists, the image's t4serve is not this one's",
            )
        if answer.run.state == "running":
            return self._bench_status(answer, None)
        await blocking(progress, "copying the results to this host",
                       lambda: copy_in(self.engine, container.id, answer, target))  # fmt: skip
        return self._bench_status(answer, target)

    def _bench_status(self, answer: BenchResultAnswer, target: Path | None) -> BenchStatus:
        """The tool's result from the container's answer (while running, or as kept in the host copy once ended)."""
        run = answer.run
        state: Literal["running", "done", "failed"] = (
            "running" if run.state == "running" else "done" if run.state == "done" else "failed"
        )
        return BenchStatus(
            run_id=run.run_id,
            state=state,
            exit_code=run.exit_code,
            runs_done=run.runs_done,
            runs_planned=run.runs_planned,
            log_tail=tail_text(answer.log_tail, 8 * 1024),
            report_md=tail_text(answer.report_md, BENCH_TEXT_BYTES) if answer.report_md is not None else None,
            cells=[BenchCell(**to_dict(cell)) for cell in answer.cells] if target is not None else [],
            host_folder=str(target) if target is not None else None,
            # Each a PNG in result/ (the contract's pattern), listed when the copy holds it as a file.
            plots=[str(target / name) for name in answer.plots if target is not None and (target / name).is_file()
                   and not (target / name).is_symlink()],
        )


def copy_in(engine: Engine, container: str, answer: BenchResultAnswer, target: Path) -> None:
    """Copy a finished run's folder out of the container to `target`, with the container's answer beside its files:
    into a temporary sibling first, then renamed, so `target` is complete or absent (an interrupted copy leaves no
    half folder that would be read as the result). The folder named on `docker cp`'s command line is the answer's,
    read by the contract's reader (an absolute path of plain names ending in the run id, secrets redacted before);
    the engine redacts the copied files before they are moved into place (t4serve.host.engine.RedactedEngine)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.copying-{uuid.uuid4().hex[:8]}"
    try:
        engine.copy_out(container, answer.run.folder, staging)
        write_atomic(staging / ANSWER_FILE, json.dumps(to_dict(answer)) + "\n", mode=0o600)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def read_host_answer(target: Path) -> BenchResultAnswer | None:
    """The answer kept in a finished run's host copy, or None when there is no copy. Read bounded and without
    blocking (a FIFO there is refused); a copy whose answer cannot be read is an error naming it."""
    if not target.is_dir():
        return None
    try:
        return from_dict(BenchResultAnswer, load_json_file(target / ANSWER_FILE, MAX_ANSWER_BYTES, "the answer"))
    except (OSError, Untrusted, ConfigError) as exc:
        reason = exc.reason if isinstance(exc, Untrusted) else getattr(exc, "what", None) or str(exc)
        raise ConfigError(
            f"benchmark_status: the host copy {target} cannot be read",
            found=f"{target / ANSWER_FILE}: {reason}"[:500],
            required=f"the folder benchmark_status copied, with its {ANSWER_FILE}",
            fix=f"remove {target} and call benchmark_status again (it copies the run anew from the container)",
        ) from None
