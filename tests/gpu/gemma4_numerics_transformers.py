"""The GPU host's KV numerics rehearsed on the CPU with a real Gemma 4 decoder: transformers' Gemma4ForCausalLM (the
image's transformers) at E2B's layout with narrower matrices, filled by tests/gpu/kv_quant_host.py's `init_rule`, and
measured with the same `compare` the GPU host uses on vLLM's prompt_logprobs. Runs where transformers and torch are
installed (the image; vLLM too, for the int8 check):

    docker run --rm -e CUDA_VISIBLE_DEVICES= -v "$PWD/tests:/t:ro" --entrypoint python t4serve:dev \\
        /t/gpu/gemma4_numerics_transformers.py [--hidden 512] [--lengths 64,600] [--prompts 2] [--json]

The model: E2B's 35 layers (sliding head 256 with a 512-token window, full attention head 512 at layers 4, 9, ...,
34), 8 query heads and 1 KV head, the last 20 layers reading the KV of earlier ones, per-layer inputs, layer scalars,
q/k/v norms, attention scale 1.0, logit soft-capping; the hidden size, MLP and vocabulary narrower (`--hidden`, 4 x
hidden, `--vocab`) so that it runs on two cores.

Per weights rule (`first-hold`: the rule the first GPU hold's checkpoint was written with; `init_rule`: the rule it is
written with now; `layers-x3`: init_rule with the norms after each block at 3) it runs the prompts through:
- `16-bit`: float16, transformers' eager attention: the reference, as the 16-bit cache's server;
- `16-bit, other kernel`: float16, PyTorch's SDPA attention: the control, another 16-bit computation of the same
  model (the GPU host's second 16-bit server);
- `int8 KV`: float16, eager attention over keys and values rounded as vLLM 0.33's int8 per-token-head cache stores
  them (the formula of `_reshape_cache_per_token_head`, checked here against vLLM's own kernel under
  TRITON_INTERPRET=1, bit for bit) and dequantized (data x scale);
- `float32`: for scale.
and prints each against the reference with `kv_quant_host.compare` (top-1 agreement over every prompt position, the
largest log-probability difference on the reference's top-1 token, the largest and mean over its top TOP_K), the
logits' spread and how often the reference's top-1 repeats the input token. A rehearsal on the CPU, not the GPU's
result: CPU rounding, transformers' code, not vLLM's kernels. Its output is in docs/verified/numerics-transformers/.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "unit")]

import kv_quant_host as kq  # noqa: E402 (this directory and tests/unit, put on sys.path above)
from e2b_checkpoint import E2B_CONFIG  # noqa: E402

SEED = 20261204


def first_hold_rule(name: str, shape: list[int]) -> tuple[float, float]:
    """The rule the first GPU hold's checkpoint was written with (kv_quant_host before f3db6dd)."""
    if "norm" in name:
        return 1.0, 0.02
    if len(shape) == 2 and "embed" not in name:
        return 0.0, 1.0 / max(shape[-1], 1) ** 0.5
    return 0.0, 0.02


RULES = {"first-hold": first_hold_rule, "init_rule": kq.init_rule, "layers-x3": kq.layers_x3_rule}


def text_config(hidden: int, vocab: int) -> Any:
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig

    text = {k: v for k, v in E2B_CONFIG["text_config"].items() if k not in ("model_type", "torch_dtype")}
    text |= {
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    }
    return Gemma4TextConfig(**text)


def fill(model: Any, rule: Any, seed: int) -> int:
    """Every parameter (a tied one once) and every layer scalar, by `rule`, from one seeded generator."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    named = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if n.endswith("layer_scalar")]
    with torch.no_grad():
        for name, tensor in named:
            mean, std = rule(name, list(tensor.shape))
            values = torch.randn(tensor.shape, generator=generator, dtype=torch.float32) * std + mean
            tensor.copy_(values.to(tensor.dtype))
    return len(named)


def int8_per_token_head(x: Any) -> Any:
    """x [..., head] rounded as vLLM 0.33's `_reshape_cache_per_token_head` stores it for an int8 cache: scale =
    max(absmax / 127, 1e-6), x / scale rounded half away from zero, clamped to [-128, 127], truncated to int8; returns
    (int8 data, float32 scale, data x scale in x's dtype). vLLM's attention kernel casts the data to the query's dtype
    and applies the scale after its float32 dot product; rounding data x scale to float16 first, as here, differs from
    that by float16's rounding (2^-11 relative), a tenth of int8's step at worst."""
    import torch

    x32 = x.float()
    scale = torch.clamp(x32.abs().amax(-1, keepdim=True) / 127.0, min=1e-6)
    q = x32 * (1.0 / scale)
    q = torch.where(q >= 0, q + 0.5, q - 0.5).clamp(-128.0, 127.0)
    data = q.to(torch.int8)  # truncation toward zero, as the kernel's store
    return data, scale.squeeze(-1), (data.float() * scale).to(x.dtype)


INT8_ATTENTION = "t4serve_int8_kv"


def register_int8_attention() -> str:
    """transformers' eager attention over keys and values rounded by `int8_per_token_head`, registered under
    INT8_ATTENTION for `set_attn_implementation`. Every layer reads keys and values from the cache, so the KV-shared
    layers read rounded ones too."""
    from transformers import AttentionInterface
    from transformers.models.gemma4.modeling_gemma4 import eager_attention_forward

    def int8_kv_attention(module: Any, query: Any, key: Any, value: Any, mask: Any, **kwargs: Any) -> Any:
        return eager_attention_forward(
            module, query, int8_per_token_head(key)[2], int8_per_token_head(value)[2], mask, **kwargs
        )

    AttentionInterface.register(INT8_ATTENTION, int8_kv_attention)
    return INT8_ATTENTION


def top_logprobs(logits: Any) -> list[dict[int, float]]:
    """One prompt's logits [positions, vocab] as vLLM's `prompt_logprobs` reach `kv_quant_host.compare`: the top TOP_K
    {token: logprob} of each position's next token, the last position (no prompt token after it) left out."""
    import torch

    top = torch.log_softmax(logits[:-1].float(), -1).topk(kq.TOP_K, dim=-1)
    return [dict(zip(i, v, strict=True)) for i, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)]


def check_against_vllm(torch: Any) -> dict[str, Any]:
    """The formula above against vLLM's own int8 write kernel (interpreted on the CPU), on random fp16 keys and values
    of E2B's two head sizes: data and scales equal bit for bit, or this tool stops. Needs TRITON_INTERPRET=1 set
    before Triton is first imported (main does)."""
    from vllm.v1.attention.ops.triton_reshape_and_cache_flash import (
        triton_reshape_and_cache_flash_per_token_head_quant as write,
    )
    from vllm.v1.kv_cache_interface import KVQuantMode

    checked = {}
    for head in (256, 512):
        generator = torch.Generator().manual_seed(head)
        tokens, block = 48, 16
        k = (torch.randn((tokens, 1, head), generator=generator) * 3).to(torch.float16)
        v = (torch.randn((tokens, 1, head), generator=generator) * 0.5).to(torch.float16)
        caches = [torch.zeros((tokens // block, block, 1, head), dtype=torch.int8) for _ in range(2)]
        scales = [torch.zeros((tokens // block, block, 1), dtype=torch.float32) for _ in range(2)]
        write(
            k,
            v,
            caches[0],
            caches[1],
            scales[0],
            scales[1],
            torch.arange(tokens),
            kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD,
        )
        for x, cache, scale in ((k, caches[0], scales[0]), (v, caches[1], scales[1])):
            data, mine, _ = int8_per_token_head(x)
            if not (torch.equal(data, cache.reshape(tokens, 1, head)) and torch.equal(mine, scale.reshape(tokens, 1))):
                raise SystemExit(f"int8 formula differs from vLLM's kernel at head {head}")
        checked[head] = tokens * 2
    return {"vllm_kernel_equal": True, "rows_checked": checked}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--lengths", default="64,600", help="prompt lengths (600 passes the 512-token window)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per length")
    parser.add_argument("--rules", default="first-hold,init_rule,layers-x3")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    os.environ["TRITON_INTERPRET"] = "1"  # before torch or transformers import Triton: vLLM's kernel runs on the CPU
    import torch
    from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM

    torch.manual_seed(args.seed)
    vllm_check = check_against_vllm(torch)
    int8_attention = register_int8_attention()
    rng = random.Random(args.seed)
    lengths = [int(n) for n in args.lengths.split(",")]
    prompts = [[rng.randrange(3, args.vocab) for _ in range(n)] for n in lengths for _ in range(args.prompts)]
    runs = {
        "16-bit, other kernel": (torch.float16, "sdpa"),
        "int8 KV": (torch.float16, int8_attention),
        "float32": (torch.float32, "eager"),
    }

    def logprobs(model: Any, dtype: Any, attention: str) -> tuple[list[list[dict[int, float]]], float]:
        model.to(dtype)
        model.set_attn_implementation(attention)
        out, spread = [], []
        with torch.no_grad():
            for prompt in prompts:
                logits = model(torch.tensor([prompt])).logits[0].float()
                spread.append(float(logits.std()))
                out.append(top_logprobs(logits))
        return out, sum(spread) / len(spread)

    config = text_config(args.hidden, args.vocab)
    result: dict[str, Any] = {
        "int8_formula": vllm_check,
        "hidden": args.hidden,
        "vocab": args.vocab,
        "layers": config.num_hidden_layers,
        "lengths": lengths,
        "prompts": len(prompts),
        "rules": {},
    }
    for rule_name in args.rules.split(","):
        started = time.monotonic()
        model = Gemma4ForCausalLM(config).eval()
        filled = fill(model, RULES[rule_name], args.seed)
        model.half()  # the checkpoint's values: every run below reads these (float32 too, exactly)
        reference, spread = logprobs(model, torch.float16, "eager")
        rows = {"16-bit": {"positions": sum(len(p) for p in reference), "logit_std": round(spread, 3),
                           "top1_repeats_previous_token": kq.repeats_previous_token(reference, prompts)}}
        for label, (dtype, attention) in runs.items():
            other, spread = logprobs(model, dtype, attention)
            rows[label] = kq.compare(reference, other) | {"logit_std": round(spread, 3)}
        result["rules"][rule_name] = {
            "tensors_filled": filled,
            "seconds": round(time.monotonic() - started, 1),
            "against_16bit_eager": rows,
        }
        if not args.json:
            print(
                f"weights {rule_name} ({filled} tensors, {result['rules'][rule_name]['seconds']} s), against the "
                f"16-bit reference over {rows['16-bit']['positions']} positions (its logits' std "
                f"{rows['16-bit']['logit_std']}; its top-1 repeats the token before it at "
                f"{rows['16-bit']['top1_repeats_previous_token']:.1%} of them):",
                flush=True,
            )
            for label in runs:
                r = rows[label]
                print(
                    f"  {label:<22} top-1 agreement {r['top1_agreement']:.4f}  largest top-1 logprob difference "
                    f"{r['largest_top1_logprob_difference']:.2e}  (top-1 outside the other's top {kq.TOP_K}: "
                    f"{r[f'top1_not_in_top{kq.TOP_K}']}); over the top {kq.TOP_K}: largest "
                    f"{r[f'largest_top{kq.TOP_K}_logprob_difference']:.2e}, mean "
                    f"{r[f'mean_top{kq.TOP_K}_logprob_difference']:.2e}",
                    flush=True,
                )
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"int8 formula equal to vLLM's kernel, bit for bit: {vllm_check['rows_checked']} rows by head size; "
            f"model hidden {args.hidden}, vocab {args.vocab}, {config.num_hidden_layers} layers; "
            f"prompts {lengths} x {args.prompts}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
