"""Every T4SERVE_* variable in the environment is known: a setting (the settings table) or one of the names below,
read by t4serve's host tools, compose.yaml, its scripts or its tests. Any other is a typo, refused by every command
(`unknown_variables`, a ConfigError naming the closest known name), never silently ignored.

A new setting needs nothing here: its row in the settings table makes it known. A new variable read elsewhere gets a
row in OTHER_VARIABLES (tests/unit/test_config_names.py finds every T4SERVE_ name the repository spells).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from t4serve.config.settings import VARIABLES
from t4serve.errors import ConfigError
from t4serve.untrusted import printable

PREFIX = "T4SERVE_"

# Name -> what reads it. docs/reference.md lists them (`t4serve env --reference`).
OTHER_VARIABLES: dict[str, str] = {
    # The host tools (`t4serve host-check`, `t4serve mcp`; docs/mcp.md).
    "T4SERVE_COMPOSE_FILE": "host-check, mcp: the compose file (default ./compose.yaml)",
    "T4SERVE_COMPOSE_PROJECT": "host-check, mcp: the compose project",
    "T4SERVE_MCP_COMPOSE": "mcp: the compose command",
    "T4SERVE_MCP_DATA_DIR": "mcp: its results and locks",
    "T4SERVE_MCP_TOKEN": "mcp --http: the bearer token",
    "T4SERVE_MCP_TOKEN_FILE": "mcp --http: the file holding the bearer token",
    "T4SERVE_MCP_TOOLSETS": "mcp: the toolsets published",
    "T4SERVE_MCP_READ_ONLY": "mcp: read-only tools only",
    "T4SERVE_MCP_DISABLE_DESTRUCTIVE": "mcp: no destructive tools",
    "T4SERVE_MCP_DENY_TOOLS": "mcp: tools left out",
    # compose.yaml's interpolation (and the host tools, which pass them to compose).
    "T4SERVE_IMAGE": "compose.yaml, scripts/build-image, host-check, mcp: the image tag",
    "T4SERVE_BASE_IMAGE": "compose.yaml, scripts/build-image: the image's base",
    "T4SERVE_GPU": "compose.yaml: the GPU the service reserves",
    "T4SERVE_PUBLISH_PORT": "compose.yaml: the host port of the API",
    "T4SERVE_TELEMETRY_PUBLISH_PORT": "compose.yaml: the host port of /metrics",
    "T4SERVE_VOLUME_PREFIX": "compose.yaml: the cache volumes' names",
    # The Turing clamp (docs/operations.md).
    "T4SERVE_SHARED_MEMORY_PER_BLOCK": "the Turing clamp: the shared memory per block it clamps to",
    "T4SERVE_SHARED_MEMORY_OVERRIDE": "the Turing clamp's proof: the limit its worker pretends",
    # The scripts.
    "T4SERVE_VERSION": "scripts/build-image",
    "T4SERVE_SOURCE_URL": "scripts/build-image",
    "T4SERVE_LOCAL_BASE_IMAGE": "scripts/base-image, scripts/build-image",
    "T4SERVE_BUILD_CONTEXT": "scripts/build-image",
    "T4SERVE_DEBIAN_MIRROR": "scripts/base-image",
    "T4SERVE_DOCKERD_LOG": "scripts/docker-engine",
    "T4SERVE_DOCKERD_WAIT": "scripts/docker-engine",
    "T4SERVE_PUSH_TIMEOUT_S": "scripts/publish",
    "T4SERVE_BENCH_SKIP_COLD": "scripts/bench-image",
    "T4SERVE_TEST_SKIP_IMAGE": "scripts/test",
    # The tests (their runners pass them to the t4serve commands they start).
    "T4SERVE_UPDATE_GOLDEN": "tests/unit",
    "T4SERVE_REGISTRY_BIN": "tests/image",
    "T4SERVE_VENDORED_VLLM": "tests/gpu",
    "T4SERVE_WRAPPER_BIN": "tests/gpu",
    "T4SERVE_IMAGE_ROOT": "tests/gpu",
    "T4SERVE_GPU_ROOT": "tests/gpu",
    "T4SERVE_GPU_RUNNER": "tests/gpu",
    "T4SERVE_GPU_SITE": "tests/gpu",
    "T4SERVE_GPU_WORK": "tests/gpu",
    "T4SERVE_GPU_RESULTS": "tests/gpu",
    "T4SERVE_GPU_CHECKPOINTS": "tests/gpu",
    "T4SERVE_GPU_STARTS": "tests/gpu",
    "T4SERVE_GPU_DEADLINE": "tests/gpu",
    "T4SERVE_GPU_STEP_STARTED": "tests/gpu",
    "T4SERVE_GPU_PROBE_DIR": "tests/gpu",
    "T4SERVE_GPU_VLLM_ARGS": "tests/gpu",
    "T4SERVE_GPU_KV_ARGS": "tests/gpu",
    "T4SERVE_GPU_BENCH_ARGS": "tests/gpu",
    "T4SERVE_GPU_TURING_ARGS": "tests/gpu",
    "T4SERVE_GPU_MTP_ARGS": "tests/gpu",
    "T4SERVE_GPU_STEP_TIMING": "tests/gpu: each engine step's GPU time, in every vLLM process",
    "T4SERVE_GPU_AS_T4": "tests/gpu: the GPU host's T4 mode, in every vLLM process",
    "T4SERVE_GPU_AS_T4_RECORDS": "tests/gpu",
    "T4SERVE_GPU_LAUNCHES": "tests/gpu",
    "T4SERVE_GPU_TURING_CHOICE": "tests/gpu",
    "T4SERVE_DIST_DIR": "tests/gpu",
}
# The image tests' stand-in for vLLM (tests/standin/vllm_standin.py) reads its knobs under this prefix; no setting
# starts with it, so a typo of a setting never passes as one of them.
STANDIN_PREFIX = "T4SERVE_STANDIN_"


def known_names() -> list[str]:
    """Every T4SERVE_ name t4serve knows: the settings first, then the others."""
    settings = [v.name for v in VARIABLES if v.name.startswith(PREFIX)]
    return settings + [name for name in OTHER_VARIABLES if name not in settings]


def is_known(name: str) -> bool:
    return name in known_names() or name.startswith(STANDIN_PREFIX)


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The known name `name` most likely misspells (compared without the shared prefix), or None."""
    by_suffix = {c[len(PREFIX) :]: c for c in candidates}
    match = difflib.get_close_matches(name[len(PREFIX) :], list(by_suffix), n=1, cutoff=0.6)
    return by_suffix[match[0]] if match else None


def unknown_variables(environ: Mapping[str, str]) -> ConfigError | None:
    """The ConfigError for every T4SERVE_* name in `environ` that t4serve does not know (values never shown: one may
    be a secret under a misspelt name), or None."""
    # printable: a name is as untrusted as a value (a control character must not reach the terminal).
    unknown = sorted(printable(n)[:80] for n in environ if n.startswith(PREFIX) and not is_known(n))
    if not unknown:
        return None
    known = known_names()
    guesses = {name: closest(name, known) for name in unknown}
    fixes = [f"rename {n} to {g}" if g else f"unset {n}" for n, g in guesses.items()]
    names = ", ".join(unknown)
    if len(unknown) == 1:
        guess = guesses[unknown[0]]
        what = f"{unknown[0]} is not a t4serve variable" + (f" (did you mean {guess}?)" if guess else "")
    else:
        what = f"{len(unknown)} T4SERVE_* variables t4serve does not know: {names}"
    return ConfigError(
        what,
        found=f"{names} in the environment",
        required="T4SERVE_* names t4serve reads: the settings (`t4serve env` lists them) and the others "
        "docs/reference.md names",
        fix="; ".join(fixes),
    )


def other_variables_markdown() -> str:
    """docs/reference.md's table of the T4SERVE_ names that are not settings."""
    lines = ["| Variable | Read by |", "|---|---|"]
    lines += [f"| `{name}` | {reader} |" for name, reader in OTHER_VARIABLES.items()]
    lines.append(f"| `{STANDIN_PREFIX}*` | tests/standin/vllm_standin.py, the image tests' stand-in for vLLM |")
    return "\n".join(lines) + "\n"
