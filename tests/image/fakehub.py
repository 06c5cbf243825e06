"""A test double for the Hugging Face hub's file endpoint, so the image's real huggingface_hub (2.x) can be driven
without a network: `serve(root, repo)` answers `HEAD` and `GET /{repo}/resolve/{revision}/{filename}` from the files
under `root`, as huggingface.co answers them for a non-LFS file (X-Repo-Commit, ETag, Content-Length; a `Range`
request gets 206 with that slice). What it stands for: the two calls t4serve's remote probe makes
(`get_safetensors_metadata`, which asks whether model.safetensors exists and reads its header by ranges, and
`hf_hub_download` of config.json) and a download's `*.incomplete` file. With `slow` set, a file of that name is sent in
chunks over about a second, so a test can see the download in progress. Any other path answers 404.
Runs inside the image (stdlib only): tests/image/test_hub_probes_image.py mounts tests/ and starts it there.
"""

from __future__ import annotations

import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def serve(root: Path, repo: str, slow: str | None = None) -> ThreadingHTTPServer:
    """Start the double on 127.0.0.1 (a free port) in a daemon thread; returns the server (`server_port`)."""

    class Hub(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def _file(self) -> tuple[Path, str] | None:
            prefix = f"/{repo}/resolve/"
            if not self.path.startswith(prefix):
                return None
            _revision, _, name = self.path[len(prefix):].partition("/")
            path = root / name
            return (path, name) if name and path.is_file() and root in path.resolve().parents else None

        def _headers(self, path: Path, length: int, status: int) -> None:
            self.send_response(status)
            self.send_header("X-Repo-Commit", COMMIT)
            # The hub's ETag names the content; name and size do here (the test files never change while served).
            tag = hashlib.sha256(f"{path.name}:{path.stat().st_size}".encode()).hexdigest()
            self.send_header("ETag", f'"{tag}"')
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

        def do_HEAD(self) -> None:
            found = self._file()
            if found is None:
                self.send_error(404)
                return
            self._headers(found[0], found[0].stat().st_size, 200)

        def do_GET(self) -> None:
            found = self._file()
            if found is None:
                self.send_error(404)
                return
            path, name = found
            size = path.stat().st_size
            wanted = self.headers.get("Range", "")
            start, end, status = 0, size - 1, 200
            if wanted.startswith("bytes="):
                first, _, last = wanted[len("bytes="):].partition("-")
                start, end, status = int(first), min(int(last) if last else size - 1, size - 1), 206
            with path.open("rb") as f:  # a slice only: the checkpoints are sparse files of gigabytes
                f.seek(start)
                body = f.read(end + 1 - start)
            self._headers(path, len(body), status)
            if name == slow:
                step = max(1, len(body) // 10)
                for i in range(0, len(body), step):
                    self.wfile.write(body[i:i + step])
                    self.wfile.flush()
                    time.sleep(0.1)
            else:
                self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
