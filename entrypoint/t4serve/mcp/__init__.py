"""`t4serve mcp`: the deployment's tools over the Model Context Protocol, for an AI assistant on the host.

`server` (the MCP server: which tools the operator's modes publish), `registry` (the `@tool` decorator: each tool's
title, tool set and hints beside its code), `checktools`, `servertools` and `benchtools` (the tools, one class per
group), `models` (their typed results), `calls` (how a call runs: errors, redaction, worker threads, progress,
cancellation, the deployment's lock) and `deploylock`. It manages the compose deployment through t4serve.host;
docs/mcp.md lists the tools.
"""
