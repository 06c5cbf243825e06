"""The phases of a server's start, in one table: each phase's name, its label, what the healthcheck answers in it, and
the lines of vLLM's log that move the phase tracker into it, each with the format string vLLM writes it from.

`PHASES` is the table, in the order vLLM goes through the phases. torch.compile's Dynamo/Inductor pass runs inside
vLLM's profiling run (gpu_worker.determine_available_memory), so its time falls in "profiling"; after the KV cache is
allocated vLLM compiles the remaining batch sizes and captures CUDA graphs ("compiling"). "downloading" is seen in the
HF cache (vLLM logs nothing when a download starts); "canary", "ready", "canary_failed" and "failed" are set by the
wrapper (t4serve.supervise.run_vllm), "stopping" by a stop signal, "config_error" by `serve` stopping on a bad setting
before any vLLM (`t4serve status` reports it). `FIGURE_LINES` are the log lines that carry figures
and start no phase. Each log line holds vLLM's own format string as the source of `VLLM_VERSION` writes it
(tests/image/test_log_formats.py checks each against the image's vLLM source and its regex against the format filled
in) and where vLLM 0.26, met on the GPU host, words it otherwise (both are matched, so a changed message in another
release shows up as a missing figure, not a wrong one). Pure data: t4serve.supervise.logwatch follows the log with it,
t4serve.supervise.health answers from it, and `markdown_table` is docs/architecture.md's copy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The vLLM whose source the format strings below were read from: the image's.
VLLM_VERSION = "0.34.0"

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

# What the readiness check (`t4serve healthcheck`, Docker's HEALTHCHECK) answers in a phase.
NOT_READY_LOADING = "not ready: the phase, how long it has lasted, the estimate to ready"
READY_WHEN_ANSWERING = "ready when /health answers and /v1/models lists the served model; else unhealthy"
UNHEALTHY = "unhealthy: the reason, and the diagnosis or hint"
UNHEALTHY_CONFIG = "unhealthy: the configuration error it stopped on"
NOT_READY_STOPPING = "not ready: draining in-flight requests"
# What the liveness check (`t4serve healthcheck --liveness`, Kubernetes' livenessProbe) answers in a phase.
ALIVE_WITHIN_BUDGET = "alive until the attempt has loaded for longer than the cold-start budget"
ALIVE_WHILE_ANSWERING = "alive while /health answers 200"
ALIVE = "alive: a restart would not help"
# The phase of a container whose `serve` stopped on a configuration error and waits for a stop signal.
CONFIG_ERROR = "config_error"


@dataclass(frozen=True)
class LogLine:
    """A line of vLLM's log the phase tracker reads, and where vLLM writes it."""

    name: str
    regex: re.Pattern[str]
    # Figure name -> (match group, unit).
    figures: tuple[tuple[str, int, str], ...]
    # The logger's format string in vLLM VLLM_VERSION, as its source writes it (an f-string with `%s` for each of its
    # replacement fields); `%` placeholders stand for the regex groups.
    vllm_format: str
    # The file under vllm/ and the function that log it, in VLLM_VERSION.
    source: str
    # Where vLLM 0.26 words or places it otherwise (the regex matches that too), or "".
    older: str = ""

    @property
    def source_file(self) -> str:
        return self.source.split()[0]


@dataclass(frozen=True)
class Phase:
    name: str
    # How `t4serve status`, the healthcheck and the wrapper's log name it.
    label: str
    # Loading phases move only forward, by rank; None: a phase that ends the start (failed, stopping).
    rank: int | None
    # What the readiness and liveness checks answer in it.
    readiness: str
    liveness: str
    # The weights are not in GPU memory yet (fetched or being loaded): a download shows in the HF cache, and a
    # SIGKILL is the host's OOM killer.
    before_weights_loaded: bool = False
    # The lines of vLLM's log that move the tracker into this phase.
    started_by: tuple[LogLine, ...] = ()
    # What moves the wrapper into it where no log line does.
    entered_on: str = ""

    @property
    def loading(self) -> bool:
        return self.readiness == NOT_READY_LOADING


PHASES: dict[str, Phase] = {
    p.name: p
    for p in (
        Phase("starting", "starting", 0, NOT_READY_LOADING, ALIVE_WITHIN_BUDGET, before_weights_loaded=True,
              entered_on="the vLLM wrapper starts vLLM"),
        # "downloading" and "loading_weights" share a rank because vLLM logs "Starting to load model" before it
        # downloads (the download happens inside the loader), so the two can alternate.
        Phase("downloading", "downloading weights", 1, NOT_READY_LOADING, ALIVE_WITHIN_BUDGET,
              before_weights_loaded=True, entered_on="`*.incomplete` blobs in the HF cache"),
        Phase("loading_weights", "loading weights", 1, NOT_READY_LOADING, ALIVE_WITHIN_BUDGET,
              before_weights_loaded=True, started_by=(
                  LogLine("load_start", re.compile(r"(?:Starting to load model \S+?|Loading model from scratch)\.\.\."),
                          (), "Loading model from scratch...", "v1/worker/gpu/model_runner.py load_model",
                          older="the V1 model runner of 0.33 and 0.26 (gone in 0.34) logs \"Starting to load model "
                                "%s...\""),
                  LogLine("download_done", re.compile(rf"Time spent downloading weights for (\S+): {_NUM} seconds"),
                          (("download_seconds", 2, "s"),), "Time spent downloading weights for %s: %.6f seconds",
                          "model_executor/model_loader/weight_utils.py download_weights_from_hf"),
              )),
        Phase("profiling", "profiling / KV allocation", 2, NOT_READY_LOADING, ALIVE_WITHIN_BUDGET, started_by=(
            LogLine("model_loaded", re.compile(rf"Model loading took {_NUM} GiB (?:memory )?and {_NUM} seconds"),
                    (("model_memory_gib", 1, "GiB"), ("model_load_seconds", 2, "s")),
                    "Model loading took %s GiB memory and %.6f seconds", "v1/worker/gpu/model_runner.py load_model",
                    older="0.26's V2 runner: \"Model loading took N GiB and S seconds\""),
        )),
        Phase("compiling", "compiling and CUDA graph capture", 3, NOT_READY_LOADING, ALIVE_WITHIN_BUDGET, started_by=(
            # 0.33 logs tokens and concurrency on one line ("GPU KV cache size: N tokens, Maximum concurrency for
            # ..."), 0.26 on two (`logger.info_once` each): one line here for each half matches both.
            LogLine("kv_capacity", re.compile(rf"KV cache size: {_NUM} tokens"), (("kv_tokens", 1, "tokens"),),
                    "KV cache size: %s tokens", "v1/core/kv_cache_utils.py update_kv_cache_capacity",
                    older="0.26: get_kv_cache_configs, on a line of its own"),
            LogLine("kv_concurrency", re.compile(rf"Maximum concurrency for {_NUM} tokens per request: {_NUM}x"),
                    (("max_model_len", 1, "tokens"), ("max_concurrency", 2, "x")),
                    "Maximum concurrency for %s tokens per request: %.2fx",
                    "v1/core/kv_cache_utils.py update_kv_cache_capacity",
                    older="0.26: get_kv_cache_configs, on a line of its own"),
        )),
        Phase("canary", "canary (server up, checking one greedy completion)", 4, NOT_READY_LOADING,
              ALIVE_WITHIN_BUDGET, entered_on="/health answers"),
        Phase("ready", "ready", 5, READY_WHEN_ANSWERING, ALIVE_WHILE_ANSWERING,
              entered_on="the canary's right answer (/health, with T4SERVE_CANARY=off)"),
        Phase("canary_failed", "canary failed (server answers, but wrongly)", None, UNHEALTHY, ALIVE,
              entered_on="the canary's wrong answer"),
        Phase("failed", "failed (vLLM exited)", None, UNHEALTHY, ALIVE, entered_on="vLLM exits"),
        # No vLLM runs: `serve` stopped before it (T4SERVE_ON_CONFIG_ERROR=wait) and left the error in the state
        # folder instead of a state file (t4serve.supervise.state.ConfigErrorRecord).
        Phase(CONFIG_ERROR, "stopped on a configuration error (waits for a stop signal)", None, UNHEALTHY_CONFIG, ALIVE,
              entered_on="`serve` stops on a configuration error under T4SERVE_ON_CONFIG_ERROR=wait"),
        Phase("stopping", "stopping (draining in-flight requests)", None, NOT_READY_STOPPING, ALIVE,
              entered_on="a stop signal"),
    )
}  # fmt: skip

FIGURE_LINES: tuple[LogLine, ...] = (
    LogLine("weights_loaded", re.compile(rf"Loading weights took {_NUM} seconds"), (("weights_load_seconds", 1, "s"),),
            "Loading weights took %.2f seconds", "model_executor/model_loader/default_loader.py load_weights"),
    LogLine("torch_compile", re.compile(rf"torch\.compile took {_NUM} s in total"),
            (("torch_compile_seconds", 1, "s"),), "%storch.compile took %.2f s in total",
            "compilation/monitor.py monitor_torch_compile"),
    LogLine("kv_memory", re.compile(rf"Available KV cache memory: {_NUM} GiB"), (("kv_cache_memory_gib", 1, "GiB"),),
            "Available KV cache memory: %s GiB", "v1/worker/gpu_worker.py determine_available_memory"),
    LogLine("kv_memory_set",
            re.compile(rf"reserved {_NUM} GiB memory for KV Cache as specified by kv_cache_memory_bytes"),
            (("kv_cache_memory_gib", 1, "GiB"),),
            "reserved %s GiB memory for KV Cache as specified by kv_cache_memory_bytes",
            "v1/worker/gpu_worker.py determine_available_memory (a set --kv-cache-memory-bytes)"),
    LogLine("cuda_graphs", re.compile(rf"Graph capturing finished in {_NUM} secs, took {_NUM} GiB"),
            (("cuda_graph_seconds", 1, "s"), ("cuda_graph_gib", 2, "GiB")),
            "Graph capturing finished in %.0f secs, took %.2f GiB", "v1/worker/gpu/model_runner.py capture_model"),
    LogLine("engine_ready", re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_NUM} s"),
            (("init_engine_seconds", 1, "s"),), "init engine (profile, create kv cache, warmup model) took %.2f s",
            "v1/engine/core.py _initialize_kv_caches"),
    LogLine("server_start", re.compile(r"Starting vLLM server on (\S+)"), (), "Starting vLLM server on %s",
            "entrypoints/launchers/api_server/entry.py"),
)  # fmt: skip

# Every line the tracker reads: those that start a phase (in the phases' order), then those that only carry figures.
LOG_LINES: tuple[tuple[LogLine, str | None], ...] = (
    *((line, phase.name) for phase in PHASES.values() for line in phase.started_by),
    *((line, None) for line in FIGURE_LINES),
)
PHASE_LABELS: dict[str, str] = {name: p.label for name, p in PHASES.items()}
# The phases of a start still under way, in order: what the start budget and the history time.
LOADING_PHASES: tuple[str, ...] = tuple(name for name, p in PHASES.items() if p.loading)


def markdown_table() -> str:
    """docs/architecture.md's table of phases (a unit test keeps the document equal to it)."""
    lines = ["| phase | label | healthcheck | `healthcheck --liveness` | entered on |", "|---|---|---|---|---|"]
    for p in PHASES.values():
        entered = "; ".join(f"`{line.vllm_format}` (vllm/{line.source_file})" for line in p.started_by)
        lines.append(f"| `{p.name}` | {p.label} | {p.readiness} | {p.liveness} | {entered or p.entered_on} |")
    return "\n".join(lines) + "\n"
