"""`t4serve mcp`: the deployment's tools over the Model Context Protocol, for an AI assistant on the host.

Runs on the host and manages the compose deployment through t4serve.host; docs/mcp.md lists the tools.
"""
