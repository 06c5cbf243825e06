"""Oracle for tests/unit/e2b_checkpoint.py: the tensors transformers and compressed-tensors would save for E2B_CONFIG.

Builds the class named in E2B_CONFIG's `architectures` from `e2b_config(kind)` on the meta device (no weight memory),
takes the state dict through save_pretrained's own steps (drop `_keys_to_ignore_on_save`, remove tied weights, revert
weight conversions), and prints JSON {name: {dtype, shape}} per kind: "bf16" as is (tied embeddings), "qat" from its
config (untied embeddings, so the model has its own lm_head) after compressed-tensors applies QAT_QUANTIZATION_CONFIG
and compresses each matched module in the config's format. Needs torch, transformers and compressed-tensors (the
image's venv): `python tests/oracle/checkpoint_names.py > names.json`.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

sys.dont_write_bytecode = True  # the image test mounts tests/ read-only
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
# tests/unit is not a package: its e2b_checkpoint.py is importable only from the path just added.
E2B = importlib.import_module("e2b_checkpoint")
QAT_QUANTIZATION_CONFIG: dict[str, Any] = E2B.QAT_QUANTIZATION_CONFIG

# torch dtype name -> safetensors dtype, as safetensors.torch writes it.
SAFETENSORS_DTYPES = {
    "torch.bfloat16": "BF16",
    "torch.float16": "F16",
    "torch.float32": "F32",
    "torch.int8": "I8",
    "torch.int32": "I32",
    "torch.int64": "I64",
}


def build_model(kind: str) -> Any:
    """The model e2b_config(kind) names, bf16, its parameters and buffers on the meta device. The quantization config
    is left out here (quantize() applies it); the rest, tie_word_embeddings included, is the checkpoint's config."""
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    fields = E2B.e2b_config(kind)
    fields.pop("quantization_config", None)
    config = transformers.AutoConfig.for_model(**fields)
    model_class = getattr(transformers, fields["architectures"][0])
    with torch.device("meta"):
        return model_class._from_config(config, dtype=torch.bfloat16)


def saved_tensors(model: Any) -> dict[str, dict[str, Any]]:
    """What save_pretrained would write for `model`: its state dict through the same steps, as name -> dtype, shape."""
    modeling_utils = importlib.import_module("transformers.modeling_utils")
    core_model_loading = importlib.import_module("transformers.core_model_loading")
    state_dict = model.state_dict()
    for key in model._keys_to_ignore_on_save or ():
        state_dict.pop(key, None)
    state_dict = modeling_utils.remove_tied_weights_from_state_dict(state_dict, model)
    state_dict = core_model_loading.revert_weight_conversion(model, state_dict)
    return {
        name: {"dtype": SAFETENSORS_DTYPES[str(tensor.dtype)], "shape": list(tensor.shape)}
        for name, tensor in sorted(state_dict.items())
    }


def quantize(model: Any) -> list[str]:
    """Apply QAT_QUANTIZATION_CONFIG the way compressed-tensors does, then compress every matched module in place in
    the config's format (on meta tensors the arithmetic is skipped, the shapes and dtypes are real). Returns the
    quantized modules' names."""
    quantization = importlib.import_module("compressed_tensors.quantization")
    compressors = importlib.import_module("compressed_tensors.compressors.base")
    config = quantization.QuantizationConfig.model_validate(QAT_QUANTIZATION_CONFIG)
    quantization.apply_quantization_config(model, config)
    quantized = [name for name, module in model.named_modules() if hasattr(module, "quantization_scheme")]
    for name in quantized:
        compressors.compress_module(model.get_submodule(name), format=config.format)
    return quantized


def oracle() -> dict[str, Any]:
    versions = {m: importlib.import_module(m).__version__ for m in ("torch", "transformers", "compressed_tensors")}
    bf16_model = build_model("bf16")
    qat_model = build_model("qat")
    quantized = quantize(qat_model)
    return {
        "versions": versions,
        "architecture": type(bf16_model).__name__,
        # Regexes (re.search) of checkpoint keys from_pretrained drops without complaint: keys checkpoints ship that
        # the model has no parameter for.
        "ignored_on_load_unexpected": sorted(bf16_model._keys_to_ignore_on_load_unexpected or ()),
        # What the loaded model would tie (transformers' own reading of each config): output layer -> embedding.
        "tied_weights": {"bf16": bf16_model.get_expanded_tied_weights_keys(),
                         "qat": qat_model.get_expanded_tied_weights_keys()},
        "quantized_modules": quantized,
        "checkpoints": {"bf16": saved_tensors(bf16_model), "qat": saved_tensors(qat_model)},
    }


if __name__ == "__main__":
    json.dump(oracle(), sys.stdout, indent=1)
    sys.stdout.write("\n")
