"""The pure parts of tests/gpu/kv_quant_host.py (the GPU host's quantized-KV run): seeded random weights written in
place, the fixed prompt set, and the comparisons against the 16-bit cache. The serving itself needs a GPU."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from e2b_checkpoint import write_safetensors

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import kv_quant_host as kq


def tensor(path: Path, name: str) -> tuple[str, bytes]:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        begin, end = header[name]["data_offsets"]
        f.seek(8 + size + begin)
        return header[name]["dtype"], f.read(end - begin)


def test_randomize_fills_float_tensors_seeded_and_leaves_the_rest(tmp_path: Path) -> None:
    tensors = [("model.layers.0.q_proj.weight", "BF16", [64, 256]), ("model.norm.weight", "F32", [256]),
               ("model.embed_tokens.weight", "F16", [100, 64]), ("model.layers.0.q_proj.weight_shape", "I64", [2])]
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        write_safetensors(tmp_path / d / "model.safetensors", tensors, sparse=True)
    header_before = (tmp_path / "a" / "model.safetensors").read_bytes()[:200]
    written = kq.randomize(tmp_path / "a")
    kq.randomize(tmp_path / "b")
    assert written == 64 * 256 * 2 + 256 * 4 + 100 * 64 * 2
    a, b = tmp_path / "a" / "model.safetensors", tmp_path / "b" / "model.safetensors"
    assert a.read_bytes() == b.read_bytes()  # seeded
    assert a.read_bytes()[:200] == header_before
    _, raw = tensor(a, "model.layers.0.q_proj.weight")
    linear = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    assert linear.std() == pytest.approx(1 / 16, rel=0.05) and np.count_nonzero(linear) > 0.99 * linear.size
    _, raw = tensor(a, "model.norm.weight")
    assert np.frombuffer(raw, "<f4").mean() == pytest.approx(1.0, abs=0.01)
    assert tensor(a, "model.layers.0.q_proj.weight_shape")[1] == b"\0" * 16


def test_bfloat16_rounds_to_nearest() -> None:
    values = np.array([1.0, -2.5, 1.00390625], dtype=np.float32)  # the last: halfway, rounds to even (1.0)
    out = np.frombuffer(kq._encode(values, "BF16"), "<u2")
    assert list(out) == [0x3F80, 0xC020, 0x3F80]


def test_prompts_are_fixed_and_past_the_window() -> None:
    first, again = kq.prompts(), kq.prompts()
    assert first == again and len(first) == len(kq.PROMPT_LENGTHS) * kq.PROMPTS_PER_LENGTH
    assert max(len(p) for p in first) > 512


def test_compare_counts_agreement_and_the_largest_difference() -> None:
    ref = [[{1: -0.1, 2: -2.0}, {3: -0.5, 4: -1.0}]]
    other = [[{1: -0.3, 2: -1.9}, {4: -0.2, 5: -3.0}]]
    result = kq.compare(ref, other)
    assert result["positions"] == 2 and result["top1_agreement"] == 0.5
    assert result["largest_top1_logprob_difference"] == pytest.approx(0.2)
    assert result[f"top1_not_in_top{kq.TOP_K}"] == 1
    # Over the tokens both top lists hold: 1 (0.2), 2 (0.1), 4 (0.8).
    assert result[f"largest_top{kq.TOP_K}_logprob_difference"] == pytest.approx(0.8)
    assert result[f"mean_top{kq.TOP_K}_logprob_difference"] == pytest.approx((0.2 + 0.1 + 0.8) / 3)


def test_a_saturated_top1_shows_only_below_it() -> None:
    # Both give the top-1 token log-probability 0 (it leads by far); the tokens below it moved.
    ref = [[{7: 0.0, 8: -14.0, 9: -15.0}]]
    other = [[{7: 0.0, 8: -12.5, 9: -15.2}]]
    result = kq.compare(ref, other)
    assert result["top1_agreement"] == 1.0 and result["largest_top1_logprob_difference"] == 0.0
    assert result[f"largest_top{kq.TOP_K}_logprob_difference"] == pytest.approx(1.5)


def test_repeats_previous_token_counts_an_echo_of_the_input() -> None:
    # Entry j of a prompt's list is the distribution of token j + 1; its top-1 equal to prompt[j] repeats it.
    logprobs = [[{10: -0.1, 3: -2.0}, {11: -0.1}, {5: -0.1}]]
    assert kq.repeats_previous_token(logprobs, [[10, 11, 12, 13]]) == pytest.approx(2 / 3)
    assert kq.repeats_previous_token([], []) is None


def test_prompt_logprobs_as_vllm_returns_them() -> None:
    raw = [None, {"17": {"logprob": -0.5, "rank": 1, "decoded_token": "a"}}]
    assert kq.top_tokens(raw) == [{17: -0.5}]
    assert kq.greedy_agreement([[1, 2, 3], [4, 5]], [[1, 2, 9], [4, 5]]) == {
        "identical": 1, "of": 2, "mean_common_prefix": 2.0}


def test_kv_figures_compare_logged_with_planned() -> None:
    state = {"figures": {"kv_tokens": {"value": 5}, "max_concurrency": {"value": 1.5},
                         "model_memory_gib": {"value": 9}},
             "predictions": {"kv_tokens": {"value": 5}, "max_concurrency": {"value": 1.4},
                             "model_memory_gib": {"value": 8}}}
    # Only the KV figures, which the plan states exactly; memory is a prediction.
    assert kq.kv_figures(state)["equal"] == {"max_concurrency": False, "kv_tokens": True}


def test_kinds_must_start_with_the_reference(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert kq.main([str(tmp_path / "out"), str(tmp_path), "--kinds", "int8,auto"]) == 2
    assert "auto first" in capsys.readouterr().err


def test_randomize_is_the_same_whatever_the_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kq, "CHUNK", 1000)  # several chunks per tensor: each chunk seeded on its own
    tensors = [("model.layers.0.q_proj.weight", "BF16", [64, 100]), ("model.embed_tokens.weight", "F32", [50, 70])]
    for d in ("one", "four"):
        (tmp_path / d).mkdir()
        write_safetensors(tmp_path / d / "model.safetensors", tensors, sparse=True)
    assert kq.randomize(tmp_path / "one", workers=1) == kq.randomize(tmp_path / "four", workers=4)
    one, four = (tmp_path / d / "model.safetensors" for d in ("one", "four"))
    assert one.read_bytes() == four.read_bytes()
    _, raw = tensor(one, "model.embed_tokens.weight")
    chunks = [raw[i:i + 4000] for i in range(0, len(raw), 4000)]
    assert len(set(chunks)) == len(chunks)  # no two chunks drew the same values


def test_measure_sends_nothing_after_its_time(tmp_path: Path) -> None:
    from local_http import Canned, serve

    answer = {"choices": [{"prompt_logprobs": [None, {"5": {"logprob": -0.1}}], "token_ids": [7, 8]}]}
    with serve({"/v1/completions": Canned(body=answer)}) as server:
        result = kq.measure(server.url, "m", until=None)
        assert len(result["logprobs"]) == len(kq.prompts()) and result["greedy"][0] == [7, 8]
        sent = len(server.requests)
        with pytest.raises(TimeoutError, match="0 of"):
            kq.measure(server.url, "m", until=0.0)
        assert len(server.requests) == sent


def test_random_weights_keep_the_residual_path_and_a_usable_attention(tmp_path: Path) -> None:
    """The rules tests/gpu/gemma4_numerics_cpu.py found necessary: layer scalars 1, q_norm / sqrt(head_dim), the tied
    embedding spread to 4 / sqrt(hidden); the per-layer embedding and other norms as before."""
    tensors = [("model.language_model.layers.3.layer_scalar", "BF16", [1]),
               ("model.language_model.layers.3.self_attn.q_norm.weight", "F32", [256]),
               ("model.language_model.layers.3.self_attn.k_norm.weight", "F32", [256]),
               ("model.language_model.embed_tokens.weight", "F32", [300, 64]),
               ("model.language_model.embed_tokens_per_layer.weight", "F32", [300, 64])]
    write_safetensors(tmp_path / "model.safetensors", tensors, sparse=True)
    kq.randomize(tmp_path, workers=1)
    path = tmp_path / "model.safetensors"
    _, raw = tensor(path, "model.language_model.layers.3.layer_scalar")
    assert raw == bytes.fromhex("803f")  # bfloat16 1.0
    q = np.frombuffer(tensor(path, "model.language_model.layers.3.self_attn.q_norm.weight")[1], "<f4")
    k = np.frombuffer(tensor(path, "model.language_model.layers.3.self_attn.k_norm.weight")[1], "<f4")
    assert q.mean() == pytest.approx(1 / 16, rel=0.01) and k.mean() == pytest.approx(1.0, abs=0.01)
    embed = np.frombuffer(tensor(path, "model.language_model.embed_tokens.weight")[1], "<f4")
    per_layer = np.frombuffer(tensor(path, "model.language_model.embed_tokens_per_layer.weight")[1], "<f4")
    assert embed.std() == pytest.approx(0.5, rel=0.05) and per_layer.std() == pytest.approx(0.02, rel=0.05)


def test_main_measures_the_caches_then_a_second_16bit_server_as_control(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """main's order and records with the servers replaced: `ServerDouble` stands for realserve.Server (which starts
    `t4serve serve` with vLLM on a GPU) and answers /v1/completions from a local HTTP server: the 16-bit ones with
    one top-1 token, int8 with another."""
    import contextlib

    import realserve
    from local_http import Canned, serve

    def answer(top: int, second: int) -> dict[str, object]:
        position = {str(top): {"logprob": -0.1}, str(second): {"logprob": -2.0}}
        return {"choices": [{"prompt_logprobs": [None, position], "token_ids": [top]}]}

    started: list[tuple[str, dict[str, str]]] = []
    stack = contextlib.ExitStack()

    class ServerDouble:
        def __init__(self, name: str, state_dir: Path, model: str, port: int, env: dict[str, str]) -> None:
            self.name, self.env = name, env
            self.log_path = tmp_path / f"{name}.log"
            int8 = env["T4SERVE_KV_CACHE_DTYPE"] == "int8"
            self.http = stack.enter_context(serve({"/v1/completions": Canned(body=answer(9, 5) if int8 else
                                                                                  answer(5, 9))}))

        def start(self) -> ServerDouble:
            started.append((self.name, self.env))
            return self

        def wait_phase(self, wanted: tuple[str, ...], timeout: float) -> str:
            return "ready"

        def environment_added(self) -> dict[str, str]:
            return self.env

        def state(self) -> dict[str, object]:
            figures = {"kv_tokens": {"value": 455332.0}, "max_concurrency": {"value": 27.79}}
            return {"figures": figures, "predictions": figures}

        def kill(self) -> None:
            pass

        @property
        def base_url(self) -> str:
            return self.http.url

    monkeypatch.setattr(realserve, "Server", ServerDouble)
    monkeypatch.setattr(realserve, "vllm_version", lambda: "0.33.0")
    monkeypatch.setattr(kq, "random_checkpoint", lambda work: work / "ckpt")
    monkeypatch.setattr(kq, "PROMPT_LENGTHS", (8, 600))
    monkeypatch.setattr(kq, "PROMPTS_PER_LENGTH", 1)
    # transformers' reference (hf_reference.reference_logprobs needs the model on a GPU): answers as the servers do.
    import hf_reference

    def reference(ckpt: Path, kinds: tuple[str, ...]) -> dict[str, list[list[dict[int, float]]]]:
        assert kinds == ("auto", "int8")
        return {k: [[{9 if k == "int8" else 5: -0.1, 9 if k == "auto" else 5: -2.0}] for _ in kq.prompts()]
                for k in kinds}

    monkeypatch.setattr(hf_reference, "reference_logprobs", reference)
    with stack:
        assert kq.main([str(tmp_path / "out"), str(tmp_path / "work"), "--kinds", "auto,int8"]) == 0
    assert [n for n, _ in started] == ["kv-auto", "kv-int8", "kv-control_16bit"]
    assert started[2][1]["T4SERVE_COMPILE"] == "eager" and started[2][1]["T4SERVE_KV_CACHE_DTYPE"] == "auto"
    record = json.loads((tmp_path / "out" / "kv-quant.json").read_text())
    assert set(record["servers"]) == {"auto", "int8", "control_16bit"}
    numerics = record["numerics"]
    assert numerics["same_server_again"]["top1_agreement"] == 1.0
    assert numerics["control_16bit"]["top1_agreement"] == 1.0
    assert numerics["int8"]["top1_agreement"] == 0.0
    assert record["reference_top1_repeats_previous_token"] == 0.0  # the double's top-1 (5) is no prompt token here
    independent = record["independent_reference"]
    assert independent["vllm_auto_vs_transformers_auto"]["top1_agreement"] == 1.0
    assert independent["vllm_int8_vs_transformers_int8"]["top1_agreement"] == 1.0
    assert independent["transformers_int8_vs_transformers_auto"]["top1_agreement"] == 0.0
    started.clear()
    with stack:
        assert kq.main([str(tmp_path / "out2"), str(tmp_path / "work"), "--kinds", "auto,int8", "--no-control",
                        "--no-hf-reference"]) == 0
    assert [n for n, _ in started] == ["kv-auto", "kv-int8"]
    second = json.loads((tmp_path / "out2" / "kv-quant.json").read_text())
    assert set(second["numerics"]) == {"int8"} and "independent_reference" not in second
