"""The pure parts of tests/gpu/mtp_host.py and tests/gpu/steptiming.py (the GPU host's MTP run): the drafter's
seeded token ordering written in place, vLLM's speculative-decoding counters read, greedy agreement, and the step
records summarised. The serving and the CUDA events need a GPU."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from e2b_checkpoint import ASSISTANT_CONFIG, write_assistant_checkpoint, write_safetensors

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import mtp_host
import steptiming


def read_tensor(path: Path, name: str) -> tuple[dict[str, object], bytes]:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        begin, end = header[name]["data_offsets"]
        f.seek(8 + size + begin)
        return header[name], f.read(end - begin)


def test_token_ordering_is_a_seeded_permutation_written_in_place(tmp_path: Path) -> None:
    for d in ("a", "b"):
        write_assistant_checkpoint(tmp_path / d, sparse=True)
    path = tmp_path / "a" / "model.safetensors"
    before = path.read_bytes()
    vocab = mtp_host.write_token_ordering(path)
    mtp_host.write_token_ordering(tmp_path / "b" / "model.safetensors")
    assert vocab == ASSISTANT_CONFIG["text_config"]["vocab_size"]
    info, data = read_tensor(path, mtp_host.TOKEN_ORDERING)
    ids = np.frombuffer(data, dtype="<i8")
    assert sorted(ids.tolist()) == list(range(vocab))  # every token once: each centroid row a distinct set
    assert not np.array_equal(ids, np.arange(vocab))
    assert path.read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()  # seeded
    after = path.read_bytes()
    begin, end = info["data_offsets"]  # type: ignore[index]
    offset = 8 + struct.unpack("<Q", before[:8])[0]
    assert after[:offset + begin] == before[:offset + begin] and after[offset + end:] == before[offset + end:]


def test_token_ordering_refuses_a_tensor_of_another_shape(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, [(mtp_host.TOKEN_ORDERING, "BF16", [16])], sparse=True)
    with pytest.raises(ValueError, match="not a 1-D I64 tensor"):
        mtp_host.write_token_ordering(path)


METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 200.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 130.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 50.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_spec_counters_and_acceptance() -> None:
    counters = mtp_host.spec_counters(METRICS)
    assert len(counters) == 5  # the _created gauge and other metrics left out
    got = mtp_host.acceptance(counters)
    assert got["acceptance_rate"] == 0.65 and got["mean_accepted_per_draft"] == 1.3
    assert got["per_position"] == {"0": 0.8, "1": 0.5}
    before = mtp_host.spec_counters(METRICS.replace("100.0", "60.0").replace("200.0", "120.0")
                                    .replace("130.0", "90.0").replace("80.0", "55.0").replace("50.0", "35.0"))
    delta = mtp_host.acceptance(mtp_host.counter_delta(before, counters))
    assert delta["drafts"] == 40 and delta["acceptance_rate"] == 0.5 and delta["per_position"] == {"0": 0.625,
                                                                                                   "1": 0.375}
    assert mtp_host.acceptance({})["acceptance_rate"] is None


def test_first_difference_and_greedy_record() -> None:
    ref = [[1, 2, 3], [4, 5, 6], [7, 8]]
    assert mtp_host.first_difference(ref, [[1, 2, 3], [4, 9, 6], [7, 8, 9]]) == [None, 1, 2]
    record = mtp_host.greedy_record({"greedy_one": ref, "greedy_all": ref, "mtp_one": [[1, 2, 3], [4, 5, 0], [7, 8]],
                                     "mtp_all": {"error": "URLError"}})
    summary = record["summary"]
    assert summary["control_all_at_once"]["identical"] == 3
    assert summary["mtp_one_at_a_time"]["identical"] == 2 and summary["mtp_one_at_a_time"]["first_difference"] == [
        None, 2, None]
    assert summary["mtp_all_at_once"] == {"error": "URLError"}
    assert "error" in mtp_host.greedy_record({})["summary"]


def steps_file(folder: Path) -> None:
    rows = [
        {"t": 1.0, "tokens": 512, "reqs": 1, "step_ms": 40.0, "verify_ms": 40.0},  # a prefill
        *({"t": 2.0 + i, "tokens": 3, "reqs": 1, "step_ms": 8.0 + i, "verify_ms": 6.0 + i, "draft_ms": 2.0}
          for i in range(5)),
        {"t": 9.0, "tokens": 12, "reqs": 4, "step_ms": 11.0, "verify_ms": 8.0, "draft_ms": 3.0},
        {"t": 10.0, "tokens": 14, "reqs": 4, "step_ms": 30.0, "verify_ms": 27.0, "draft_ms": 3.0},  # mixed
    ]
    (folder / "steps-1.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")


def test_summarize_reads_decode_only_steps_by_requests(tmp_path: Path) -> None:
    steps_file(tmp_path)
    steps = steptiming.read_steps(tmp_path)
    assert len(steps) == 8
    got = steptiming.summarize(steps, 3)
    assert got["1"]["steps"] == 5 and got["1"]["step_ms"]["median"] == 10.0 and got["1"]["draft_ms"]["median"] == 2.0
    assert got["1"]["verify_ms"] == {"median": 8.0, "p10": 6.0, "p90": 10.0}
    assert got["4"] == {"steps": 1, "step_ms": {"median": 11.0, "p10": 11.0, "p90": 11.0},
                        "verify_ms": {"median": 8.0, "p10": 8.0, "p90": 8.0},
                        "draft_ms": {"median": 3.0, "p10": 3.0, "p90": 3.0}}
    assert got["8"] == {"steps": 0}
    assert steptiming.summarize(steps, 3, since=3.5, until=8.0)["1"]["steps"] == 3
    assert steptiming.summarize(steps, 1)["1"] == {"steps": 0}  # no step with one token a request


def test_register_is_off_without_the_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(steptiming.ENABLE, raising=False)
    steptiming.register()  # nothing imported, nothing written
    monkeypatch.setenv(steptiming.ENABLE, str(tmp_path / "absent"))
    steptiming.register()
    assert not (tmp_path / "absent").exists()
    monkeypatch.setenv(steptiming.ENABLE, str(tmp_path))
    steptiming.register()  # no vLLM in the unit venv: the error is written down, nothing raised
    errors = list(tmp_path.glob("error-*.txt"))
    assert len(errors) == 1 and "vllm" in errors[0].read_text()


def test_the_t4_mtp_model_reads_its_named_inputs() -> None:
    import mtp_t4_model as m

    assert m.step_ms(1) == pytest.approx(1000 / 72.31) and m.step_ms(4) == pytest.approx(1000 / 54.50)
    draft = m.drafter_bytes_per_forward()
    # The drafter's 4 layers and projections, without its 262,144 x 256 embedding (134 MB) that the head reads 4,096
    # rows of: about 21 MB of weights.
    assert 20e6 < draft["weights"] < 22e6 and draft["head_rows"] == 4096 * 256 * 2 + 4096 * 8
    assert draft["total"] == draft["weights"] + draft["head_rows"] + draft["kv"]
    result = m.model()
    assert result["verify_ms"] == pytest.approx(m.step_ms(3), abs=1e-3)
    rows = result["rows"]
    assert [r["acceptance_rate"] for r in rows[:-1]] == list(m.ACCEPTANCE_RATES)
    for row in rows:
        assert row["tokens_per_step"] == pytest.approx(1 + 2 * row["acceptance_rate"])
        assert row["tok_s_draft_x1"] > row["tok_s_draft_x2"] > row["tok_s_draft_x4"]
        step = result["verify_ms"] + 2 * result["draft_ms_per_forward"]
        assert row["tok_s_draft_x1"] == pytest.approx(row["tokens_per_step"] * 1000 / step, abs=0.06)
    # With nothing accepted MTP is slower than the published decode (the verify and the drafts cost more).
    nothing = 1000 / (result["verify_ms"] + 2 * result["draft_ms_per_forward"])
    assert nothing < 72.31
    assert "| 0.773 (published, E4B) |" in m.table(result)


def test_the_t4_mtp_model_on_measured_step_costs(tmp_path: Path) -> None:
    import mtp_t4_model as m

    # A record shaped as tests/gpu/mtp_host.py writes it (its `pair` and steptiming's summaries); the figures are
    # chosen here, not measured.
    record = {"pair": ["t4serve", "t4serve-mtp"], "vllm": "0.34.0", "step_times": {
        "t4serve": {"1": {"steps": 500, "step_ms": {"median": 4.0, "p10": 3.9, "p90": 4.2}}},
        "t4serve-mtp": {"1": {"steps": 300, "verify_ms": {"median": 4.4}, "draft_ms": {"median": 1.0},
                              "step_ms": {"median": 5.4}}}}}
    result = m.measured_model(record)
    host_bandwidth = m.bf16_bytes_per_token() / 4.0e-3
    draft_bytes = 2 * m.drafter_bytes_per_forward()["total"]
    overhead = 1.0 - draft_bytes / host_bandwidth * 1000
    assert result["draft_overhead_ms_host"] == pytest.approx(overhead, abs=1e-4)
    t4_bandwidth = m.qat_bytes_per_token() / (m.step_ms(1) / 1000)
    assert result["draft_ms_t4_bytes"] == pytest.approx(draft_bytes / t4_bandwidth * 1000, abs=1e-4)
    # The verify: the published steps' line at 3 tokens; the optimistic one the host's ratio on the published step.
    assert result["verify_ms"] == pytest.approx(m.step_ms(3), abs=1e-3)
    assert result["verify_ms_optimistic"] == pytest.approx(m.step_ms(1) * 4.4 / 4.0, abs=1e-3)
    for scale in m.DRAFT_SCALES:
        step = m.step_ms(3) + draft_bytes / t4_bandwidth * 1000 + scale * overhead
        assert result[f"step_ms_overhead_x{scale:g}"] == pytest.approx(step, abs=1e-3)
        for row in result["rows"]:
            assert row[f"tok_s_overhead_x{scale:g}"] == pytest.approx(
                (1 + 2 * row["acceptance_rate"]) * 1000 / step, abs=0.06)
        # At the break-even rate MTP decodes as fast as the published single stream; at the goal's rate, 110 tok/s.
        even = result["break_even_acceptance"][f"overhead_x{scale:g}"]
        assert (1 + 2 * even) * 1000 / step == pytest.approx(1000 / m.step_ms(1), rel=1e-3)
        goal = result["acceptance_for_goal"][f"overhead_x{scale:g}"]
        assert (1 + 2 * goal) * 1000 / step == pytest.approx(110, rel=1e-3)
    assert "| 0.773 (published, E4B) |" in m.measured_table(result)
    path = tmp_path / "mtp.json"
    path.write_text(json.dumps({"pair": ["t4serve", "t4serve-mtp"], "step_times": {}}))
    assert m.main(["--measured", str(path)]) == 2  # a hold that measured no step: said, not a traceback
    path.write_text("{not json")
    assert m.main(["--measured", str(path)]) == 2


def test_kv_record_reads_the_whole_prompt_set_the_numerics_sent() -> None:
    import kv_quant_host as kq

    # What kq.measure returns for every fixed prompt (the numerics always send the whole set, whatever --prompts chose
    # for the greedy comparison): top-1 the previous prompt token at every position, one greedy token per prompt.
    prompts = kq.prompts()
    measured = {"logprobs": [[{p[j]: -0.1, p[j] + 1: -3.0} for j in range(len(p) - 1)] for p in prompts],
                "greedy": [[7] for _ in prompts]}
    shifted = {"logprobs": [[{p[j]: -0.3, p[j] + 1: -2.0} for j in range(len(p) - 1)] for p in prompts],
               "greedy": [[7] for _ in prompts]}
    out = mtp_host.kv_record(kq, {"kv_auto": measured, "kv_kv-int8": shifted, "kv_auto_again": measured},
                             control="kv_t4serve-triton")
    assert out["reference_top1_repeats_previous_token"] == 1.0
    assert out["int8"]["top1_agreement"] == 1.0 and out["int8"]["greedy"]["identical"] == len(prompts)
    assert out[kq.AGAIN]["largest_top1_logprob_difference"] == 0.0
    assert out[kq.CONTROL] == {"error": "not measured"}


def test_sizing_md_shows_the_model_on_the_recorded_step_costs() -> None:
    import mtp_t4_model as m

    # The record the GPU host wrote (docs/verified/gpu-host-vllm-0.34.0-served/mtp.json) and the table docs/sizing.md
    # prints from it: the docs change with the model or the record, never apart from them.
    root = Path(__file__).resolve().parents[2]
    record = json.loads((root / "docs/verified/gpu-host-vllm-0.34.0-served/mtp.json").read_text())
    result = m.measured_model(record)
    sizing = (root / "docs/sizing.md").read_text()
    for line in m.measured_table(result).splitlines():
        assert line in sizing
    assert result["host"]["vllm"] == "0.34.0"
    assert f"{result['host']['plain_ms']:.3f} ms" in sizing and f"{result['host']['draft_ms']:.3f} ms" in sizing
