"""vLLM's general plugin `t4serve_turing_attention`: in each vLLM process, run the attention path t4serve's plan chose.

vLLM loads the `vllm.general_plugins` entry points in every process it starts (API server, engine core, workers)
before the model is built. `t4serve serve` puts the path its plan resolved into vLLM's environment as
T4SERVE_ATTENTION (`turing-mma` or `triton`; the user's `auto` never reaches vLLM). With `turing-mma` this installs
the lowering hook into Triton and the launch table into vLLM's Triton attention; anything else leaves vLLM as it is.
A failure to install raises, so vLLM stops at start rather than serving a path the plan did not choose.
"""

from __future__ import annotations

import logging
import os

from t4serve.turing.launch import PATHS, TURING_MMA

VARIABLE = "T4SERVE_ATTENTION"
TARGET_MODULE = "vllm.v1.attention.ops.triton_unified_attention"
# The line each vLLM process logs once the path is in place (tests/gpu/turing_served.py looks for it).
INSTALLED_LINE = "t4serve attention path turing-mma installed (pid %d): %s"

logger = logging.getLogger("vllm.t4serve_turing_attention")


def register() -> None:
    path = os.environ.get(VARIABLE, "").strip()
    if path != TURING_MMA:
        if path and path not in PATHS:
            logger.info("t4serve attention: %s=%s is resolved by `t4serve serve`; vLLM's own launch runs", VARIABLE,
                        path)
        return
    import importlib

    from t4serve.turing import hook, launch

    module = importlib.import_module(TARGET_MODULE)
    hook.install()
    proxy = launch.install(module)
    logger.info(INSTALLED_LINE, os.getpid(), f"{len(proxy.table)} launches, Triton lowering hook {hook.HOOK_VERSION}")
