"""How long tests/gpu/bench_host.py's sweep takes on an H200, from the records in docs/verified: does it fit one hold?

    python tests/gpu/bench_estimate.py [--inputs 512,4096] [--concurrency 16,8,4,1] [--repeats 3] [--waves 10]

A hold is 30 minutes of the device, of which about 8 go to laying the stack down (the transfers), so the step has
22 (HOLD_S - TRANSFERS_S) from its start: installing the stack and writing the checkpoints, starting both servers,
the sweep, and a last call that packs the results. What each costs, read from the 0.33.0 records:

- the step's start before the servers (install, checkpoints): session 1's sweep began 302 s after its step, of which
  its servers took 254.7 s; the servers: the slowest starts recorded (session 2: 222.7 s and 147.1 s, one after the
  other);
- the client's start-up, now paid once: the most the process-per-run client spent around a run that was not
  measured (session 1: about 20 s a run, session 2 about 30 s);
- each run's measured time: its requests at the recorded throughput (cells c=8, 16: prompts x output tokens / tok/s)
  or, for a cell not recorded (c=1, 4), waves x one request's latency at the lowest recorded concurrency of its
  input (TTFT + (output - 1) x TPOT: fewer streams decode no slower, so an upper bound); then at the slowest speed a
  later host showed for the published flags (4096/c8 at 514 tok/s against the record's 1,065: SLOWER);
- each run's set-up in the sweep's client (prompts drawn, the test request, the warm-up requests): not measured yet,
  SETUP_S assumed until the first interleaved record prints its split;
- a warm-up run per server and cell: 2 x c requests (WARMUP_WAVES waves) and a set-up.

Prints the estimate at the record's speed and at the slow one, and the waves that fit the hold at each. Pure
arithmetic over the records; nothing is run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "docs" / "verified" / "gpu-host-vllm-0.33.0"
HOLD_S = 30 * 60.0
TRANSFERS_S = 8 * 60.0
PACK_S = 60.0  # the last `session.sh wait` call: pack and bring back the results
SETUP_S = 3.0  # a run's set-up in the sweep's client (assumed; the first interleaved record measures it)
WARMUP_WAVES = 2
SLOWER = 1065 / 514  # the slowest published figure a later host showed (4096/c8), against the record
SERVERS = ("published", "t4serve")


@dataclass(frozen=True)
class Cell:
    input_len: int
    concurrency: int


def _ready_times(log: Path) -> dict[str, float]:
    found = re.findall(r"^(\w+): ready after ([0-9.]+) s$", log.read_text(), re.MULTILINE)
    return {name: float(s) for name, s in found}


def _elapsed(text: str) -> list[float]:
    """The progress lines' "elapsed 1m06s" in seconds."""
    out = []
    for m in re.finditer(r"elapsed (?:([0-9]+)m)?([0-9]+)s", text):
        out.append(int(m[1] or 0) * 60 + int(m[2]))
    return out


@dataclass(frozen=True)
class Record:
    runs: list[dict]  # session 1's runs.json runs
    output_len: int
    servers_s: float  # the slowest recorded starts of both servers, one after the other
    before_servers_s: float  # the step's start before them
    client_start_s: float  # the most the process-per-run client spent around a run


def read_record() -> Record:
    sweep = json.loads((RECORD / "bench" / "sweep" / "runs.json").read_text())
    first = _ready_times(RECORD / "bench" / "bench-host.log")
    second = _ready_times(RECORD / "session-2-partial" / "bench-host.log")
    servers_s = max(sum(first.values()), sum(second.values()))
    # Session 1: the step began at "=== bench started" (session.log), the sweep at runs.json's "started".
    step = re.search(r"=== bench started (\S+)Z", (RECORD / "session.log").read_text())
    assert step is not None
    began = datetime.datetime.fromisoformat(step[1] + "+00:00")
    swept = datetime.datetime.fromisoformat(sweep["started"])
    before = (swept - began).total_seconds() - sum(first.values())
    # The old client's time around each measured run: wall time between progress lines minus vLLM's duration.
    walls = [b - a for a, b in zip([0.0, *_elapsed((RECORD / "bench" / "bench-host.log").read_text())],
                                   _elapsed((RECORD / "bench" / "bench-host.log").read_text()), strict=False)]
    durations = [r["figures"]["duration_s"] for r in sweep["runs"]]
    overhead_1 = statistics.median(w - d for w, d in zip(walls, durations, strict=False))
    second_walls = _elapsed((RECORD / "session-2-partial" / "bench-host.log").read_text())
    second_durations = [json.loads((RECORD / "session-2-partial" / "raw" / f"published_in512_c8_r{r}.json")
                                   .read_text())["duration"] for r in (1, 2)]
    overhead_2 = (second_walls[1] - second_walls[0]) - second_durations[1]
    return Record(sweep["runs"], sweep["output_len"], servers_s, before, max(overhead_1, overhead_2))


def measured_s(record: Record, server: str, cell: Cell, waves: int) -> float:
    """One run's measured time at the record's speed (the module's docstring says how)."""
    same = [r for r in record.runs if r["model"] == server and r["input_len"] == cell.input_len and r["figures"]]
    here = [r["figures"] for r in same if r["concurrency"] == cell.concurrency]
    prompts = waves * cell.concurrency
    if here:
        return prompts * record.output_len / statistics.median(f["output_throughput"] for f in here)
    lowest = min(r["concurrency"] for r in same)
    if cell.concurrency > lowest:
        raise SystemExit(f"no record near {server} {cell}: the estimate covers c up to the recorded ones")
    base = [r["figures"] for r in same if r["concurrency"] == lowest]
    ttft = statistics.median(f["median_ttft_ms"] for f in base) / 1000
    tpot = statistics.median(f["median_tpot_ms"] for f in base) / 1000
    return waves * (ttft + (record.output_len - 1) * tpot)


@dataclass(frozen=True)
class Estimate:
    fixed_s: float  # before the sweep: install, checkpoints, servers
    client_start_s: float
    measured_s: float
    set_up_s: float
    warmups_s: float
    runs: int

    @property
    def sweep_s(self) -> float:
        return self.client_start_s + self.measured_s + self.set_up_s + self.warmups_s

    @property
    def total_s(self) -> float:
        return self.fixed_s + self.sweep_s + PACK_S


def estimate(record: Record, cells: list[Cell], repeats: int, waves: int, slower: float = 1.0) -> Estimate:
    per_run = [measured_s(record, s, c, waves) * slower for s in SERVERS for c in cells]
    warm = [measured_s(record, s, c, WARMUP_WAVES) * slower + SETUP_S for s in SERVERS for c in cells]
    runs = len(per_run) * repeats
    return Estimate(fixed_s=record.before_servers_s + record.servers_s, client_start_s=record.client_start_s,
                    measured_s=sum(per_run) * repeats, set_up_s=SETUP_S * runs, warmups_s=sum(warm), runs=runs)


def waves_that_fit(record: Record, cells: list[Cell], repeats: int, slower: float) -> int:
    """The most waves (up to 10) whose estimate fits the step's budget; 0 where not even one does."""
    budget = HOLD_S - TRANSFERS_S
    for waves in range(10, 0, -1):
        if estimate(record, cells, repeats, waves, slower).total_s <= budget:
            return waves
    return 0


def report(inputs: list[int], concurrencies: list[int], repeats: int, waves: int) -> str:
    record = read_record()
    cells = [Cell(i, c) for i in inputs for c in concurrencies]
    budget = HOLD_S - TRANSFERS_S
    lines = [f"sweep estimate on an H200 (from {RECORD.relative_to(REPO)}): inputs {inputs} x c {concurrencies} x "
             f"{repeats} repeats x {len(SERVERS)} servers, {waves} x c requests a run; the step's budget "
             f"{budget / 60:.0f} min (a {HOLD_S / 60:.0f}-min hold less {TRANSFERS_S / 60:.0f} min of transfers)"]
    for label, slower in (("at the record's speed", 1.0), (f"{SLOWER:.2f}x slower", SLOWER)):
        e = estimate(record, cells, repeats, waves, slower)
        fits = "fits" if e.total_s <= budget else "does NOT fit"
        lines.append(
            f"  {label}: {e.total_s / 60:.1f} min, {fits}: before the sweep {e.fixed_s:.0f} s (servers "
            f"{record.servers_s:.0f} s), client start-up {e.client_start_s:.0f} s once, measured {e.measured_s:.0f} s "
            f"over {e.runs} runs ({e.measured_s / e.runs:.1f} s a run), set-up {e.set_up_s:.0f} s (assumed "
            f"{SETUP_S:g} s a run), warm-ups {e.warmups_s:.0f} s, packing {PACK_S:.0f} s")
        if e.total_s > budget:
            fit = waves_that_fit(record, cells, repeats, slower)
            left = budget - PACK_S - e.fixed_s - e.client_start_s - e.set_up_s - e.warmups_s
            lines.append(f"    to fit: a measured-time budget of {max(left, 0) / e.runs:.1f} s a run on average "
                         f"(--waves {fit}, {fit} x c requests a run)" if fit else
                         "    to fit: no number of waves does; fewer cells or repeats")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", default="512,4096")
    parser.add_argument("--concurrency", default="16,8,4,1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--waves", type=int, default=10)
    args = parser.parse_args(argv)
    print(report([int(v) for v in args.inputs.split(",")], [int(v) for v in args.concurrency.split(",")],
                 args.repeats, args.waves))
    return 0


if __name__ == "__main__":
    sys.exit(main())
