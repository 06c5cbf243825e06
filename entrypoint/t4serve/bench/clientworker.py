"""One `vllm bench serve` client for a whole sweep: t4serve.bench.client.SweepClient starts it once and sends it every
run, so vLLM (and torch below it) is imported once, not once per run.

Run as a file by a Python that has vLLM (`PYTHON .../clientworker.py`): it imports nothing of t4serve. What `vllm
bench serve ARGS` does (vllm/entrypoints/cli/main.py, vllm/entrypoints/cli/benchmark/serve.py in 0.33.0), done
once: import `vllm.benchmarks.serve`, make the current platform the CPU's where none was detected (as the CLI does
for `bench`), build its parser (a FlexibleArgumentParser given `vllm.benchmarks.serve.add_cli_args`); then per run:
parse ARGS with it and call `vllm.benchmarks.serve.main(args)`, which runs the benchmark, writes the result file
`--save-result` names and returns the same figures as a dict. Going through the whole CLI instead
(`vllm.entrypoints.cli.main.main`) would build every subcommand's parser at every run, `vllm serve`'s engine
arguments and every `vllm bench` kind among them: seconds to tens of seconds a run, measured in the image.

One JSON object a line. On start, on the process's first stdout: {"ready": true, "import_s": S} once that is done,
or {"ready": false, "error": ...} and exit 3. Then for each request {"args": [...], "log": PATH} read from stdin: the
run, its output (stdout and stderr) appended to PATH, and the answer {"rc": N, "error": ...}. The end of stdin ends
it.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import time
import traceback
from types import ModuleType
from typing import IO, Any


def answer(replies: IO[str], **fields: Any) -> None:
    replies.write(json.dumps(fields) + "\n")
    replies.flush()


def run(bench: ModuleType, parser: Any, args: list[str], log: str) -> tuple[int, str | None]:
    """`vllm bench serve ARGS` in this process, fds 1 and 2 on the run's log; its exit status and, if not 0, why."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    argv = sys.argv
    rc: int
    error: str | None = None
    with open(log, "ab") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        sys.argv = ["vllm", "bench", "serve", *args]
        try:
            bench.main(parser.parse_args(args))
            rc = 0
        except SystemExit as exc:  # argparse's errors, and any sys.exit on the way
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            error = None if rc == 0 else f"`vllm bench serve` exited {exc.code}"
        except Exception as exc:
            traceback.print_exc()
            rc, error = 1, f"`vllm bench serve` raised {type(exc).__name__}: {str(exc)[:300]}"
        finally:
            sys.argv = argv
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    # vLLM freezes the heap before each run (its freeze_gc_heap); the next run's prompts need none of this one's.
    gc.unfreeze()
    gc.collect()
    return rc, error


def main() -> int:
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # until the first run, anything printed goes where this process's errors go
    if os.environ.get("VLLM_USE_RUST_BENCH", "").strip().lower() in ("1", "true"):
        answer(replies, ready=False, error="VLLM_USE_RUST_BENCH hands `vllm bench serve` to another program, which "
               "replaces this one: unset it, or run the sweep with --client per-run")
        return 3
    began = time.monotonic()
    try:
        bench = importlib.import_module("vllm.benchmarks.serve")
        argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
        platforms = importlib.import_module("vllm.platforms")
        if platforms.current_platform.is_unspecified():
            setattr(platforms, "current_platform", importlib.import_module("vllm.platforms.cpu").CpuPlatform())  # noqa: B010
        parser = argparse_utils.FlexibleArgumentParser(prog="vllm bench serve")
        bench.add_cli_args(parser)
    except Exception as exc:
        answer(replies, ready=False, error=f"{sys.executable} cannot import vLLM's benchmark "
               f"(vllm.benchmarks.serve): {type(exc).__name__}: {str(exc)[:300]}")
        return 3
    answer(replies, ready=True, import_s=round(time.monotonic() - began, 3), python=sys.executable)
    for line in sys.stdin:
        request = json.loads(line)
        rc, error = run(bench, parser, [str(a) for a in request["args"]], str(request["log"]))
        answer(replies, rc=rc, error=error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
