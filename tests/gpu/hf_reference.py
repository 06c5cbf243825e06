"""An independent reference for the GPU host's KV numerics: transformers' Gemma 4 on the same random checkpoint as the
servers, with the 16-bit cache and with keys and values rounded as vLLM 0.33's int8 per-token-head cache stores them
(tests/gpu/gemma4_numerics_transformers.py's `int8_per_token_head`, checked there bit for bit against vLLM's kernel).

    python3 tests/gpu/hf_reference.py CHECKPOINT OUT.json [--device cuda] [--dtype float16] [--prompts 64,600]

`reference_logprobs` gives, per kind (`auto`, `int8`), the top TOP_K log-probabilities at every prompt position in
the shape `kv_quant_host.measure` reads from vLLM's `prompt_logprobs`, for kv_quant_host.py's fixed prompts, so that
`kv_quant_host.compare` can set vLLM's int8 server against transformers' int8 beside vLLM's 16-bit server against
transformers' 16-bit: if the first pair is as close as the second, and both far closer than int8 is to 16 bits,
vLLM's int8 path computes what int8 rounding gives, whatever the random weights make of it. Run on the GPU host after
the servers (kv_quant_host.py does, unless --no-hf-reference); on a CPU for a dry run with a small checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kv_quant_host as kq

KINDS = ("auto", "int8")


def reference_logprobs(checkpoint: Path, kinds: tuple[str, ...] = KINDS, *, device: str = "cuda",
                       dtype: str = "float16", prompts: list[list[int]] | None = None
                       ) -> dict[str, list[list[dict[int, float]]]]:
    import torch
    from gemma4_numerics_transformers import register_int8_attention, top_logprobs
    from transformers import AutoModelForCausalLM

    int8_attention = register_int8_attention()
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=getattr(torch, dtype)).to(device).eval()
    out: dict[str, list[list[dict[int, float]]]] = {}
    for kind in kinds:
        model.set_attn_implementation("eager" if kind == "auto" else int8_attention)
        with torch.no_grad():
            out[kind] = [top_logprobs(model(torch.tensor([ids], device=device)).logits[0])
                         for ids in (prompts if prompts is not None else kq.prompts())]
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def against_servers(reference: dict[str, list[list[dict[int, float]]]],
                    served: dict[str, list[list[dict[int, float]]]]) -> dict[str, Any]:
    """vLLM's servers (`served`: kind -> measure()'s logprobs) against transformers' (`reference`), each kind with
    its own, and transformers' int8 against its 16-bit: the int8 effect itself, for scale."""
    out: dict[str, Any] = {f"vllm_{k}_vs_transformers_{k}": kq.compare(reference[k], served[k])
                           for k in reference if k in served}
    if "auto" in reference and "int8" in reference:
        out["transformers_int8_vs_transformers_auto"] = kq.compare(reference["auto"], reference["int8"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--prompts", help="prompt lengths in place of kv_quant_host's (a dry run)")
    args = parser.parse_args(argv)
    prompts = None
    if args.prompts:
        prompts = [list(range(3, 3 + int(n))) for n in args.prompts.split(",")]
    result = reference_logprobs(args.checkpoint, device=args.device, dtype=args.dtype, prompts=prompts)
    args.out.write_text(json.dumps({k: [[{str(t): lp for t, lp in pos.items()} for pos in p] for p in v]
                                    for k, v in result.items()}))
    print(json.dumps(against_servers(result, {}) | {"kinds": list(result)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
