"""What vLLM's own parser makes of `vllm serve MODEL ARGS...`, for tests/image/test_vllm_argv.py (run in the image,
where vLLM is installed): one JSON argument list per line on stdin, one answer per line on stdout:
{"ok": true, "values": {dest: value}} for the dests named on the command line (JSON-able values as they are, others
as repr), or {"ok": false, "error": "..."} where the parser refuses the arguments (argparse's exit, or an exception
of vLLM's own preprocessing such as the IndexError of a dotted key with no value).

The parser is built as `vllm` builds it (vllm/entrypoints/cli/main.py) on the CPU platform (VLLM_TARGET_DEVICE=cpu:
no GPU to ask; the options are the same as CUDA's).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys


def main(dests: list[str]) -> int:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    out, sys.stdout = sys.stdout, sys.stderr  # what vLLM prints stays off the answers
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(description="vLLM CLI")
    ServeSubcommand().subparser_init(top.add_subparsers(required=False, dest="subparser"))
    for line in sys.stdin:
        argv = json.loads(line)
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                ns = top.parse_args(["serve", "the-model", *argv])
        except SystemExit as exc:
            answer = {"ok": False, "error": f"exit {exc.code}"}
        except Exception as exc:  # vLLM's preprocessing raises plain exceptions (IndexError, ValueError)
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        else:
            answer = {"ok": True, "values": {d: getattr(ns, d, None) for d in dests}}
        out.write(json.dumps(answer, default=repr) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
