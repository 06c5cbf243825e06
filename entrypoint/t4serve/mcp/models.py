"""The results of `t4serve mcp`'s tools: pydantic models, so the SDK publishes an output schema and structured content.

One model per tool result (a few shared parts: a finding, a GPU, a figure, a benchmark cell); `finding_out` and
`checks_fields` turn preflight's and the host checks' findings into them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from t4serve.preflight import Finding, has_failures

# A query's prompt or one chat message, at most (the query tool's own limit).
MAX_PROMPT_CHARS = 32_000


class FindingOut(BaseModel):
    """One check: level ok / warn / fail, what was found, what is required, and the fix (empty when ok)."""

    check: str
    level: Literal["ok", "warn", "fail"]
    found: str
    required: str
    fix: str


class Checks(BaseModel):
    ok: bool = Field(description="no check failed")
    failed: int
    warnings: int
    findings: list[FindingOut]


class HostCapacity(Checks):
    compose_file: str
    image: str


class GpuOut(BaseModel):
    index: int
    name: str
    compute_capability: str
    memory_total_bytes: int


class GpuArch(Checks):
    driver_version: str | None
    cuda_driver_version: str | None
    gpus: list[GpuOut]
    image: str
    torch_version: str | None
    torch_cuda_version: str | None
    torch_arch_list: list[str]


class ClampOut(BaseModel):
    state: str
    vllm_version: str
    shared_memory: dict[str, int]
    unpatched_shared_memory: int | None
    interpreter_max_abs_error: float | None


class TuringPatch(BaseModel):
    ok: bool = Field(description="the proof in the manifest holds and `t4serve patch verify` passed in the image")
    image: str
    clamp: ClampOut | None
    verify_exit_code: int
    verify_output: str = Field(description="the last lines of `t4serve patch verify`")
    findings: list[FindingOut]


class ManifestOut(BaseModel):
    image: str
    image_id: str
    size_bytes: int
    build_exit_code: int
    build_output: str = Field(description="the last lines of scripts/build-image")
    manifest: dict[str, Any]


class PlanOut(BaseModel):
    command_line: str
    summary: str
    plan: dict[str, Any]
    settings: dict[str, Any]
    findings: list[FindingOut]


class StartOut(BaseModel):
    container: str
    container_state: str
    model: str = Field(description="the checkpoint: a repo id, or the folder on this host")
    model_in_container: str = Field(description="what the container serves (a host folder: where it is mounted)")
    api_url: str | None
    poll: str = Field(description="what to call to follow the start")
    state_written: bool = Field(description="t4serve in the container has written its state (it is under way)")
    phase: str | None
    note: str


class FigureOut(BaseModel):
    name: str
    logged: float | None
    predicted: float | None
    unit: str
    deviation: float | None = Field(description="(logged - predicted) / predicted")
    how: str


class StatusOut(BaseModel):
    running: bool
    ready: bool
    container: str | None
    container_state: str | None
    health: str | None
    exit_code: int | None
    phase: str | None
    phase_label: str | None
    phase_seconds: float | None
    model: str | None
    served_model_name: str | None
    api_port: int | None = Field(description="the API's port inside the container")
    api_url: str | None = Field(description="the API as this host reaches it (its published port)")
    estimate_to_ready_s: float | None
    figures: list[FigureOut]
    canary_ok: bool | None
    reason: str | None
    diagnosis: str | None
    fix: str | None
    text: str


class LogsOut(BaseModel):
    container: str
    lines: list[str]
    truncated: bool = Field(description="older lines were dropped to stay within the byte cap")
    bytes: int


class StopOut(BaseModel):
    stopped: bool
    container: str | None
    was_state: str | None
    note: str


class QueryOut(BaseModel):
    text: str
    finish_reason: str | None
    latency_s: float
    prompt_tokens: int | None
    completion_tokens: int | None
    model: str


class BenchStart(BaseModel):
    run_id: str
    container: str
    output_dir: str
    poll: str


class BenchCell(BaseModel):
    """One cell of the sweep (model, input length, concurrency) over its repeats, as report.md tabulates it."""

    model: str
    input_len: int = Field(description="prompt tokens")
    concurrency: int = Field(description="concurrent streams")
    repeats_ok: int
    repeats_failed: int
    completed_requests: int
    failed_requests: int
    throughput_tok_s: float | None = Field(description="generated tokens per second, all streams (median of repeats)")
    per_stream_tok_s: float | None = Field(description="1000 / median time per output token")
    ttft_ms: float | None = Field(description="median time to first token")
    variation_pct: float | None = Field(description="(max - min) / median throughput over repeats")
    errors: list[str]


class BenchStatus(BaseModel):
    run_id: str
    state: Literal["running", "done", "failed"]
    exit_code: int | None
    runs_done: int = Field(description="runs finished so far (the sweep's runs.json, rewritten after every run)")
    runs_planned: int | None = Field(description="runs the sweep will make (None until it has written runs.json)")
    log_tail: str
    report_md: str | None
    cells: list[BenchCell] = Field(description="the report's figures, once the benchmark has ended")
    host_folder: str | None = Field(description="the result folder copied to this host when done")
    plots: list[str]


class ChatMessage(BaseModel):
    # A key of another name is refused, as the tools' own arguments are (its schema says additionalProperties false).
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_PROMPT_CHARS)


def finding_out(f: Finding) -> FindingOut:
    return FindingOut(check=f.check, level=f.level, found=f.found, required=f.required, fix=f.fix)  # type: ignore[arg-type]


def checks_fields(findings: Sequence[Finding]) -> dict[str, Any]:
    return {
        "ok": not has_failures(findings),
        "failed": sum(f.level == "fail" for f in findings),
        "warnings": sum(f.level == "warn" for f in findings),
        "findings": [finding_out(f) for f in findings],
    }


class ProfilesOut(BaseModel):
    gpu: str = Field(description="the GPU the profiles are for (this host's, or the known GPU model asked)")
    summary: str = Field(description="the table `t4serve profiles` prints, with the reasons for what cannot run")
    profiles: list[dict[str, Any]] = Field(
        description="per checkpoint x KV cache dtype x max model length: runnable, reason, kv_tokens, concurrency, "
        "max_num_seqs, gpu_weights_bytes, host_memory_need_bytes, swap_to_add_bytes, decode_ceiling_tokens_per_s, "
        "command_line, attention (the path T4SERVE_ATTENTION resolved to, and why) (the plan's own figures)")
