"""`t4serve mcp [--http HOST:PORT] [--read-only] [--disable-destructive] [--toolsets ...] [--deny-tools ...]`: the
deployment's tools for an AI assistant, over MCP.

Runs on the host (`pip install '.[mcp]'` from a checkout of t4serve, or uvx) and manages the compose deployment through
the Docker Engine (t4serve.host.engine); the tools are in t4serve.mcp (published by t4serve.mcp.server) and docs/mcp.md
lists them. The operator shapes what an assistant may do: only the read-only tools, none of the destructive ones, only
some tool sets, or not some tools. stdio by default; `--http` serves streamable HTTP at http://HOST:PORT/mcp, 127.0.0.1
unless told otherwise, and then requires a bearer token from T4SERVE_MCP_TOKEN or T4SERVE_MCP_TOKEN_FILE (both set is an
error) and checks the Host and Origin headers against an allow-list (the MCP SDK's DNS-rebinding protection, on). The
token is compared in constant time and never logged; the scheme is matched case-insensitively (RFC 9110). This server
has no OAuth: a 401 says to send the static token, and the OAuth discovery paths answer 404 saying the same, so a client
does not go looking for an authorization server.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import click

from t4serve.commands.host_check import compose_file_option, project_option
from t4serve.errors import ConfigError, InternalError
from t4serve.untrusted import Untrusted, check_host, json_depth, parse_int, printable, read_text_bounded

TOKEN_MIN_CHARS = 16
# A token file holds one token and a newline; anything larger is not one.
TOKEN_FILE_MAX_BYTES = 64 * 1024
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
            # The shared bounded reader: a FIFO, /dev/zero or a huge file is refused at once, never read whole.
            lines = read_text_bounded(Path(file), TOKEN_FILE_MAX_BYTES, "the token file").splitlines()
        except (FileNotFoundError, Untrusted) as exc:
            raise ConfigError(
                f"T4SERVE_MCP_TOKEN_FILE={printable(file)}: cannot read it",
                found=exc.reason if isinstance(exc, Untrusted) else f"{printable(file)}: no such file",
                required=f"a regular UTF-8 file of at most {TOKEN_FILE_MAX_BYTES:,} bytes holding the token",
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
    """--http HOST:PORT (or PORT alone, on 127.0.0.1): the host through the one host check and the port through the
    one integer parser (t4serve.untrusted), so `0x10` is no address and `\u0663` no port."""
    host, sep, port = raw.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", raw
    host = host.strip("[]") or "127.0.0.1"
    try:
        return check_host(host), parse_int(port, 1, 65535)
    except Untrusted as exc:
        shown = printable(raw[:200])
        raise ConfigError(
            f"--http {shown}: not HOST:PORT ({exc.reason})",
            found=shown,
            required="an IP address or host name, a colon, and a port from 1 to 65535 in ASCII digits",
            fix="--http 127.0.0.1:8765",
        ) from None


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
    names += [_allowed_host(name) for name in extra]
    hosts = list(dict.fromkeys(_with_port(name, port) for name in names))
    if not hosts:
        raise ConfigError(
            f"--http {host}:{port} listens on every address, so the Host allow-list needs names",
            found="no --allowed-host",
            required="the host name(s) clients connect with",
            fix=f"--allowed-host my-gpu-box (repeatable), or --http 127.0.0.1:{port}",
        )
    return hosts


def _allowed_host(raw: str) -> str:
    """An --allowed-host value, NAME or NAME:PORT ([IPv6]:PORT), through the same host and port checks as --http."""
    name, port = raw, None
    if raw.startswith("["):
        inner, _, rest = raw[1:].partition("]")
        name, port = inner, rest[1:] if rest.startswith(":") else (rest or None)
    elif raw.count(":") == 1:
        name, port = raw.split(":")
    try:
        check_host(name)
        if port is not None:
            parse_int(port, 1, 65535)
    except Untrusted as exc:
        shown = printable(raw[:200])
        raise ConfigError(
            f"--allowed-host {shown}: not NAME[:PORT] ({exc.reason})",
            found=shown,
            required="a host name or IP address clients connect with, optionally :PORT in ASCII digits",
            fix="--allowed-host my-gpu-box (or my-gpu-box:8765)",
        ) from None
    return raw


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
            # Exactly one Authorization header: with several, which one a proxy or the app behind reads is not ours
            # to guess, so more than one is refused like a wrong token.
            headers = [value for key, value in scope.get("headers", []) if key.lower() == b"authorization"]
            given = headers[0] if len(headers) == 1 else b""
            if len(headers) != 1 or not bearer_matches(given, self.token):
                # RFC 6750 3.1: no error code when no credentials came, invalid_token when wrong ones did.
                challenge = b'Bearer realm="t4serve mcp"'
                if headers:
                    challenge += b', error="invalid_token", error_description="the bearer token is not this server\'s"'
                body = {"error": "invalid_token" if headers else "unauthorized", "error_description": STATIC_TOKEN_HELP}
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


# Open HTTP sessions: a few assistants at once, each closed after this long without a request (a client that never
# sends DELETE is not kept for the SDK's 30 minutes); a new one past the cap is answered 503 until one closes.
MAX_HTTP_SESSIONS = 32
HTTP_SESSION_IDLE_S = 600.0


def http_app(server: Any, token: str, hosts: list[str]) -> Any:
    """The SDK's streamable-HTTP app with its DNS-rebinding protection on (Host and Origin allow-lists), behind the
    bearer token, its sessions capped in number and idle time."""
    from mcp.server.transport_security import TransportSecuritySettings

    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts],
    )
    app = server.streamable_http_app(transport_security=security, session_idle_timeout=HTTP_SESSION_IDLE_S,
                                     max_sessions=MAX_HTTP_SESSIONS)  # fmt: skip
    return BearerToken(app, token)


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
        from t4serve.mcp.calls import ToolEnv
        from t4serve.mcp.server import build_server, default_data_dir, parse_modes
    except ImportError as exc:
        raise ConfigError(
            "t4serve mcp needs the MCP SDK",
            found=f"{exc}",
            required="t4serve installed with its mcp extra",
            # t4serve is installed from its checkout: no package index publishes it.
            fix="from a checkout of t4serve: pip install '.[mcp]' (or: uvx --from '/path/to/t4serve[mcp]' t4serve "
            "mcp)",
        ) from None
    from t4serve.host.docker import engine_from_environ

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
        import anyio

        anyio.run(serve_stdio, server, sys.stdin.buffer)
        return 0
    host, port = parse_listen(listen)
    token = read_token(environ)
    app = http_app(server, token, allowed_hosts(host, port, extra_hosts))

    import anyio
    import uvicorn

    # Listening first, then announcing: an address that cannot be bound is exit 2 with the reason, where uvicorn
    # announced nothing useful and exited 3 (which reads as a failed preflight).
    sock = listen_socket(host, port)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    uv = uvicorn.Server(config)
    click.echo(f"t4serve mcp: streamable HTTP on http://{_url_host(host)}:{port}/mcp (bearer token required)",
               err=True)
    try:
        anyio.run(functools.partial(uv.serve, sockets=[sock]))
    except SystemExit as exc:  # uvicorn's own exit when the app's startup fails: a bug here, not a setting
        raise InternalError(
            "t4serve mcp: the HTTP server did not start",
            found=f"uvicorn exited {exc.code} while starting the MCP app",
            required="the MCP SDK's streamable-HTTP app to start",
            fix="run with the stdio transport (no --http) and report this with the lines above",
        ) from None
    finally:
        sock.close()
    return 0


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on HOST:PORT, or a ConfigError (exit 2) naming the address and why it cannot be used:
    in use, not an address of this host, a name that does not resolve, a port below 1024 without the right."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _name, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise _cannot_listen(host, port, exc) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise _cannot_listen(host, port, exc) from None
    return sock


def _cannot_listen(host: str, port: int, exc: OSError) -> ConfigError:
    return ConfigError(
        f"--http {_url_host(host)}:{port}: cannot listen there",
        found=f"{exc.strerror or exc}",
        required="a free port on an address of this host",
        fix=f"stop what listens on port {port} (`ss -ltnp`), or pick another: --http 127.0.0.1:8766",
    )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# ----- stdio, guarded


# One JSON-RPC message over stdio: the same bound as the SDK's streamable HTTP body (4 MiB); a longer line is refused
# without being held, however long it runs on.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Nesting deeper than any MCP message goes (the tools' arguments nest 3 levels); pydantic's parser stops near 200.
MAX_MESSAGE_DEPTH = 64


async def serve_stdio(server: Any, source: BinaryIO) -> None:
    """The MCP server over stdio, with every line checked before the SDK sees it (`GuardedLines`): the SDK drops a
    message it cannot parse without an answer, so a client waits forever for the reply to a malformed request."""
    from mcp.server.stdio import stdio_server

    lines = GuardedLines(source)
    async with stdio_server(stdin=lines) as (read_stream, write_stream):  # type: ignore[arg-type]
        lines.answers = write_stream
        # MCPServer.run_stdio_async, with these lines for stdin (the SDK has no public hook for a filtered stdin).
        low = server._lowlevel_server
        await low.run(read_stream, write_stream, low.create_initialization_options())


class GuardedLines:
    """stdin as the SDK's stdio transport reads it (an async iterable of lines), each line checked first: at most
    MAX_MESSAGE_BYTES (a longer one is skipped to its end, never buffered whole), UTF-8, nesting at most
    MAX_MESSAGE_DEPTH, a JSON-RPC message. A line that fails is answered at once with the JSON-RPC error the spec
    gives it (-32700 parse error, -32600 invalid request; the request's id when it can be read, else null), through
    the transport's own writer, and never reaches the SDK; a blank line is skipped."""

    def __init__(self, source: BinaryIO) -> None:
        self.source = source
        self.answers: Any = None
        # The start of a line being skipped for its length: its id, when it comes first, is what the refusal answers.
        self.head = b""

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        import anyio.to_thread

        buffer = bytearray()
        skipping = False
        while True:
            chunk = await anyio.to_thread.run_sync(self._read, abandon_on_cancel=True)
            ended = not chunk
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0 or (ended and buffer):
                line = bytes(buffer[:end] if end >= 0 else buffer)
                del buffer[: end + 1 if end >= 0 else len(buffer)]
                if skipping:
                    skipping = False
                    await self._refuse(leading_id(self.head), PARSE_ERROR,
                                       f"message longer than {MAX_MESSAGE_BYTES:,} bytes")
                    continue
                text = await self._checked(line)
                if text is not None:
                    yield text
            if len(buffer) > MAX_MESSAGE_BYTES:
                if not skipping:
                    self.head = bytes(buffer[:HEAD_BYTES])
                buffer.clear()
                skipping = True
            if ended:
                if skipping:
                    await self._refuse(leading_id(self.head), PARSE_ERROR,
                                       f"message longer than {MAX_MESSAGE_BYTES:,} bytes")
                return

    def _read(self) -> bytes:
        read1 = getattr(self.source, "read1", None)
        return bytes(read1(65536) if read1 is not None else self.source.read(65536))

    async def _checked(self, line: bytes) -> str | None:
        """The line as the SDK may read it, or None once refused (answered) or blank."""
        import mcp_types
        from pydantic import ValidationError

        if not line.strip():
            return None
        if len(line) > MAX_MESSAGE_BYTES:  # it came whole in the chunk that passed the bound
            await self._refuse(leading_id(line[:HEAD_BYTES]), PARSE_ERROR,
                               f"message longer than {MAX_MESSAGE_BYTES:,} bytes")
            return None
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            await self._refuse(None, PARSE_ERROR, f"not UTF-8 (byte {exc.start})")
            return None
        if json_depth(text, MAX_MESSAGE_DEPTH) > MAX_MESSAGE_DEPTH:
            await self._refuse(None, PARSE_ERROR, f"nested more than {MAX_MESSAGE_DEPTH} levels deep")
            return None
        try:
            mcp_types.jsonrpc_message_adapter.validate_json(text, by_name=False)
        except ValidationError:
            try:
                data = json.loads(text)
            except (ValueError, RecursionError):
                await self._refuse(None, PARSE_ERROR, "not JSON")
                return None
            raw_id = data.get("id") if isinstance(data, dict) else None
            await self._refuse(raw_id if plain_id(raw_id) else None, INVALID_REQUEST, "not a JSON-RPC 2.0 request, "
                               "notification or response (jsonrpc \"2.0\", a method, an id of a string or integer)")
            return None
        if '"id"' in text:
            # The SDK reads a message whose id is an object, a list, null or true as a notification: never answered.
            data = json.loads(text)
            raw_id = data.get("id", 0) if isinstance(data, dict) else 0
            if not plain_id(raw_id):
                await self._refuse(None, INVALID_REQUEST, "an id must be a string or an integer of at most 53 bits "
                                   f"(found {type(raw_id).__name__ if raw_id is not None else 'null'})")
                return None
        return text

    async def _refuse(self, request_id: str | int | None, code: int, why: str) -> None:
        import mcp_types
        from mcp.shared.message import SessionMessage

        title = "Parse error" if code == PARSE_ERROR else "Invalid Request"
        error = mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id,
                                       error=mcp_types.ErrorData(code=code, message=f"{title}: {why}"))
        print(f"t4serve mcp: refused a message: {title}: {why}", file=sys.stderr, flush=True)
        if self.answers is not None:
            await self.answers.send(SessionMessage(error))


PARSE_ERROR = -32700
INVALID_REQUEST = -32600
# How much of an oversized line is kept to find its id (clients write "jsonrpc", "id" and "method" before "params").
HEAD_BYTES = 64 * 1024
_ID_VALUE = re.compile(rb'\s*:\s*("(?:[^"\\]|\\.){0,200}"|-?[0-9]{1,19})\s*[,}]')


# The largest id answered as given: a JSON number a client (JavaScript's included) reads back exactly. The SDK gave
# no answer at all to an id of 1e20.
MAX_ID = 2**53 - 1


def plain_id(value: object) -> bool:
    """A JSON-RPC id this server answers with: a string of at most 200 characters or an integer within MAX_ID."""
    if isinstance(value, str):
        return len(value) <= 200
    return isinstance(value, int) and not isinstance(value, bool) and -MAX_ID <= value <= MAX_ID


def leading_id(head: bytes) -> str | int | None:
    """The id of the JSON-RPC message `head` begins, when its top-level "id" comes within `head` (a string or an
    integer); else None. A scan that skips strings and counts brackets, so an "id" inside params is not taken."""
    depth, i, n = 0, 0, len(head)
    while i < n:
        c = head[i]
        if c == 0x22:  # a string: to its closing quote
            j = i + 1
            while j < n and head[j] != 0x22:
                j += 2 if head[j] == 0x5C else 1
            if j >= n:
                return None
            if depth == 1 and head[i : j + 1] == b'"id"':
                match = _ID_VALUE.match(head, j + 1)
                value = json.loads(match.group(1)) if match is not None else None
                return value if plain_id(value) else None
            i = j + 1
            continue
        depth += 1 if c in b"[{" else -1 if c in b"]}" else 0
        i += 1
    return None
