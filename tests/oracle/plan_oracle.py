"""t4serve's plan against vLLM 0.34's own planner, for any checkpoint on any GPU of the known table, without a GPU.

For each case (a checkpoint directory, a known GPU, t4serve settings) this runs, in the image:
1. t4serve's own plan: `t4serve.planning.plan.plan` on the checkpoint probed as `serve` probes it (vLLM's config reader
   included) and the GPU from the known table, giving the `vllm serve` argv, the KV figures and any refusal;
2. vLLM on that argv: vLLM's own `vllm serve` parser reads the plan's argv, `EngineArgs.create_engine_config` builds
   the engine config for `vllm serve` (it refuses what vLLM refuses: max_num_seqs above the batched tokens, a length
   above the model's, too few batched tokens without chunked prefill), the real model classes are built on the meta
   device (with a Gemma 4 drafter the argv names, wired to the target's KV cache as vLLM's Gemma 4 speculator wires
   it), the GPU model runner's `get_kv_cache_spec` gives the per-layer specs, and the planner
   (`get_kv_cache_configs`, `update_kv_cache_capacity`) turns the plan's `--kv-cache-memory-bytes` and other pools
   into blocks, tokens and concurrency, or refuses naming the largest length that fits;
3. t4serve's own KV figures for the other pools (`t4serve.planning.kvcache`, from the plan's inputs);
4. per checkpoint, the text config t4serve probed (its table of transformers' defaults, t4serve.probes.configdefaults)
   beside what vLLM's own `get_config` reads from the same config.json, each as the sizing reads it.
It states no expected figure: tests/image/test_kv_oracle_families.py compares the three.

What the oracle supplies itself is kv_oracle.py's: the stand-in CUDA platform (now describing each case's GPU: name,
capability, memory), the kernel stubs (FlashAttention's version checks answering per the image's files and the
capability), placeholders for kernels looked up while the model is built; and one more (stub 5): the device vLLM's
Transformers backend materialises its meta parameters on is the meta device, not CUDA (`DeviceConfig.device`; the
KV specs do not read it). `--load-format dummy` is added to the argv: no weights are read.

Also (mode `batch_defaults`): vLLM's `EngineArgs.get_batch_defaults` on each GPU described, beside t4serve's.

    python tests/oracle/plan_oracle.py CASES.json          # JSON on stdout; CASES.json as tests/image writes it
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kv_oracle


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}"[:2000]


def vllm_figures(argv: list[str], pools: list[int]) -> dict[str, Any]:
    """vLLM's engine config for `argv` (as `vllm serve` parses it) and its planner's answer for each pool."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.config.vllm import get_layers_from_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups

    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args([*argv, "--load-format", "dummy"])
    args.model = args.model_tag
    engine_args = AsyncEngineArgs.from_cli_args(args)
    try:
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except (ValueError, TypeError) as exc:  # vLLM's refusals (pydantic's ValidationError is a ValueError)
        return {"refused": first_line(exc)}
    config.device_config.device = torch.device("meta")  # stub 5: the Transformers backend's parameters stay on meta
    with set_current_vllm_config(config):
        if not model_parallel_is_initialized():
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{kv_oracle.free_port()}")
            ensure_model_parallel_initialized(1, 1, backend="gloo")
        try:
            with (kv_oracle.kernel_placeholders(), set_default_torch_dtype(config.model_config.dtype),
                  torch.device("meta")):
                initialize_model(vllm_config=config)
            draft_layers = kv_oracle.build_drafter(config)
        except ValueError as exc:  # the attention backends' own refusals (an FP8 KV cache below capability 8.9)
            return {"refused": first_line(exc)}
        layer_specs, shared, layout = kv_oracle.model_kv_specs(config)
        backends = sorted({layer.get_attn_backend().get_name()
                           for layer in get_layers_from_vllm_config(config, AttentionLayerBase).values()})
        kv_cache_specs = [layer_specs]
        global_groups = get_global_kv_cache_groups(config, kv_cache_specs)
        config.adjust_dcp_kv_cache_interleave_size(global_groups)
        results = kv_oracle.plan_pools(config, kv_cache_specs, global_groups, pools)
    return {
        "dtype": str(config.model_config.dtype).removeprefix("torch."),
        "max_model_len": config.model_config.max_model_len,
        "block_size": config.cache_config.block_size,
        "attention_backends": backends,
        "kv_cache_layout": layout.name,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "async_scheduling": bool(config.scheduler_config.async_scheduling),
        "chunked_prefill": bool(config.scheduler_config.enable_chunked_prefill),
        "hybrid_kv_cache_manager": not config.scheduler_config.disable_hybrid_kv_cache_manager,
        "max_in_flight_tokens": config.max_in_flight_tokens,
        "layer_spec_types": sorted({type(s).__name__ for s in layer_specs.values()}),
        "extensible_kv_cache": bool(config.cache_config.enable_extensible_kv_cache),
        "speculative_method": config.speculative_config.method if config.speculative_config else None,
        "num_speculative_tokens": config.num_speculative_tokens,
        "drafter_layers": len(draft_layers),
        "drafter_layers_owning_kv": sorted(name for name in draft_layers if name in layer_specs),
        "drafter_shares_kv_with": sorted({shared[name] for name in draft_layers if name in shared}),
        "pools": results,
    }


def t4serve_case(case: dict[str, Any], models: dict[str, Any], base: Any) -> tuple[dict[str, Any], Any]:
    """t4serve's plan for the case (settings from its environment, the known GPU, the probed checkpoint)."""
    import dataclasses

    from t4serve.config.settings import Settings
    from t4serve.errors import T4ServeError
    from t4serve.pipeline import with_known_gpu
    from t4serve.planning.plan import plan
    from t4serve.probes.checkpoint import probe_model
    from t4serve.probes.drafter import probe_drafter

    env = {"HF_HOME": tempfile.gettempdir(), "T4SERVE_MODEL": case["model"], **case.get("env", {})}
    try:
        settings = Settings.from_environ(env)
    except T4ServeError as exc:
        return {"settings_error": exc.message()}, None
    if case["model"] not in models:
        models[case["model"]] = probe_model(settings.model.target, hf_home=settings.hf_home, offline=True)
    # The drafter T4SERVE_SPECULATIVE=mtp names, probed as `serve` probes it (t4serve.probes.drafter).
    drafter = probe_drafter(dataclasses.replace(settings, hf_hub_offline=True), models[case["model"]])
    facts = dataclasses.replace(with_known_gpu(base, case["gpu"]), model=models[case["model"]], drafter=drafter,
                                vllm_env=case.get("vllm_env", {}))
    the_plan = plan(settings, facts)
    sizing = the_plan.sizing
    out: dict[str, Any] = {
        "argv": list(the_plan.argv),
        "dtype": the_plan.dtype,
        "sizing_error": the_plan.sizing_error,
        "config_read_by": facts.model.config.get("config_read_by"),
        "speculative": the_plan.speculative,
    }
    if sizing is not None:
        out.update(
            max_model_len=int(sizing.max_model_len.value),
            max_num_seqs=int(sizing.max_num_seqs.value),
            max_num_batched_tokens=int(sizing.max_num_batched_tokens.value),
            kv_cache_memory_bytes=int(sizing.kv_cache_memory_bytes.value) if sizing.kv_cache_memory_bytes else None,
            kv_tokens=int(sizing.kv_tokens.value),
            concurrency=float(sizing.concurrency.value),
            block_size=sizing.block_size,
            gpu_weights_bytes=int(sizing.gpu_weights_bytes.value),
        )
    return out, (settings, facts, the_plan)


def t4serve_pools(settings: Any, facts: Any, the_plan: Any) -> tuple[list[int], dict[int, dict[str, Any]]]:
    """The pools to ask vLLM about beside the plan's own (the smallest that fits, one byte less, a third of it) and
    t4serve's KV figures for each, from the plan's own inputs (t4serve.planning.kvcache)."""
    from t4serve.config.kvflags import kv_flags
    from t4serve.planning import kvcache
    from t4serve.planning.plan import DTYPE_BYTES
    from t4serve.planning.sizing import text_config

    sizing = the_plan.sizing
    flags = kv_flags(settings.vllm_args)
    text = text_config(facts.model)
    length = int(sizing.max_model_len.value)

    def layout(at: int) -> kvcache.KVLayout:
        batched = int(sizing.max_num_batched_tokens.value)
        return kvcache.kv_layout(text, dtype_bytes=DTYPE_BYTES[the_plan.dtype], max_model_len=at,
                                 max_num_batched_tokens=batched, async_scheduling=flags.async_scheduling,
                                 block_size=sizing.block_size, hybrid_kv_cache_manager=flags.hybrid_kv_cache_manager,
                                 cache_dtype=the_plan.kv_cache_dtype)

    lay = layout(length)
    least = kvcache.min_pool_bytes(lay)
    pools = sorted({p for p in (least, least - 1, least // 3, int(sizing.kv_pool_bytes.value)) if p > 0})
    figures = {}
    for pool in pools:
        if kvcache.fits(lay, pool):
            cap = kvcache.capacity(lay, pool)
            figures[pool] = {"fits": True, "num_blocks": cap.num_blocks, "bytes_per_block": lay.bytes_per_block,
                             "kv_cache_size_tokens": cap.tokens, "max_concurrency": cap.concurrency,
                             "blocks_per_request_by_group": list(lay.blocks_per_request_by_group)}
        else:
            figures[pool] = {"fits": False, "largest_length": kvcache.fit_max_model_len(layout, pool, length)}
    return pools, figures


def sizing_view(text: dict[str, Any]) -> dict[str, Any]:
    """What t4serve's sizing reads of a text config, as it reads it: the KV specs (layer, heads, head size, window),
    vLLM's derived maximum length and the fields of the weight and activation estimates."""
    from t4serve.errors import T4ServeError
    from t4serve.planning import kvcache
    from t4serve.planning.sizing import derived_max_model_len

    try:
        specs: Any = [[s.layer, s.num_kv_heads, s.head_size, s.sliding_window] for s in kvcache.kv_cache_specs(text, 2)]
    except T4ServeError as exc:
        specs = f"refused: {exc.message().splitlines()[0]}"
    fields = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
              "hidden_size_per_layer_input", "use_double_wide_mlp")
    return {"specs": specs, "max_model_len": derived_max_model_len(text)[0],
            **{f: text.get(f) for f in fields}}


def config_readings(model_dir: str, facts: Any) -> dict[str, Any]:
    """The text config t4serve probed beside the one vLLM's own reader (`get_config`, as t4serve.probes.hfconfig runs
    it) gives for the same config.json, each as the sizing reads it."""
    from t4serve.probes import hfconfig
    from t4serve.probes.checkpoint import planning_config, without_unset

    raw = planning_config(json.loads((Path(model_dir) / "config.json").read_text()))
    read = hfconfig._read(model_dir)
    vllm_text = without_unset({**raw["text"], **read["text"]})
    return {"vllm_read_by": read["by"], "t4serve_read_by": facts.config.get("config_read_by"),
            "vllm": sizing_view(vllm_text), "t4serve": sizing_view(facts.config["text"])}


def batch_defaults(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    from t4serve.gpus import vllm_batch_defaults

    out = []
    for gpu in gpus:
        kv_oracle.install_platform(gpu["name"], tuple(gpu["capability"]), gpu["memory_bytes"])
        batched, seqs = EngineArgs.get_batch_defaults(world_size=1)
        ours = vllm_batch_defaults(gpu["memory_bytes"], gpu["name"], tuple(gpu["capability"]))
        out.append({"key": gpu["key"],
                    "vllm": [batched[UsageContext.OPENAI_API_SERVER], seqs[UsageContext.OPENAI_API_SERVER]],
                    "t4serve": [ours.max_num_batched_tokens, ours.max_num_seqs]})
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text())
    out = sys.stdout
    sys.stdout = sys.stderr  # anything vLLM prints stays off the JSON
    kv_oracle.stub_cuda_extensions()
    kv_oracle.install_t4_platform()
    kv_oracle.answer_capability_probes()
    import vllm

    from t4serve.facts import Facts
    from t4serve.gpus import known_gpu

    base = Facts.from_json((Path(__import__("t4serve").__file__).parent / "data" / "facts" / "no-gpu.json")
                           .read_text())
    models: dict[str, Any] = {}
    results = []
    for case in spec.get("cases", []):
        entry: dict[str, Any] = {"id": case["id"]}
        try:
            plan_out, context = t4serve_case(case, models, base)
            entry["t4serve"] = plan_out
            if context is not None:
                settings, facts, the_plan = context
                pools: list[int] = []
                if the_plan.sizing is not None:
                    pools, figures = t4serve_pools(settings, facts, the_plan)
                    entry["t4serve"]["pools"] = {str(p): f for p, f in figures.items()}
                elif "--kv-cache-memory-bytes" in the_plan.argv:
                    # A refused plan still names the pool the user set: vLLM is asked about it too.
                    pools.append(int(the_plan.argv[the_plan.argv.index("--kv-cache-memory-bytes") + 1]))
                pools += [int(p) for p in case.get("pools", [])]
                gpu = known_gpu(case["gpu"])
                assert gpu is not None
                kv_oracle.install_platform(gpu.name, gpu.compute_capability, gpu.memory_bytes)
                entry["vllm"] = vllm_figures(the_plan.argv[2:], sorted(set(pools)))
        except Exception as exc:  # reported per case, so one broken case names itself and the rest still run
            entry["error"] = first_line(exc)
            entry["traceback"] = traceback.format_exc()[-4000:]
        results.append(entry)
        print(f"plan_oracle: {case['id']} done", file=sys.stderr, flush=True)
    readings = {}
    for name, facts in models.items():
        try:
            readings[name] = config_readings(name, facts) if facts.source != "invalid" else {"error": facts.error}
        except Exception as exc:  # reported per model, as the cases are
            readings[name] = {"error": first_line(exc)}
    json.dump({"vllm_version": vllm.__version__, "cases": results, "configs": readings,
               "batch_defaults": batch_defaults(spec.get("batch_defaults", []))}, out, indent=1)
    out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
