"""The telemetry sampler against a real NVIDIA GPU for 30 s: /metrics scraped and printed (for the issue note).

Run: .venv/bin/pytest -s -m gpu tests/gpu/test_telemetry_gpu.py   (skipped cleanly where NVML sees no GPU)
"""

from __future__ import annotations

import io
import threading
import time
import urllib.request

import pytest

from t4serve.supervise import telemetry

pytestmark = pytest.mark.gpu

DURATION_S = 30.0


def test_sampler_on_the_real_gpu_for_30_seconds() -> None:
    nvml, reason = telemetry.load_nvml()
    if nvml is None:
        pytest.skip(f"no NVIDIA GPU through NVML here: {reason}")
    sampler = telemetry.Sampler(nvml)
    server = telemetry.make_server(sampler, "127.0.0.1", 0)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = io.StringIO()
    options = {"duration_s": DURATION_S, "log_every_s": 10.0, "nvml": nvml}
    runner = threading.Thread(target=telemetry.run, args=("127.0.0.1", 0, out), kwargs=options)
    began = time.monotonic()
    runner.start()
    scrapes = []
    try:
        while time.monotonic() - began < DURATION_S:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                scrapes.append(response.read().decode())
            time.sleep(5.0)
        runner.join(timeout=DURATION_S)
    finally:
        server.shutdown()
        server.server_close()
    print(f"\n--- log lines ({DURATION_S:.0f} s, one per 10 s) ---\n{out.getvalue()}--- last /metrics scrape ---")
    print(scrapes[-1])
    assert len(scrapes) >= 5
    last = scrapes[-1]
    for metric in ("t4serve_gpu_power_watts{", "t4serve_gpu_sm_clock_max_mhz{", "t4serve_gpu_memory_used_bytes{",
                   "t4serve_gpu_temperature_celsius{", "t4serve_gpu_clocks_event_reason{"):  # fmt: skip
        assert metric in last, metric
    assert out.getvalue().count("clocks held by:") >= 3
