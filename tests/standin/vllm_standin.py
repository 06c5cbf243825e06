#!/usr/bin/env python3
"""A test double for `vllm serve` with a real model: where no GPU exists, it plays vLLM 0.33's part for t4serve's tests.

What it stands for: the OpenAI-compatible server of vLLM 0.33.0 serving Gemma 4 E2B on a Tesla T4. It prints vLLM's
own log lines (format strings copied from vLLM 0.33's source, figures from the T4 runs of published-t4-run.md unless the
environment overrides them), keeps its port closed while "loading" as vLLM does, then serves GET /health, /ping,
/v1/models, /metrics and POST /v1/completions and /v1/chat/completions (plain and streaming SSE,
`stream_options.include_usage`), so `vllm bench serve` is a real client of it; POST /invocations is SageMaker's router,
which vLLM 0.33 serves on every server (vllm/entrypoints/serve/sagemaker/api_router.py): a chat request's body runs
chat, one with a prompt a completion. With `--api-key KEY...` or VLLM_API_KEY (the flag wins, as in vLLM) it answers
/v1/* (also /v2, /inference, /cohere) 401 {"error": "Unauthorized"} without `Authorization: Bearer KEY`, as vLLM's
AuthenticationMiddleware does; every other path, /invocations included, stays open, as in vLLM. `--middleware
module.Class` (repeatable) wraps the server in that ASGI middleware class as vLLM does (app.add_middleware: the last
one given is the outermost, all of them outside vLLM's own guard): each request runs through the chain as an ASGI
http scope, and a middleware that answers instead of calling on is answered with its response; function middleware
(vLLM's `@app.middleware("http")` path) is refused at start. Text is deterministic; "17*23" in a prompt is
answered "391".
Python standard library only: it runs under the image's venv Python and the host's Python 3.11.

Usage (on PATH as `vllm`, or run directly):
    vllm serve MODEL [--host H] [--port P] [--served-model-name N ...] [--max-model-len L] [--max-num-seqs S]
                     [--shutdown-timeout T] [any other vLLM flag, accepted and ignored]
Any other subcommand (`vllm bench serve ...`) is handed to the next real `vllm` found on PATH after this file, or
exits 2 saying none was found: the stand-in never fakes vLLM's benchmark client.

Behaviour, from the environment:
    T4SERVE_STANDIN_MODE             ok | crash-on-load | crash-after-ready | hang | garbage | slow-load   (ok)
    T4SERVE_STANDIN_CRASH_LOG        crash-on-load's failure: cuda-oom | host-oom | clamp | bf16 | shm | driver |
                                     gated   (cuda-oom)
    T4SERVE_STANDIN_CRASH_AFTER      crash-after-ready: seconds after ready until the engine dies   (1.0)
    T4SERVE_STANDIN_DEAD_LINGER      crash-after-ready: seconds /health answers 503 before the process exits 1   (1.0)
    T4SERVE_STANDIN_HANG_AFTER       hang: seconds after ready until requests stop being answered   (0: at once)
    T4SERVE_STANDIN_GARBAGE          garbage: empty (every token's text is "") | pad ("<pad>", what NaN logits give)
    T4SERVE_STANDIN_LOAD_SECONDS     real seconds spent "loading" with the port closed   (0.3; slow-load: 20)
    T4SERVE_STANDIN_TOKEN_DELAY      seconds per generated token   (0)
    T4SERVE_STANDIN_PREFILL_DELAY    seconds per prompt token before the first token   (0)
    T4SERVE_STANDIN_PROMPT_LOG       a file each completion request appends its prompt's SHA-256 to (so a test can
                                     check which prompts a client sent)
    T4SERVE_STANDIN_COMPILE_OOM_WITHOUT  a vLLM flag (e.g. --enforce-eager): while it is absent from the command line,
                                     the start dies as vLLM 0.26 did on a T4's memory with a cold compile cache
                                     (InductorError: OutOfMemoryError after "Model loading took"), exit 1
    T4SERVE_STANDIN_MODEL_GIB, T4SERVE_STANDIN_MODEL_LOAD_S, T4SERVE_STANDIN_WEIGHTS_LOAD_S, T4SERVE_STANDIN_KV_TOKENS
                                     the figures logged (defaults: published-t4-run.md's bf16; QAT for a "qat" model)
    T4SERVE_STANDIN_NUM_GPU_BLOCKS   vllm:cache_config_info's num_gpu_blocks   (the KV tokens / the block size)
    T4SERVE_STANDIN_DRAFTS           with --speculative-config: on (each token counts num_speculative_tokens
                                     drafted, one accepted: vLLM verifies drafts from the step after the prompt's,
                                     the step that also ends a one-token answer) | off (a drafter that never runs:
                                     the counters stay 0)   (on)
/metrics serves vLLM's names and types for the queue, the running requests, KV use, tokens, requests, preemptions,
three request histograms and vllm:cache_config_info (the KV cache's configuration in its labels, block_size from
--block-size), and with --speculative-config vLLM's speculative decoding counters (drafts, draft tokens, accepted
tokens), in Prometheus' text format.
Prompt and completion tokens are counted as Hugging Face's Whitespace pre-tokenizer splits text (`\\w+|[^\\w\\s]+`),
which equals the true count for the word-level tokenizer the bench test builds.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import importlib
import inspect
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

VLLM_VERSION = "0.33.0"
MODES = ("ok", "crash-on-load", "crash-after-ready", "hang", "garbage", "slow-load")
CRASH_LOGS = ("cuda-oom", "host-oom", "clamp", "bf16", "shm", "driver", "gated")
# vLLM's own default when --max-num-seqs is not given on a GPU with less than 70 GiB (EngineArgs defaults).
DEFAULT_MAX_NUM_SEQS = 256
# Bound on handler threads: the stand-in never grows without limit, whatever a test throws at it.
MAX_CONNECTIONS = 128
# The path prefixes vLLM's API-key middleware guards.
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
TOKEN_PATTERN = re.compile(r"\w+|[^\w\s]+")
FILLER_WORDS = (
    "the", "model", "answers", "each", "request", "with", "a", "steady", "stream", "of", "tokens", "from",
    "its", "cache", "while", "turing", "keeps", "time", "and", "memory", "in", "balance", "for", "every",
)  # fmt: skip


@dataclass(frozen=True)
class Figures:
    """The numbers the log prints, as published-t4-run.md records them for the published T4 runs."""

    model_gib: float
    model_load_s: float
    weights_load_s: float
    kv_tokens: int


# bf16: "Model loading took 9.8 GiB memory and 157.18 seconds", "GPU KV cache size: 315,974 tokens".
# QAT: loads in about 98.7 s and its weights take 1.78 GiB less; its KV figure is not published, so bf16's stands.
BF16_FIGURES = Figures(model_gib=9.8, model_load_s=157.18, weights_load_s=151.02, kv_tokens=315_974)
QAT_FIGURES = Figures(model_gib=8.02, model_load_s=98.7, weights_load_s=93.41, kv_tokens=315_974)


@dataclass
class Options:
    model: str
    host: str = "0.0.0.0"
    port: int = 8000
    served_model_names: list[str] = field(default_factory=list)
    max_model_len: int = 16384
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    shutdown_timeout: int = 0
    # Keys one of which /v1/* requests must carry (vLLM: --api-key, else VLLM_API_KEY); empty: no authentication.
    api_keys: list[str] = field(default_factory=list)
    # --middleware import paths, in the order given.
    middleware: list[str] = field(default_factory=list)
    # The KV cache flags vllm:cache_config_info reports (CacheConfig's fields); None: vLLM's default for the field.
    block_size: int | None = None
    gpu_memory_utilization: float = 0.92
    kv_cache_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None
    enable_prefix_caching: bool = True
    # --speculative-config's num_speculative_tokens; 0 without speculative decoding.
    num_speculative_tokens: int = 0
    non_default: dict[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return self.served_model_names or [self.model]


class Log:
    """vLLM's log line: `(PROCESS pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message` (vllm/logger.py _FORMAT)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def line(self, process: str, level: str, where: str, message: str, stream: Any = None) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        with self.lock:
            out = stream or sys.stdout
            for part in message.split("\n"):
                out.write(f"({process} pid={os.getpid()}) {level} {stamp} [{where}] {part}\n")
            out.flush()

    def api(self, where: str, message: str, level: str = "INFO") -> None:
        self.line("APIServer", level, where, message)

    def engine(self, where: str, message: str, level: str = "INFO") -> None:
        self.line("EngineCore_DP0", level, where, message)

    def uvicorn(self, message: str) -> None:
        # uvicorn's default formatter ("%(levelprefix)s %(message)s"), behind vLLM's process prefix.
        with self.lock:
            sys.stdout.write(f"(APIServer pid={os.getpid()}) INFO:     {message}\n")
            sys.stdout.flush()

    def raw(self, text: str) -> None:
        with self.lock:
            sys.stderr.write(text if text.endswith("\n") else text + "\n")
            sys.stderr.flush()


LOG = Log()


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        fail(f"{name}={raw!r} is not a number", f"set {name} to seconds or a count, e.g. {name}={default}")
    raise AssertionError("unreachable")


def fail(what: str, fix: str) -> None:
    sys.stderr.write(f"vllm (t4serve stand-in): {what}\n  fix: {fix}\n")
    sys.exit(2)


def count_tokens(text: str) -> int:
    return len(TOKEN_PATTERN.findall(text))


def figures_for(model: str) -> Figures:
    base = QAT_FIGURES if "qat" in model.lower() else BF16_FIGURES
    return Figures(
        model_gib=env_float("T4SERVE_STANDIN_MODEL_GIB", base.model_gib),
        model_load_s=env_float("T4SERVE_STANDIN_MODEL_LOAD_S", base.model_load_s),
        weights_load_s=env_float("T4SERVE_STANDIN_WEIGHTS_LOAD_S", base.weights_load_s),
        kv_tokens=int(env_float("T4SERVE_STANDIN_KV_TOKENS", base.kv_tokens)),
    )


# ----------------------------------------------------------------------------------------------------------- arguments


def parse_serve_args(argv: list[str]) -> Options:
    """Take the flags the stand-in acts on; accept every other `--flag [value]` as vLLM would, and ignore it."""
    model: str | None = None
    values: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name, eq, inline = arg[2:].partition("=")
            name = name.replace("_", "-")
            if eq:
                values.setdefault(name, []).append(inline)
                i += 1
                continue
            taken = []
            while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                taken.append(argv[i + 1])
                i += 1
                if name not in ("served-model-name", "api-key"):
                    break
            values.setdefault(name, []).extend(taken or ["true"])
        elif model is None:
            model = arg
        i += 1
    if "model" in values:
        model = values.pop("model")[-1]
    if model is None:
        fail("`vllm serve` needs a model (positional MODEL or --model)", "vllm serve google/gemma-4-E2B-it ...")
    assert model is not None
    opts = Options(model=model)

    def take_int(name: str) -> int | None:
        if name not in values:
            return None
        raw = values.pop(name)[-1]
        try:
            return int(raw)
        except ValueError:
            fail(f"--{name} {raw!r} is not an integer", f"pass --{name} as a whole number")
        raise AssertionError("unreachable")

    opts.host = values.pop("host", [opts.host])[-1]
    opts.port = take_int("port") or opts.port
    opts.max_model_len = take_int("max-model-len") or opts.max_model_len
    opts.max_num_seqs = take_int("max-num-seqs") or opts.max_num_seqs
    opts.shutdown_timeout = take_int("shutdown-timeout") or 0
    opts.served_model_names = values.pop("served-model-name", [])
    # vllm/entrypoints/serve/middleware/register.py: `args.api_key or [envs.VLLM_API_KEY]`, empty keys dropped.
    opts.api_keys = [k for k in values.pop("api-key", None) or [os.environ.get("VLLM_API_KEY", "")] if k]
    opts.middleware = values.pop("middleware", [])
    # Read, not taken: vLLM logs them among its non-default args.
    size = values.get("block-size", [None])[-1]
    opts.block_size = int(size) if size is not None else None
    opts.gpu_memory_utilization = float(values.get("gpu-memory-utilization", [opts.gpu_memory_utilization])[-1])
    opts.kv_cache_dtype = values.get("kv-cache-dtype", [opts.kv_cache_dtype])[-1]
    memory = values.get("kv-cache-memory-bytes", [None])[-1]
    opts.kv_cache_memory_bytes = int(memory) if memory is not None else None
    opts.enable_prefix_caching = "no-enable-prefix-caching" not in values
    speculative = values.get("speculative-config", [None])[-1]
    if speculative is not None:
        try:
            opts.num_speculative_tokens = int(json.loads(speculative)["num_speculative_tokens"])
        except (ValueError, KeyError, TypeError):
            fail(f"--speculative-config {speculative!r} is not the JSON vLLM reads",
                 "pass '{\"method\": \"mtp\", \"model\": ..., \"num_speculative_tokens\": 2}'")
    opts.non_default = {k: v[-1] for k, v in values.items()}
    return opts


def exec_real_vllm(argv: list[str]) -> None:
    """Hand a non-serve subcommand to the next `vllm` on PATH after this file, so `vllm bench serve` is the real one."""
    me = os.path.realpath(sys.argv[0])
    found: list[str] = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(folder or ".", "vllm")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            found.append(path)
    mine = [i for i, path in enumerate(found) if os.path.realpath(path) == me]
    # After the stand-in's own PATH entry when it is on PATH; else any `vllm` that is not the stand-in.
    after = [path for path in found[(mine[0] + 1 if mine else 0) :] if os.path.realpath(path) != me]
    if not after:
        sys.stderr.write(
            f"vllm (t4serve stand-in): `vllm {' '.join(argv[:1])}` is not served by the stand-in, which only plays "
            "`vllm serve`\n  found: no other `vllm` executable on PATH\n"
            "  fix: install vLLM (the image has /opt/venv/bin/vllm) and put it on PATH after the stand-in\n"
        )
        sys.exit(2)
    os.execv(after[0], [after[0], *argv])


# vLLM's CacheConfig.DEFAULT_BLOCK_SIZE, the block size of the CUDA attention backends when --block-size is not given.
DEFAULT_BLOCK_SIZE = 16


def cache_config_info(opts: Options, figures: Figures) -> dict[str, str]:
    """The labels of vllm:cache_config_info, as vLLM 0.34's API server sets them once the engine is up: every field of
    its CacheConfig (vllm/config/cache.py, in their order, `metrics_info()`: `{key: str(value) for key, value in
    self.__dict__.items()}`) and `engine` (vllm/v1/metrics/loggers.py, `log_metrics_info`), with the values the engine's
    ready response syncs back (vllm/v1/engine/core_client.py, `_apply_ready_response`: block_size, num_gpu_blocks,
    kv_cache_size_tokens, kv_cache_max_concurrency, effective_attention_block_size) and the flags' values otherwise.
    num_gpu_blocks is the KV tokens over the block size (T4SERVE_STANDIN_NUM_GPU_BLOCKS overrides it): true of a model
    with one KV group; Gemma 4's groups share their blocks, so vLLM reports fewer."""
    block = opts.block_size or DEFAULT_BLOCK_SIZE
    blocks = int(env_float("T4SERVE_STANDIN_NUM_GPU_BLOCKS", figures.kv_tokens // block))
    fields: dict[str, Any] = {
        "block_size": block, "user_specified_block_size": opts.block_size is not None, "kv_cache_layout": None,
        "prefix_match_unit": None, "gpu_memory_utilization": opts.gpu_memory_utilization,
        "cache_dtype": opts.kv_cache_dtype, "is_attention_free": False, "num_gpu_blocks_override": None,
        "sliding_window": None, "enable_prefix_caching": opts.enable_prefix_caching,
        "prefix_caching_hash_algo": "sha256", "prefix_cache_retention_interval": 0, "kv_cache_dtype_skip_layers": [],
        "mamba_page_size_padded": None, "skip_page_size_padded": None, "mamba_block_size": None,
        "mamba_cache_dtype": "auto", "mamba_ssm_cache_dtype": "auto", "mamba_cache_mode": "none",
        "enable_mamba_shared_prefix_checkpoint": False, "replayssm_buffer_len": 16, "use_replayssm": False,
        "use_kda_recoverssm": False, "num_gpu_blocks": blocks, "num_cpu_blocks": None,
        "simple_cpu_offload_num_blocks": None, "effective_attention_block_size": block,
        "kv_cache_size_tokens": figures.kv_tokens, "kv_cache_max_concurrency": figures.kv_tokens / opts.max_model_len,
        "hash_block_size": None, "cache_hit_alignment_tokens": None, "kv_sharing_fast_prefill": False,
        "swa_bounded_replay": True, "kv_cache_memory_bytes": opts.kv_cache_memory_bytes,
        # vLLM 0.34: the extensible KV cache is on by default on CUDA and off where the pool is given (EngineArgs
        # resolves it once: `_extensible_kv_cache_resolved`).
        "enable_extensible_kv_cache": opts.kv_cache_memory_bytes is None, "kv_offloading_size": None,
        "kv_offloading_backend": "native", "_block_size_resolved": True, "_extensible_kv_cache_resolved": True,
    }  # fmt: skip
    return {**{key: str(value) for key, value in fields.items()}, "engine": "0"}


def label_text(labels: dict[str, str]) -> str:
    """Prometheus' text format for a label set: `name="value"`, backslash, double quote and newline escaped."""
    escape = {"\\": "\\\\", '"': '\\"', "\n": "\\n"}
    return ",".join(f'{k}="{"".join(escape.get(c, c) for c in v)}"' for k, v in labels.items())


# ------------------------------------------------------------------------------------------------------------- engine


class Engine:
    """The state requests see: ready, dead or hung, with vLLM's scheduler limit of --max-num-seqs running requests."""

    def __init__(self, opts: Options, mode: str) -> None:
        self.opts = opts
        self.mode = mode
        # The --middleware classes, outermost first (load_middleware).
        self.middleware: list[Any] = []
        self.dead = threading.Event()
        self.hung = threading.Event()
        self.stopping = threading.Event()
        self.abort = threading.Event()
        self.slots = threading.BoundedSemaphore(opts.max_num_seqs)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.running = 0
        self.waiting = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.request_success_total = 0
        # vLLM's speculative decoding counters (vllm/v1/spec_decode/metrics.py), served only with --speculative-config.
        self.drafts_total = 0
        self.draft_tokens_total = 0
        self.accepted_tokens_total = 0
        self.drafting = opts.num_speculative_tokens > 0 and os.environ.get("T4SERVE_STANDIN_DRAFTS", "on") != "off"
        # vLLM's per-request histograms, as (sum of seconds, count): queue (arrival to a slot), prefill, decode. The
        # stand-in never preempts and has no engine steps, so it serves no iteration_tokens_total (vLLM does).
        self.histograms: dict[str, list[float]] = {
            name: [0.0, 0] for name in ("request_queue_time_seconds", "request_prefill_time_seconds",
                                        "request_decode_time_seconds")
        }
        self.cache_info = cache_config_info(opts, figures_for(opts.model))
        self.token_delay = env_float("T4SERVE_STANDIN_TOKEN_DELAY", 0.0)
        self.prefill_delay = env_float("T4SERVE_STANDIN_PREFILL_DELAY", 0.0)
        self.garbage_text = "<pad>" if os.environ.get("T4SERVE_STANDIN_GARBAGE", "empty") == "pad" else ""

    def tokens(self, prompt: str, max_tokens: int, ignore_eos: bool) -> tuple[list[str], str]:
        """The completion's token texts and finish reason: deterministic in the prompt, never longer than max_tokens."""
        if "17*23" in prompt.replace(" ", ""):
            answer = ["391"]
        else:
            digest = hashlib.sha256(prompt.encode()).digest()
            answer = [(" " if i else "") + FILLER_WORDS[digest[i % 32] % len(FILLER_WORDS)] for i in range(24)]
        if ignore_eos:
            filler = [" " + FILLER_WORDS[i % len(FILLER_WORDS)] for i in range(max(0, max_tokens - len(answer)))]
            out = (answer + filler)[:max_tokens]
            return self._garble(out), "length"
        out = answer[:max_tokens]
        return self._garble(out), ("stop" if len(out) < max_tokens else "length")

    def _observe(self, name: str, seconds: float) -> None:
        """One request's time into a histogram (the caller holds the lock)."""
        self.histograms[name][0] += seconds
        self.histograms[name][1] += 1

    def _garble(self, tokens: list[str]) -> list[str]:
        return [self.garbage_text for _ in tokens] if self.mode == "garbage" else tokens

    def generate(self, prompt: str, max_tokens: int, ignore_eos: bool) -> Iterator[tuple[str, str | None]]:
        """Yield (token text, finish reason on the last one); waits for a scheduler slot first, as vLLM queues."""
        with self.lock:
            self.waiting += 1
        arrived = time.monotonic()
        self.slots.acquire()
        with self.lock:
            self.waiting -= 1
            self.running += 1
            self._observe("request_queue_time_seconds", time.monotonic() - arrived)
        try:
            prompt_len = count_tokens(prompt)
            with self.lock:
                self.prompt_tokens_total += prompt_len
            began = time.monotonic()
            if self.prefill_delay:
                self.abort.wait(self.prefill_delay * prompt_len)
            with self.lock:
                self._observe("request_prefill_time_seconds", time.monotonic() - began)
            began = time.monotonic()
            texts, reason = self.tokens(prompt, max_tokens, ignore_eos)
            for i, text in enumerate(texts):
                if self.abort.is_set() or self.dead.is_set():
                    yield "", "abort"
                    return
                if i and self.token_delay:
                    self.abort.wait(self.token_delay)
                with self.lock:
                    self.generation_tokens_total += 1
                    if self.drafting:
                        self.drafts_total += 1
                        self.draft_tokens_total += self.opts.num_speculative_tokens
                        self.accepted_tokens_total += 1
                yield text, (reason if i == len(texts) - 1 else None)
            with self.lock:
                self.request_success_total += 1
                self._observe("request_decode_time_seconds", time.monotonic() - began)
        finally:
            with self.lock:
                self.running -= 1
            self.slots.release()


def load_middleware(paths: list[str]) -> list[Any]:
    """The --middleware classes, imported as vLLM's init_entrypoints_middleware imports them, outermost first
    (Starlette's add_middleware puts each new one outside the ones before it)."""
    classes = []
    for path in paths:
        module_path, _, object_name = path.rpartition(".")
        imported = getattr(importlib.import_module(module_path), object_name)
        if inspect.iscoroutinefunction(imported):
            fail(f"--middleware {path} is a function", "the stand-in plays class (ASGI) middleware only")
        if not inspect.isclass(imported):
            raise ValueError(f"Invalid middleware {path}. Must be a function or a class.")
        classes.append(imported)
    return classes[::-1]


# --------------------------------------------------------------------------------------------------------------- HTTP


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    engine: Engine

    def setup(self) -> None:
        super().setup()
        # uvicorn sets TCP_NODELAY; without it Nagle holds each small SSE event ~40 ms and TPOT reads as 0.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        # uvicorn's access log line: `INFO:     127.0.0.1:PORT - "GET /health HTTP/1.1" 200 OK`
        if format.startswith('"%s" %s'):
            request, code = args[0], args[1]
            phrase = HTTPStatus(int(code)).phrase if str(code).isdigit() else ""
            LOG.uvicorn(f'{self.client_address[0]}:{self.client_address[1]} - "{request}" {code} {phrase}')

    def _block_if_hung(self) -> bool:
        if self.engine.hung.is_set():
            # The connection stays open and unanswered until the process stops, as a wedged server's would.
            self.engine.stopping.wait()
            self.close_connection = True
            return True
        return False

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        # vLLM's ErrorResponse shape (vllm/entrypoints/openai/engine/protocol.py).
        self._json(status, {"error": {"message": message, "type": kind, "param": param, "code": status}})

    def _refused(self) -> bool:
        """vLLM's AuthenticationMiddleware (vllm/entrypoints/serve/middleware/authenticate.py): a guarded path without
        one of the keys as `Authorization: Bearer KEY` gets 401 {"error": "Unauthorized"}."""
        keys = self.engine.opts.api_keys
        if not keys or not self.path.startswith(GUARDED_PREFIX):
            return False
        scheme, _, param = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and any(hmac.compare_digest(param.encode(), k.encode()) for k in keys):
            return False
        self._json(401, {"error": "Unauthorized"})
        return True

    def _middleware_answered(self, body: bytes) -> bool:
        """Run the request through the --middleware chain as an ASGI http scope, the way Starlette's stack runs it
        before the routes; True when a middleware answered it itself (that answer is sent), False when it reached
        the app."""
        if not self.engine.middleware:
            return False
        reached: list[bool] = []
        sent: list[dict[str, Any]] = []

        async def routes(scope: Any, receive: Any, send: Any) -> None:
            reached.append(True)

        app: Any = routes
        for cls in reversed(self.engine.middleware):
            app = cls(app=app)
        url = urlsplit(self.path)
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": self.command,
            "scheme": "http", "path": unquote(url.path), "raw_path": url.path.encode(),
            "query_string": url.query.encode(), "root_path": "",
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()],
            "client": self.client_address[:2], "server": self.server.server_address[:2],
        }  # fmt: skip

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        asyncio.run(app(scope, receive, send))
        if reached:
            return False
        start = next(m for m in sent if m["type"] == "http.response.start")
        data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        self.send_response(int(start["status"]))
        for name, value in start.get("headers", []):
            if name.lower() != b"content-length":
                self.send_header(name.decode("latin-1"), value.decode("latin-1"))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return True

    def do_GET(self) -> None:
        if self._block_if_hung() or self._middleware_answered(b"") or self._refused():
            return
        engine = self.engine
        if self.path in ("/health", "/ping"):
            status = HTTPStatus.SERVICE_UNAVAILABLE if engine.dead.is_set() else HTTPStatus.OK
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            created = int(time.time())
            data = [
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "vllm",
                    "root": engine.opts.model,
                    "parent": None,
                    "max_model_len": engine.opts.max_model_len,
                }
                for name in engine.opts.names
            ]
            self._json(200, {"object": "list", "data": data})
        elif self.path == "/metrics":
            self._metrics()
        else:
            self._error(404, "Not Found", "NotFoundError")

    def _metrics(self) -> None:
        engine = self.engine
        label = f'engine="0",model_name="{engine.opts.names[0]}"'
        with engine.lock:
            lines = [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{label}}} {float(engine.running)}",
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{label}}} {float(engine.waiting)}",
                "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f"vllm:kv_cache_usage_perc{{{label}}} {min(1.0, engine.running / max(engine.opts.max_num_seqs, 1))}",
                "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
                "# TYPE vllm:prompt_tokens_total counter",
                f"vllm:prompt_tokens_total{{{label}}} {float(engine.prompt_tokens_total)}",
                "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
                "# TYPE vllm:generation_tokens_total counter",
                f"vllm:generation_tokens_total{{{label}}} {float(engine.generation_tokens_total)}",
                "# HELP vllm:request_success_total Count of successfully processed requests.",
                "# TYPE vllm:request_success_total counter",
                f'vllm:request_success_total{{{label},finished_reason="length"}} {float(engine.request_success_total)}',
                "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
                "# TYPE vllm:num_preemptions_total counter",
                f"vllm:num_preemptions_total{{{label}}} 0.0",
                # An info metric as vLLM emulates one: a gauge set to 1, the configuration in its labels.
                "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                "# TYPE vllm:cache_config_info gauge",
                f"vllm:cache_config_info{{{label_text(engine.cache_info)}}} 1.0",
            ]
            if engine.opts.num_speculative_tokens:
                counters = (("num_drafts", engine.drafts_total), ("num_draft_tokens", engine.draft_tokens_total),
                            ("num_accepted_tokens", engine.accepted_tokens_total))
                for name, value in counters:
                    lines += [f"# TYPE vllm:spec_decode_{name} counter",
                              f"vllm:spec_decode_{name}_total{{{label}}} {float(value)}"]
            for name, (total, count) in engine.histograms.items():
                lines += [f"# TYPE vllm:{name} histogram",
                          f'vllm:{name}_bucket{{{label},le="+Inf"}} {float(count)}',
                          f"vllm:{name}_count{{{label}}} {float(count)}",
                          f"vllm:{name}_sum{{{label}}} {total}"]
        data = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self._block_if_hung() or self._middleware_answered(raw) or self._refused():
            return
        engine = self.engine
        if self.path == "/ping":
            self.do_GET()
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions", "/invocations"):
            self._error(404, "Not Found", "NotFoundError")
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as exc:
            self._error(400, f"Invalid JSON body: {exc}", "BadRequestError")
            return
        chat = self.path == "/v1/chat/completions"
        if self.path == "/invocations":
            # SageMaker's router: the first request type the body validates as, chat before completion.
            chat = isinstance(body.get("messages"), list)
            if not chat and "prompt" not in body:
                self._error(400, "Cannot find suitable handler for request. Expected one of: "
                            "['ChatCompletionRequest', 'CompletionRequest']", "BadRequestError")  # fmt: skip
                return
        model = body.get("model") or engine.opts.names[0]
        if model not in engine.opts.names:
            self._error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
            return
        if chat:
            messages = body.get("messages") or []
            prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        else:
            prompt_field = body.get("prompt", "")
            prompt = prompt_field[0] if isinstance(prompt_field, list) and prompt_field else str(prompt_field)
        prompt_log = os.environ.get("T4SERVE_STANDIN_PROMPT_LOG")
        if prompt_log:
            with engine.lock, open(prompt_log, "a", encoding="utf-8") as log:
                log.write(hashlib.sha256(prompt.encode()).hexdigest() + "\n")
        if engine.dead.is_set():
            self._error(500, "The server had an error while processing your request.", "InternalServerError")
            return
        prompt_tokens = count_tokens(prompt)
        default_max = 16 if not chat else engine.opts.max_model_len - prompt_tokens
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max
        if prompt_tokens + max_tokens > engine.opts.max_model_len:
            self._error(
                400,
                f"This model's maximum context length is {engine.opts.max_model_len} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion.",
                "BadRequestError",
            )
            return
        ignore_eos = bool(body.get("ignore_eos", False))
        with engine.lock:
            engine.in_flight += 1
        try:
            request_id = ("chatcmpl-" if chat else "cmpl-") + hashlib.sha1(os.urandom(8)).hexdigest()[:24]
            generator = engine.generate(prompt, int(max_tokens), ignore_eos)
            if body.get("stream"):
                usage = bool((body.get("stream_options") or {}).get("include_usage"))
                self._stream(request_id, model, chat, generator, prompt_tokens, usage)
            else:
                self._complete(request_id, model, chat, generator, prompt_tokens)
        finally:
            with engine.lock:
                engine.in_flight -= 1

    def _complete(
        self, request_id: str, model: str, chat: bool, tokens: Iterator[tuple[str, str | None]], prompt_tokens: int
    ) -> None:
        texts, reason = [], None
        for text, finish in tokens:
            texts.append(text)
            reason = finish
        if reason == "abort":
            texts.pop()
        n = len(texts)
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n, "completion_tokens": n}
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(texts), "tool_calls": []},
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": "".join(texts),
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
        self._json(
            200,
            {
                "id": request_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": usage,
            },
        )

    def _chunk(self, payload: str) -> None:
        data = payload.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream(
        self,
        request_id: str,
        model: str,
        chat: bool,
        tokens: Iterator[tuple[str, str | None]],
        prompt_tokens: int,
        include_usage: bool,
    ) -> None:
        # vLLM's SSE: one `data: {json}` event per token (finish_reason on the last), an optional usage event with
        # empty choices, then `data: [DONE]`. Chunked transfer encoding, as uvicorn sends it.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> None:
            body: dict[str, Any] = {"id": request_id, "object": kind, "created": created, "model": model}
            body["choices"] = choices
            if usage is not None:
                body["usage"] = usage
            self._chunk("data: " + json.dumps(body) + "\n\n")

        n = 0
        try:
            if chat:
                event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}])
            for text, finish in tokens:
                if finish != "abort":
                    n += 1
                if chat:
                    delta = {} if finish == "abort" else {"content": text}
                    event([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}])
                else:
                    event([{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}])
            if include_usage:
                event([], {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n, "completion_tokens": n})
            self._chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # The client went away: vLLM aborts the request; drain the generator so its slot is released.
            for _ in tokens:
                pass
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # vLLM binds with SO_REUSEADDR too, so a restarted server can take the port straight back.
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], engine: Engine) -> None:
        self.connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        handler = type("BoundHandler", (Handler,), {"engine": engine})
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.connections.acquire(blocking=False):
            # Over the bound: refuse rather than spawn another thread.
            request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()


# ------------------------------------------------------------------------------------------------------------ startup


def log_startup(opts: Options) -> None:
    LOG.api("utils.py:233", f"vLLM server version {VLLM_VERSION}, serving model {opts.model}")
    args = {"model_tag": opts.model, "host": opts.host, "port": opts.port, "model": opts.model}
    args.update({k.replace("-", "_"): v for k, v in opts.non_default.items()})
    if opts.served_model_names:
        args["served_model_name"] = opts.served_model_names
    LOG.api("utils.py:96", f"non-default args: {args}")
    LOG.engine(
        "core.py:140",
        f"Initializing a V1 LLM engine (v{VLLM_VERSION}) with config: model='{opts.model}', "
        f"max_seq_len={opts.max_model_len}, served_model_name={opts.names[0]}",
    )


def crash_on_load(opts: Options, kind: str) -> None:
    """Print the failure vLLM (or torch, triton, the hub) prints for `kind`, then exit 1 as vLLM's CLI does."""
    engine_fail = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
    if kind == "cuda-oom":
        oom = (
            "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 14.56 GiB of which "
            "301.81 MiB is free. Including non-PyTorch memory, this process has 14.26 GiB memory in use. Of the "
            "allocated memory 13.90 GiB is allocated by PyTorch, and 187.33 MiB is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            "Management  (https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch_cuda_alloc_conf)"
        )
        LOG.engine(
            "gpu_model_runner.py:5086",
            "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to free memory for "
            "weights, increasing --tensor-parallel-size, or using --quantization. See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more tips. "
            f"(original error: {oom})",
            level="ERROR",
        )
        LOG.engine("core.py:1584", "EngineCore failed to start.", level="ERROR")
        LOG.raw(f"torch.OutOfMemoryError: {oom}")
        LOG.raw(engine_fail.format("{'EngineCore_DP0': 1}"))
    elif kind == "host-oom":
        # The kernel's OOM killer takes the engine process (SIGKILL): vLLM sees exit code -9 and nothing else.
        LOG.raw(engine_fail.format("{'EngineCore_DP0': -9}"))
    elif kind == "clamp":
        LOG.engine("core.py:1584", "EngineCore failed to start.", level="ERROR")
        LOG.raw(
            "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 98304, Hardware limit: "
            "65536. Reducing block sizes or `num_stages` may help."
        )
        LOG.raw(engine_fail.format("{'EngineCore_DP0': 1}"))
    elif kind == "bf16":
        LOG.raw(
            "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 "
            "GPU has compute capability 7.5. You can use float16 instead by explicitly setting the `dtype` flag in "
            "CLI, for example: --dtype=half."
        )
    elif kind == "shm":
        LOG.raw("RuntimeError: unable to write to file </torch_1_2304578412_0>: No space left on device (28)")
        LOG.raw(engine_fail.format("{'EngineCore_DP0': 1}"))
    elif kind == "driver":
        LOG.raw(
            "RuntimeError: The NVIDIA driver on your system is too old (found version 12020). Please update your GPU "
            "driver by downloading and installing a new version from the URL: "
            "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a PyTorch "
            "version that has been compiled with your version of the CUDA driver."
        )
    elif kind == "gated":
        LOG.raw(
            f"huggingface_hub.errors.GatedRepoError: 401 Client Error.\n\nCannot access gated repo for url "
            f"https://huggingface.co/{opts.model}/resolve/main/config.json.\n"
            f"Access to model {opts.model} is restricted. You must have access to it and be authenticated to access "
            "it. Please log in."
        )
    sys.exit(1)


def compile_oom(opts: Options) -> None:
    """What vLLM 0.26.0 printed on the GPU host made a T4 in memory, cold compile cache, bf16: the engine core's
    torch.compile ran out of memory before the KV pool was allocated."""
    LOG.engine("monitor.py:41", "Starting torch.compile")
    LOG.engine("core.py:1584", "EngineCore failed to start.", level="ERROR")
    LOG.raw(
        "torch._inductor.exc.InductorError: OutOfMemoryError: CUDA out of memory. Tried to allocate 36.00 MiB. GPU 0 "
        "has a total capacity of 139.80 GiB of which 31.56 MiB is free."
    )
    LOG.raw("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
            "{'EngineCore_DP0': 1}")
    sys.exit(1)


def load(opts: Options, mode: str, stopping: threading.Event) -> None:
    """Walk through vLLM's loading phases with the port closed, printing each phase's real log line."""
    figures = figures_for(opts.model)
    default_load = 20.0 if mode == "slow-load" else 0.3
    seconds = env_float("T4SERVE_STANDIN_LOAD_SECONDS", default_load)
    LOG.engine("gpu_model_runner.py:4921", f"Starting to load model {opts.model}...")
    if mode == "crash-on-load":
        kind = os.environ.get("T4SERVE_STANDIN_CRASH_LOG", "cuda-oom")
        if kind not in CRASH_LOGS:
            fail(f"T4SERVE_STANDIN_CRASH_LOG={kind!r} is not one of {', '.join(CRASH_LOGS)}", "pick one of those")
        stopping.wait(seconds / 10)
        crash_on_load(opts, kind)
    if "qat" in opts.model.lower():
        LOG.engine("compressed_tensors_wNa16.py:112", "Using MarlinLinearKernel for CompressedTensorsWNA16")
    LOG.engine("cuda.py:509", "Using TRITON_ATTN attention backend out of potential backends: ['TRITON_ATTN'].")
    for line in (
        ("default_loader.py:507", f"Loading weights took {figures.weights_load_s:.2f} seconds"),
        (
            "gpu_model_runner.py:5089",
            f"Model loading took {round(figures.model_gib, 2)} GiB memory and {figures.model_load_s:.6f} seconds",
        ),
        ("monitor.py:41", "Starting torch.compile"),
        ("backends.py:1188", "Dynamo bytecode transform time: 14.62 s"),
        ("backends.py:418", "Compiling a graph for compile range (1, 2048) takes 38.27 s"),
        ("monitor.py:52", "torch.compile took 55.13 s in total"),
        ("gpu_worker.py:773", "Available KV cache memory: 2.83 GiB"),
        (
            "kv_cache_utils.py:1149",
            f"GPU KV cache size: {figures.kv_tokens:,} tokens, Maximum concurrency for "
            f"{opts.max_model_len:,} tokens per request: {figures.kv_tokens / opts.max_model_len:.2f}x",
        ),
        ("gpu_model_runner.py:6517", "Graph capturing finished in 12 secs, took 0.41 GiB"),
        ("core.py:396", "init engine (profile, create kv cache, warmup model) took 93.85 s (compilation: 55.13 s)"),
    ):
        if stopping.wait(seconds / 10):
            # SIGTERM during load: vLLM's process just ends; nothing is being served yet.
            LOG.api("launcher.py:257", "[shutdown] API server: shutdown triggered")
            sys.exit(0)
        if line[1] == "Starting torch.compile":
            needed = os.environ.get("T4SERVE_STANDIN_COMPILE_OOM_WITHOUT", "")
            if needed and needed not in sys.argv:
                compile_oom(opts)
        LOG.engine(*line)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "serve":
        exec_real_vllm(args)
    opts = parse_serve_args(args[1:])
    mode = os.environ.get("T4SERVE_STANDIN_MODE", "ok")
    if mode not in MODES:
        fail(f"T4SERVE_STANDIN_MODE={mode!r} is not one of {', '.join(MODES)}", "pick one of those modes")
    engine = Engine(opts, mode)
    signal.signal(signal.SIGTERM, lambda *_: engine.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: engine.stopping.set())

    log_startup(opts)
    load(opts, mode, engine.stopping)
    # vLLM builds its app (and imports --middleware) once the engine is up; an import failure ends the server.
    engine.middleware = load_middleware(opts.middleware)

    try:
        server = Server((opts.host, opts.port), engine)
    except OSError as exc:
        LOG.raw(
            f"OSError: [Errno {exc.errno}] error while attempting to bind on address ({opts.host!r}, {opts.port}): "
            f"{exc.strerror}"
        )
        return 1
    listen = f"http://{opts.host}:{server.server_address[1]}"
    LOG.api("api_server.py:1520", "Supported tasks: ['generate']")
    LOG.api("entry.py:139", f"Starting vLLM server on {listen}")
    LOG.api("launcher.py:188", "Available routes are:")
    for route, methods in (
        ("/health", "GET"),
        ("/metrics", "GET"),
        ("/ping", "GET, POST"),
        ("/invocations", "POST"),
        ("/v1/models", "GET"),
        ("/v1/chat/completions", "POST"),
        ("/v1/completions", "POST"),
    ):
        LOG.api("launcher.py:197", f"Route: {route}, Methods: {methods}")
    LOG.uvicorn(f"Started server process [{os.getpid()}]")
    LOG.uvicorn("Waiting for application startup.")
    LOG.uvicorn("Application startup complete.")

    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    serving.start()
    ready_at = time.monotonic()
    exit_code = run_until_stopped(engine, mode, ready_at)
    stop(server, engine, opts)
    return exit_code


def run_until_stopped(engine: Engine, mode: str, ready_at: float) -> int:
    """Wait for SIGTERM, or play the mode's failure; the exit code vLLM would end with."""
    if mode == "crash-after-ready":
        if engine.stopping.wait(env_float("T4SERVE_STANDIN_CRASH_AFTER", 1.0)):
            return 0
        engine.dead.set()
        engine.abort.set()
        LOG.engine("core.py:1586", "EngineCore encountered a fatal error.", level="ERROR")
        LOG.raw("torch.AcceleratorError: CUDA error: an illegal memory access was encountered")
        LOG.api("async_llm.py:712", "AsyncLLM output_handler failed.", level="ERROR")
        LOG.api(
            "async_llm.py:712",
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.",
            level="ERROR",
        )
        engine.stopping.wait(env_float("T4SERVE_STANDIN_DEAD_LINGER", 1.0))
        return 1
    hang_at = ready_at + env_float("T4SERVE_STANDIN_HANG_AFTER", 0.0)
    if mode == "hang" and not engine.stopping.wait(max(0.0, hang_at - time.monotonic())):
        engine.hung.set()
    engine.stopping.wait()
    return 0


def stop(server: Server, engine: Engine, opts: Options) -> None:
    """vLLM's SIGTERM path: stop accepting, drain (--shutdown-timeout > 0) or abort in-flight requests, exit."""
    timeout = opts.shutdown_timeout
    mode = "abort" if timeout == 0 else "drain"
    LOG.api("launcher.py:257", "[shutdown] API server: shutdown triggered")
    LOG.api("launcher.py:270", f"[shutdown] API server: stopping engine client mode={mode} timeout={timeout}s")
    server.shutdown()  # no new connections are accepted from here on
    server.socket.close()
    LOG.engine("core.py:1711", f"[shutdown] EngineCore: start mode={mode} timeout={timeout}s")
    with engine.lock:
        count = engine.running + engine.waiting
    if count and timeout == 0:
        LOG.engine("core.py:1721", f"[shutdown] EngineCore: aborting in-flight requests count={count}")
        engine.abort.set()
    elif count:
        LOG.engine(
            "core.py:1731", f"[shutdown] EngineCore: draining in-flight requests count={count} timeout={timeout}s"
        )
    deadline = time.monotonic() + timeout
    while engine.in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    engine.abort.set()
    end = time.monotonic() + 2.0
    while engine.in_flight and time.monotonic() < end:
        time.sleep(0.02)  # let aborted streams send their last event
    LOG.engine("core.py:1743", "[shutdown] EngineCore: request processing complete; starting resource teardown")
    LOG.api("launcher.py:276", "[shutdown] API server: engine client stopped")
    LOG.api("launcher.py:279", "[shutdown] API server: signalling HTTP server shutdown")
    LOG.uvicorn("Shutting down")
    LOG.uvicorn("Waiting for application shutdown.")
    LOG.uvicorn("Application shutdown complete.")
    LOG.uvicorn(f"Finished server process [{os.getpid()}]")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (for tests that start the stand-in)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
