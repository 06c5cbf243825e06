"""Which tools `t4serve mcp` publishes, and how: the `tool` decorator puts a method's title, tool set and hints (what
it does to the deployment) beside its code, and records it in REGISTRY.

A method is a tool only through `@tool`, and its hints come with it: a tool cannot be published without them, nor
defined and left out of the list. t4serve.mcp.server lists REGISTRY's tools group by group (a tool of a group it does
not know is an error there) and publishes them under the operator's modes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from mcp.types import ToolAnnotations

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ToolSpec:
    """How a tool is published: its title, its tool set, hints that say what it does to the deployment, and the
    ToolGroup class whose method it is."""

    title: str
    toolset: str
    annotations: ToolAnnotations
    owner: str


# Tool name -> how it is published, as the tool modules define them (t4serve.mcp.server.TOOLS orders them).
REGISTRY: dict[str, ToolSpec] = {}


def hints(*, read_only: bool, destructive: bool, idempotent: bool, open_world: bool) -> ToolAnnotations:
    """MCP's tool annotations. open_world: the tool reaches outside this host (the HF hub for a checkpoint's files, the
    package indexes for a build)."""
    return ToolAnnotations(read_only_hint=read_only, destructive_hint=destructive, idempotent_hint=idempotent,
                           open_world_hint=open_world)  # fmt: skip


READ_ONLY = hints(read_only=True, destructive=False, idempotent=True, open_world=False)


def tool(title: str, toolset: str, annotations: ToolAnnotations) -> Callable[[F], F]:
    """Publish the decorated ToolGroup method as the tool of its name, with this title, tool set and hints."""

    def register(fn: F) -> F:
        name = fn.__name__
        owner, _, _ = fn.__qualname__.rpartition(".")
        if not owner or name.startswith("_"):
            raise TypeError(f"@tool marks a public method of a ToolGroup, not {fn.__qualname__}")
        if name in REGISTRY:
            raise TypeError(f"two tools are named {name} ({REGISTRY[name].owner} and {owner})")
        REGISTRY[name] = ToolSpec(title, toolset, annotations, owner)
        return fn

    return register
