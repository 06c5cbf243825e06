"""diagnose: each known cause named from the text vLLM, torch, Triton or the hub print (the stand-in replays it)."""

from __future__ import annotations

import signal

import pytest

from t4serve.supervise.diagnose import diagnose

ENGINE_FAIL = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"

CASES = {
    "clamp_missing": [
        "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 98304, Hardware limit: "
        "65536. Reducing block sizes or `num_stages` may help.",
        ENGINE_FAIL.format("{'EngineCore_DP0': 1}"),
    ],
    "bf16_on_turing": [
        "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 GPU "
        "has compute capability 7.5. You can use float16 instead by explicitly setting the `dtype` flag in CLI",
    ],
    "driver_too_old": ["RuntimeError: The NVIDIA driver on your system is too old (found version 12020)."],
    "gated_model_no_token": [
        "huggingface_hub.errors.GatedRepoError: 401 Client Error.",
        "Cannot access gated repo for url https://huggingface.co/google/gemma-4-E2B-it/resolve/main/config.json.",
    ],
    "cuda_oom": [
        "(EngineCore_DP0 pid=9) ERROR 12-01 10:00:00 [gpu_model_runner.py:5086] Failed to load model - not enough GPU "
        "memory. Try lowering --gpu-memory-utilization",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.",
    ],
    "kv_pool_empty": [
        "(EngineCore_DP0 pid=9) INFO [gpu_worker.py:440] Available KV cache memory: -0.22 GiB",
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine",
    ],
    "shm_too_small": ["RuntimeError: unable to write to file </torch_1_2304578412_0>: No space left on device (28)"],
}


@pytest.mark.parametrize("name", CASES)
def test_known_causes(name: str) -> None:
    result = diagnose(["(APIServer pid=1) INFO starting", *CASES[name]], 1, "loading_weights")
    assert result is not None and result.name == name
    assert result.fix and result.summary
    assert result.evidence in [ln.strip() for ln in CASES[name]]
    assert result.one_line().startswith("diagnosis: ")


def test_host_oom_from_engine_exit_minus_nine_during_load() -> None:
    # The kernel's OOM killer SIGKILLs the engine core: vLLM reports only its exit code -9.
    result = diagnose([ENGINE_FAIL.format("{'EngineCore_DP0': -9}")], 1, "loading_weights")
    assert result is not None and result.name == "host_oom_during_load"
    assert "setup-swap" in result.fix


def test_host_oom_from_sigkill_of_vllm_itself() -> None:
    result = diagnose([], -signal.SIGKILL, "downloading")
    assert result is not None and result.name == "host_oom_during_load"


def test_sigkill_after_load_is_not_called_host_oom() -> None:
    assert diagnose([], -signal.SIGKILL, "compiling") is None


def test_unknown_death_has_no_diagnosis() -> None:
    lines = ["torch.AcceleratorError: CUDA error: an illegal memory access was encountered"]
    assert diagnose(lines, 1, "ready") is None


def test_an_out_of_memory_inside_torch_compile_is_named_before_a_plain_one() -> None:
    """vLLM 0.26 at a T4's memory with a cold compile cache (the GPU host): Inductor's wrapped OutOfMemoryError."""
    lines = [
        "(EngineCore_DP0 pid=7) INFO [monitor.py:41] Starting torch.compile",
        "torch._inductor.exc.InductorError: OutOfMemoryError: CUDA out of memory. Tried to allocate 36.00 MiB. "
        "GPU 0 has a total capacity of 139.80 GiB of which 31.56 MiB is free.",
    ]
    found = diagnose(lines, 1, "profiling")
    assert found is not None and found.name == "compile_oom"
    assert "inside torch.compile" in found.summary and "T4SERVE_COMPILE" in found.fix
    plain = diagnose(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB."], 1, "profiling")
    assert plain is not None and plain.name == "cuda_oom"


def test_memory_held_by_other_processes_names_them() -> None:
    """vLLM 0.26 on the GPU host when earlier engine cores still held the card."""
    line = ("ValueError: Free memory on device cuda:0 (0.26/139.8 GiB) on startup is less than desired GPU memory "
            "utilization (0.096152, 13.44 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
            "processes.")
    found = diagnose([line], 1, "starting")
    assert found is not None and found.name == "gpu_memory_taken" and "nvidia-smi" in found.fix


def test_the_cause_is_found_above_a_long_traceback() -> None:
    """The error that names the cause can stand 60+ lines above the end of vLLM's output."""
    lines = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.38 GiB."]
    lines += [f"(APIServer pid=1)   File \"x.py\", line {i}, in f" for i in range(70)]
    found = diagnose(lines, 1, "profiling")
    assert found is not None and found.name == "cuda_oom"


def test_the_removed_module_list_is_slim_json_s() -> None:
    import json
    from pathlib import Path

    from t4serve.supervise.diagnose import REMOVED_FROM_IMAGE

    slim = json.loads((Path(__file__).resolve().parents[2] / "docker" / "slim.json").read_text())
    # What the build removes and what the lock never installs (excluded_from_lock): the image has neither.
    entries = [*slim["distributions"], *slim["excluded_from_lock"]]
    modules = {m for d in entries for m in d.get("modules", [])}
    assert set(REMOVED_FROM_IMAGE) == modules


@pytest.mark.parametrize(
    "line",
    [
        "ModuleNotFoundError: No module named 'flashinfer'",
        "(EngineCore pid=12) ModuleNotFoundError: No module named 'numba.core'",
        "ImportError: No module named 'fastsafetensors'",
    ],
)
def test_a_package_the_image_left_out_is_named_with_what_asked_for_it(line: str) -> None:
    found = diagnose(["Traceback (most recent call last):", line], 1, "loading_weights")
    assert found is not None and found.name == "removed_from_image"
    assert "VLLM_USE_FLASHINFER_SAMPLER=1" in found.fix and found.evidence == line


def test_another_missing_module_is_not_blamed_on_the_slimming() -> None:
    found = diagnose(["ModuleNotFoundError: No module named 'flashinfer_extra_thing_x'"], 1, "starting")
    assert found is None or found.name != "removed_from_image"
