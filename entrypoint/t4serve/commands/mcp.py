"""`t4serve mcp [--http HOST:PORT] [--read-only] [--disable-destructive] [--toolsets ...] [--deny-tools ...]`: the
deployment's tools for an AI assistant, over MCP.

Runs on the host (pip install 't4serve[mcp]', or uvx) and manages the compose deployment through the Docker Engine
(t4serve.engine); the tools are in t4serve.mcptools and docs/mcp.md lists them. The operator shapes what an assistant
may do: only the read-only tools, none of the destructive ones, only some tool sets, or not some tools. stdio by
default; `--http` serves streamable HTTP at http://HOST:PORT/mcp, 127.0.0.1 unless told otherwise, and then requires
a bearer token from T4SERVE_MCP_TOKEN or T4SERVE_MCP_TOKEN_FILE (both set is an error) and checks the Host and Origin
headers against an allow-list (the MCP SDK's DNS-rebinding protection, on). The token is compared in constant time
and never logged; the scheme is matched case-insensitively (RFC 9110). This server has no OAuth: a 401 says to send
the static token, and the OAuth discovery paths answer 404 saying the same, so a client does not go looking for an
authorization server.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from t4serve.commands.host_check import compose_file_option, project_option
from t4serve.errors import ConfigError

TOKEN_MIN_CHARS = 16
WILDCARDS = ("0.0.0.0", "::", "[::]", "")


def read_token(environ: Mapping[str, str]) -> str:
    """The HTTP transport's bearer token: T4SERVE_MCP_TOKEN, or the first line of T4SERVE_MCP_TOKEN_FILE."""
    value, file = environ.get("T4SERVE_MCP_TOKEN", ""), environ.get("T4SERVE_MCP_TOKEN_FILE", "")
    fix = "openssl rand -hex 32 > mcp_token && chmod 600 mcp_token; T4SERVE_MCP_TOKEN_FILE=$PWD/mcp_token"
    if value and file:
        raise ConfigError(
            "T4SERVE_MCP_TOKEN and T4SERVE_MCP_TOKEN_FILE are both set",
            found="both variables set",
            required="one of them",
            fix="unset one",
        )
    if file:
        try:
            lines = Path(file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"T4SERVE_MCP_TOKEN_FILE={file}: cannot read it",
                found=f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}",
                required="a readable file holding the token",
                fix=fix,
            ) from None
        value = lines[0].strip() if lines else ""
    if not value:
        raise ConfigError(
            "--http needs a bearer token",
            found="T4SERVE_MCP_TOKEN and T4SERVE_MCP_TOKEN_FILE unset" if not file else f"{file} is empty",
            required="a token clients send as `Authorization: Bearer TOKEN`",
            fix=fix,
        )
    if len(value) < TOKEN_MIN_CHARS or not value.isprintable() or " " in value:
        raise ConfigError(
            "the MCP token is unusable",
            found=f"{len(value)} characters" + ("" if value.isprintable() else ", unprintable ones"),
            required=f"at least {TOKEN_MIN_CHARS} printable characters without spaces",
            fix=fix,
        )
    return value


def parse_listen(raw: str) -> tuple[str, int]:
    host, sep, port = raw.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", raw
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(
            f"--http {raw}: not HOST:PORT", found=raw, required="e.g. 127.0.0.1:8765", fix="--http 127.0.0.1:8765"
        )
    return host, int(port)


def allowed_hosts(host: str, port: int, extra: tuple[str, ...]) -> list[str]:
    """Host header values the server answers: the address it listens on (loopback names for loopback), and each
    --allowed-host (a name clients use, with or without :PORT)."""
    names: list[str] = []
    if host not in WILDCARDS:
        names.append(f"[{host}]" if ":" in host else host)
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if loopback:
            names += ["127.0.0.1", "localhost", "[::1]"]
    names += list(extra)
    hosts = list(dict.fromkeys(_with_port(name, port) for name in names))
    if not hosts:
        raise ConfigError(
            f"--http {host}:{port} listens on every address, so the Host allow-list needs names",
            found="no --allowed-host",
            required="the host name(s) clients connect with",
            fix=f"--allowed-host my-gpu-box (repeatable), or --http 127.0.0.1:{port}",
        )
    return hosts


def _with_port(name: str, port: int) -> str:
    """NAME -> NAME:PORT; a name that has its port (host:8765, [::1]:8765) stays."""
    if name.startswith("["):
        return name if "]:" in name else f"{name}:{port}"
    return name if ":" in name else f"{name}:{port}"


STATIC_TOKEN_HELP = (
    "this MCP server takes a static bearer token, not OAuth: configure the client to send the header "
    "'Authorization: Bearer <token>' with the token t4serve mcp was given (T4SERVE_MCP_TOKEN or T4SERVE_MCP_TOKEN_FILE)"
)
# Where MCP clients look for OAuth metadata (RFC 9728, RFC 8414, OpenID Connect discovery) and register (RFC 7591).
OAUTH_PATHS = ("/.well-known/oauth-protected-resource", "/.well-known/oauth-authorization-server",
               "/.well-known/openid-configuration", "/register", "/authorize", "/token")  # fmt: skip


def bearer_matches(given: bytes, token: bytes) -> bool:
    """`given` is an Authorization value with the bearer scheme (any case, RFC 9110 11.1) and `token`, compared in
    constant time."""
    scheme, _, credentials = given.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), token)


class BearerToken:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer TOKEN`, else 401 saying to send it; the
    OAuth discovery and registration paths answer 404 saying there is no OAuth here."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            path = str(scope.get("path", ""))
            if any(path == p or path.startswith(p + "/") for p in OAUTH_PATHS):
                await _answer(send, 404, {"error": "not_found", "error_description": STATIC_TOKEN_HELP}, [])
                return
            given = b""
            for key, value in scope.get("headers", []):
                if key.lower() == b"authorization":
                    given = value
            if not bearer_matches(given, self.token):
                # RFC 6750 3.1: no error code when no credentials came, invalid_token when wrong ones did.
                challenge = b'Bearer realm="t4serve mcp"'
                if given:
                    challenge += b', error="invalid_token", error_description="the bearer token is not this server\'s"'
                body = {"error": "invalid_token" if given else "unauthorized", "error_description": STATIC_TOKEN_HELP}
                await _answer(send, 401, body, [(b"www-authenticate", challenge)])
                return
        await self.app(scope, receive, send)


async def _answer(send: Any, status: int, body: dict[str, str], headers: list[tuple[bytes, bytes]]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                        *headers],
        }
    )  # fmt: skip
    await send({"type": "http.response.body", "body": data})


def http_app(server: Any, token: str, hosts: list[str]) -> Any:
    """The SDK's streamable-HTTP app with its DNS-rebinding protection on (Host and Origin allow-lists), behind the
    bearer token."""
    from mcp.server.transport_security import TransportSecuritySettings

    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts],
    )
    return BearerToken(server.streamable_http_app(transport_security=security), token)


@click.command("mcp")
@click.option(
    "--http",
    "listen",
    metavar="HOST:PORT",
    default=None,
    help="Serve streamable HTTP at http://HOST:PORT/mcp (needs T4SERVE_MCP_TOKEN or _FILE); default stdio.",
)
@click.option(
    "--allowed-host",
    "extra_hosts",
    multiple=True,
    metavar="NAME[:PORT]",
    help="A Host header value to accept besides the listen address (repeatable).",
)
@click.option("--read-only", is_flag=True, envvar="T4SERVE_MCP_READ_ONLY",
              help="Publish only the read-only tools [env T4SERVE_MCP_READ_ONLY=1].")
@click.option("--disable-destructive", is_flag=True, envvar="T4SERVE_MCP_DISABLE_DESTRUCTIVE",
              help="Hide the destructive tools: stop_vllm_server, apply_turing_patch [env "
              "T4SERVE_MCP_DISABLE_DESTRUCTIVE=1].")
@click.option("--toolsets", metavar="SET,...", default=None, envvar="T4SERVE_MCP_TOOLSETS",
              help="Publish only these tool sets: host, image, plan, server, status, query, bench [default: all; env "
              "T4SERVE_MCP_TOOLSETS].")
@click.option("--deny-tools", metavar="TOOL,...", default=None, envvar="T4SERVE_MCP_DENY_TOOLS",
              help="Never publish these tools [env T4SERVE_MCP_DENY_TOOLS].")
@compose_file_option
@project_option
def command(
    listen: str | None,
    extra_hosts: tuple[str, ...],
    read_only: bool,
    disable_destructive: bool,
    toolsets: str | None,
    deny_tools: str | None,
    compose_file: Path | None,
    project: str | None,
) -> int:
    """Serve the deployment's tools (host checks, plan, start/stop, status, logs, query, benchmark) over MCP."""
    try:
        from t4serve.mcptools import ToolEnv, build_server, default_data_dir, parse_modes
    except ImportError as exc:
        raise ConfigError(
            "t4serve mcp needs the MCP SDK",
            found=f"{exc}",
            required="t4serve installed with its mcp extra",
            fix="pip install 't4serve[mcp]' (or: uvx --from 't4serve[mcp]' t4serve mcp)",
        ) from None
    from t4serve.engine import engine_from_environ

    modes = parse_modes(read_only, disable_destructive, toolsets, deny_tools)
    environ = dict(os.environ)
    engine = engine_from_environ(environ, compose_file=compose_file, project=project)
    env = ToolEnv(engine=engine, environ=environ, data_dir=default_data_dir(environ), compose_file=engine.compose_file)
    if not engine.compose_file.is_file():
        click.echo(
            f"t4serve mcp: warning: no compose file at {engine.compose_file}; the tools that manage the service "
            "answer with an error until --compose-file (or T4SERVE_COMPOSE_FILE) names t4serve's compose.yaml",
            err=True,
        )
    server = build_server(env, modes=modes)
    if listen is None:
        server.run("stdio")
        return 0
    host, port = parse_listen(listen)
    token = read_token(environ)
    app = http_app(server, token, allowed_hosts(host, port, extra_hosts))

    import anyio
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    click.echo(f"t4serve mcp: streamable HTTP on http://{host}:{port}/mcp (bearer token required)", err=True)
    anyio.run(uvicorn.Server(config).serve)
    return 0
