"""The MCP server of `t4serve mcp`: the tools the operator's modes allow, published with their titles and hints.

The tools are the methods the tool modules mark with t4serve.mcp.registry.tool: their groups (checktools, servertools,
benchtools) are listed in TOOL_GROUPS in the order a deployment goes through, and TOOLS lists the tools so.
`build_server(env, modes)` publishes those `Modes` allow, with their arguments taken strictly as JSON gives them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import ConfigDict, ValidationError

from t4serve import __version__
from t4serve.errors import ConfigError
from t4serve.mcp import registry
from t4serve.mcp.benchtools import BenchTools
from t4serve.mcp.calls import ToolEnv, ToolGroup
from t4serve.mcp.checktools import CheckTools
from t4serve.mcp.registry import ToolSpec
from t4serve.mcp.servertools import ServerTools
from t4serve.untrusted import redact, shown

# Every group of tools, in the order a deployment goes through them; each tool is one of their methods, marked @tool.
TOOL_GROUPS: tuple[type[ToolGroup], ...] = (CheckTools, ServerTools, BenchTools)


def tools_in_order(groups: Sequence[type[ToolGroup]]) -> dict[str, ToolSpec]:
    """The registered tools, group by group in `groups`' order and within a group in the order its class defines them;
    a TypeError for a tool of a class that is not among `groups` (it would never be published)."""
    names = {cls.__qualname__ for cls in groups}
    stray = sorted(f"{spec.owner}.{name}" for name, spec in registry.REGISTRY.items() if spec.owner not in names)
    if stray:
        raise TypeError(f"tools of a class t4serve.mcp.server does not publish: {', '.join(stray)}")
    return {name: spec for cls in groups for name, spec in registry.REGISTRY.items() if spec.owner == cls.__qualname__}


TOOLS: Mapping[str, ToolSpec] = tools_in_order(TOOL_GROUPS)
TOOLSETS = tuple(dict.fromkeys(spec.toolset for spec in TOOLS.values()))
TOOL_ANNOTATIONS: dict[str, ToolAnnotations] = {name: spec.annotations for name, spec in TOOLS.items()}


@dataclass(frozen=True)
class Modes:
    """What the operator lets an assistant do: only read-only tools; no destructive ones (stop, the image build);
    only some tool sets (None: all); not these tools."""

    read_only: bool = False
    disable_destructive: bool = False
    toolsets: frozenset[str] | None = None
    deny: frozenset[str] = field(default_factory=frozenset)

    def allows(self, name: str) -> bool:
        spec = TOOLS[name]
        hints = spec.annotations
        if self.read_only and not hints.read_only_hint:
            return False
        if self.disable_destructive and hints.destructive_hint:
            return False
        if self.toolsets is not None and spec.toolset not in self.toolsets:
            return False
        return name not in self.deny

    def published(self) -> list[str]:
        return [name for name in TOOLS if self.allows(name)]


def parse_modes(read_only: bool, disable_destructive: bool, toolsets: str | None, deny_tools: str | None) -> Modes:
    """Modes from the flags (or their variables): comma-separated tool sets and tool names, each checked."""

    def names(raw: str | None, known: Sequence[str], what: str, flag: str) -> frozenset[str]:
        given = [n.strip() for n in (raw or "").split(",") if n.strip()]
        unknown = [n for n in given if n not in known]
        if unknown:
            raise ConfigError(
                f"{flag}: {', '.join(unknown)} is not a {what}",
                found=raw or "",
                required=f"{what}s from: {', '.join(known)}",
                fix=f"{flag} {','.join(known[:3])}",
            )
        return frozenset(given)

    chosen = names(toolsets, TOOLSETS, "tool set", "--toolsets") if toolsets and toolsets.strip() else None
    modes = Modes(read_only, disable_destructive, chosen, names(deny_tools, list(TOOLS), "tool", "--deny-tools"))
    if not modes.published():
        raise ConfigError(
            "t4serve mcp: these modes leave no tool to publish",
            found=f"read-only {read_only}, disable-destructive {disable_destructive}, toolsets {toolsets or 'all'}, "
            f"denied {deny_tools or 'none'}",
            required="at least one tool",
            fix="widen --toolsets or shorten --deny-tools",
        )
    return modes


def build_server(env: ToolEnv, read_only: bool = False, modes: Modes | None = None) -> MCPServer:
    """The MCP server with the tools the modes allow (`read_only=True`: the read-only ones)."""
    modes = modes or Modes(read_only=read_only)
    server: MCPServer = MCPServer(
        name="t4serve",
        version=__version__,
        instructions=(
            "Serve Gemma 4 E2B with vLLM on a Tesla T4 (or any Turing-or-newer NVIDIA GPU) through Docker compose. "
            "In order: check_host_capacity, verify_gpu_arch, apply_turing_patch (only when the image is missing or "
            "verify_turing_patch fails), plan, start_vllm_server, then server_status until ready; query, "
            "run_benchmark / benchmark_status; stop_vllm_server. Tools that change the deployment answer 'busy' "
            "while another such call runs; long tools report progress and can be cancelled."
        ),
    )
    groups = {cls.__qualname__: cls(env) for cls in TOOL_GROUPS}
    for name in modes.published():
        spec = TOOLS[name]
        server.add_tool(getattr(groups[spec.owner], name), name=name, title=spec.title, annotations=spec.annotations,
                        structured_output=True)  # fmt: skip
    strict_arguments(server, env.secrets)
    return server


def strict_arguments(server: MCPServer, secrets: Callable[[], Sequence[str]] = list) -> None:
    """Every tool's arguments taken as JSON gives them, without pydantic's lax coercion (it reads the string "1_0" as
    the integer 10, true as 1 and "nan" as a float): an integer must be a JSON integer, a string a string, as
    t4serve.untrusted takes numbers everywhere else; and no argument of another name. The published input schema says
    so (`additionalProperties: false` on every object but the settings, whose names it lists). The SDK has no public
    hook for this, so its tool manager is reached here (pinned mcp>=2.3,<3; the hardening tests fail if it moves)."""
    for tool in server._tool_manager.list_tools():
        lax = tool.fn_metadata.arg_model
        # extra="forbid": an argument of another name ({"gpu": 1} for gpu_device) is refused, never dropped silently.
        config = ConfigDict(arbitrary_types_allowed=True, strict=True, extra="forbid")
        strict = type(lax.__name__, (lax,), {"model_config": config, "__module__": __name__})
        tool.fn_metadata.arg_model = strict
        tool.parameters = tool.fn_metadata.arg_model.model_json_schema(by_alias=True)
        object.__setattr__(tool, "run", _explained(tool.name, tool.run, sorted(lax.model_fields), secrets))


def _explained(name: str, run: Callable[..., Awaitable[Any]], names: list[str],
               secrets: Callable[[], Sequence[str]]) -> Callable[..., Awaitable[Any]]:  # fmt: skip
    """`run` of one tool, its argument errors (pydantic's text) rewritten as what was found, what is required and the
    fix, each quoted value redacted, then cut (untrusted.shown)."""

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await run(*args, **kwargs)
        except ToolError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ValidationError):
                raise
            known = secrets()
            found = []
            for error in cause.errors()[:10]:
                where = ".".join(str(part) for part in error["loc"]) or "the arguments"
                given = shown(redact(json.dumps(error.get("input"), default=str)[:100_000], known), 80)
                where = shown(redact(where, known), 80)
                if error["type"] == "extra_forbidden":
                    found.append(f"{where}: not an argument of {name} (given {given})")
                else:
                    found.append(f"{where}: {error['msg']} (given {given})")
            raise ToolError(f"Error executing tool {name}: " + ConfigError(
                "invalid arguments",
                found="; ".join(found),
                required=f"the arguments of {name}'s input schema, as JSON types (an integer as a JSON integer, text "
                f"as a string); its arguments: {', '.join(names) or 'none'}",
                fix="call it again with those names and types (tools/list shows its schema)",
            ).message()) from None

    return wrapper


def default_data_dir(environ: Mapping[str, str]) -> Path:
    raw = environ.get("T4SERVE_MCP_DATA_DIR")
    if raw:
        return Path(raw)
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "t4serve-mcp"
