"""The built image, checked from outside (docker inspect, docker save) and inside (throwaway containers, no GPU).

Covers issue 3's list: CLI and `patch verify` run, torch is CUDA 13 with sm_75, vLLM imports, the manifest equals
what is installed and what the labels say, non-root, no CA bundle in any layer, no-GPU exit 3, healthcheck, and the
code-only rebuild (its time is printed, never asserted).
"""

from __future__ import annotations

import base64
import datetime
import io
import json
import os
import random
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from t4serve.facts import BuildManifest
from t4serve.serde import from_dict
from t4serve.turing.inputs import module_closure

from .conftest import REPO, RunInImage

pytestmark = pytest.mark.image

# Label -> manifest field; scripts/build-image takes the label values from the lock, the build checks them.
LABEL_FIELDS = {
    "org.opencontainers.image.version": "t4serve_version",
    "org.opencontainers.image.base.name": "base_image",
    "io.t4serve.vllm.version": "vllm_version",
    "io.t4serve.torch.version": "torch_version",
    "io.t4serve.triton.version": "triton_version",
    "io.t4serve.transformers.version": "transformers_version",
}
# Published cold loads on a T4 took 98-157 s (published-t4-run.md); the start period must cover that with room for a
# download.
SLOWEST_PUBLISHED_LOAD_S = 157


def test_cli_help_runs(run_in_image: RunInImage) -> None:
    out = run_in_image("--help")
    assert out.returncode == 0, out.stderr
    for subcommand in ("serve", "healthcheck", "patch", "build-manifest"):
        assert subcommand in out.stdout


def test_patch_verify_passes(run_in_image: RunInImage) -> None:
    out = run_in_image("patch", "verify", timeout=600)
    assert out.returncode == 0, f"t4serve patch verify failed (exit {out.returncode}):\n{out.stdout}\n{out.stderr}"


def test_torch_is_cuda_13_with_turing_in_its_arch_list(run_in_image: RunInImage) -> None:
    code = "import json, torch; print(json.dumps([torch.version.cuda, torch.cuda.get_arch_list()]))"
    out = run_in_image("-c", code, entrypoint="python3")
    assert out.returncode == 0, out.stderr
    cuda, arch_list = json.loads(out.stdout.strip().splitlines()[-1])
    assert cuda == "13.0"
    assert "sm_75" in arch_list


def test_vllm_imports(run_in_image: RunInImage, manifest_data: dict[str, Any]) -> None:
    out = run_in_image("-c", "import vllm; print(vllm.__version__)", entrypoint="python3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == manifest_data["vllm_version"]


# The Dockerfile removes these because a Gemma 4 server on a T4 never loads them (docker/slim.json says why).
TRIMMED = tuple(sorted({m for d in json.loads((REPO / "docker" / "slim.json").read_text())["distributions"]
                        for m in d["modules"]}))
# What a T4 serving Gemma 4 E2B imports: the model classes, the Triton backend Gemma 4 is forced onto,
# compressed-tensors W4A16 through Marlin (the QAT checkpoint), and the OpenAI server with its `vllm serve` entry.
T4_PATH = (
    ("vllm.model_executor.models.gemma4_mm", "Gemma4ForConditionalGeneration"),
    ("vllm.model_executor.models.gemma4", "Gemma4ForCausalLM"),
    ("vllm.v1.attention.backends.triton_attn", "TritonAttentionBackend"),
    (
        "vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16",
        "CompressedTensorsWNA16",
    ),
    ("vllm.model_executor.kernels.linear.mixed_precision.marlin", "MarlinLinearKernel"),
    ("vllm.entrypoints.launchers.api_server.entry", "run_server"),
    ("vllm.entrypoints.launchers.api_server.routers", "register_api_routers"),
    ("vllm.entrypoints.cli.serve", "ServeSubcommand"),
)


def test_t4_path_imports_without_the_trimmed_packages(run_in_image: RunInImage) -> None:
    code = (
        "import importlib, importlib.util, json, sys\n"
        f"trimmed = {TRIMMED!r}\n"
        "present = [m for m in trimmed if importlib.util.find_spec(m)]\n"
        f"for module, name in {T4_PATH!r}:\n"
        "    getattr(importlib.import_module(module), name)\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & set(trimmed))\n"
        "print(json.dumps({'present': present, 'loaded': loaded}))"
    )
    out = run_in_image("-c", code, entrypoint="python3", timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"present": [], "loaded": []}


def test_manifest_matches_what_is_installed(run_in_image: RunInImage, manifest_data: dict[str, Any]) -> None:
    manifest = from_dict(BuildManifest, manifest_data)
    assert manifest.present and manifest.path == "/etc/t4serve/build-manifest.json"
    # Re-read everything inside a fresh container, by other means than the build used where possible.
    code = (
        "import json, platform, torch, vllm, triton, transformers, t4serve\n"
        "print(json.dumps({'python_version': platform.python_version(), 'torch_version': torch.__version__,\n"
        "  'torch_cuda_version': torch.version.cuda, 'torch_arch_list': torch.cuda.get_arch_list(),\n"
        "  'vllm_version': vllm.__version__, 'triton_version': triton.__version__,\n"
        "  'transformers_version': transformers.__version__, 't4serve_version': t4serve.__version__}))"
    )
    out = run_in_image("-c", code, entrypoint="python3")
    assert out.returncode == 0, out.stderr
    installed = json.loads(out.stdout.strip().splitlines()[-1])
    # torch.__version__ may carry a local build tag (+cu130); the manifest holds the distribution version.
    installed["torch_version"] = installed["torch_version"].split("+")[0]
    for field, value in installed.items():
        assert getattr(manifest, field) == value, f"manifest {field}={getattr(manifest, field)!r}, installed {value!r}"
    assert manifest.clamp is not None, "the manifest carries no clamp proof"
    assert manifest.clamp.vllm_version == installed["vllm_version"]
    assert manifest.clamp.state in ("applied", "not-needed")


def test_entrypoint_reads_the_manifest_from_the_environment(image_config: dict[str, Any]) -> None:
    env = dict(item.split("=", 1) for item in image_config["Env"])
    assert env["T4SERVE_MANIFEST"] == "/etc/t4serve/build-manifest.json"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert env["HF_HOME"] == "/cache/huggingface"
    for key in ("TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
        assert env[key].startswith("/cache/compile/")
    assert env["T4SERVE_CACHE_DIR"] == "/cache/t4serve"
    assert env["T4SERVE_STATE_DIR"] == "/tmp/t4serve"
    assert "/cache" in (image_config.get("Volumes") or {})
    assert image_config["Entrypoint"] == ["t4serve"]
    assert image_config["Cmd"] == ["serve"]
    assert image_config["StopSignal"] == "SIGTERM"


def test_labels_equal_the_manifest(image_config: dict[str, Any], manifest_data: dict[str, Any]) -> None:
    labels = image_config.get("Labels") or {}
    for label, field in LABEL_FIELDS.items():
        assert labels.get(label), f"label {label} missing or empty (build with scripts/build-image)"
        assert labels[label] == manifest_data[field], f"label {label}={labels[label]!r}, manifest {field}"


def git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def test_provenance_labels_say_what_the_image_was_built_from(
    docker_bin: str, image_config: dict[str, Any], manifest_data: dict[str, Any]
) -> None:
    """The OCI labels scripts/build-image sets: licenses, created, revision (the commit of the files that enter the
    image, `-dirty` when they differ from it), source (where the checkout's origin is an https URL), and the base:
    its name as built from, its registry digest when it was pulled, else its image ID. A base built here is t4serve's
    own (scripts/base-image), never tagged as Docker's official image."""
    labels = image_config.get("Labels") or {}
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    created = datetime.datetime.strptime(labels["org.opencontainers.image.created"], "%Y-%m-%dT%H:%M:%SZ")
    assert created <= datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(minutes=5)
    head = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--", "docker/requirements.lock", "docker/slim.json", "docker/slim.py",
                  "pyproject.toml", "README.md", "entrypoint")  # fmt: skip
    assert labels["org.opencontainers.image.revision"] == head + ("-dirty" if changed else ""), \
        "built from another commit than this checkout's: rebuild with scripts/build-image"
    origin = git("remote", "get-url", "origin")
    if origin.startswith("https://"):
        assert labels["org.opencontainers.image.source"].startswith("https://")
        assert "@" not in labels["org.opencontainers.image.source"].split("/")[2]
    else:
        assert "org.opencontainers.image.source" not in labels, "a source label from a checkout with no https origin"
    base = labels["org.opencontainers.image.base.name"]
    assert base == manifest_data["base_image"]
    out = subprocess.run([docker_bin, "image", "inspect", base], capture_output=True, text=True)
    assert out.returncode == 0, f"the base {base} the label names is not on this host: {out.stderr}"
    base_info = json.loads(out.stdout)[0]
    if base_info["RepoDigests"]:
        digests = {d.split("@", 1)[1] for d in base_info["RepoDigests"]}
        assert labels["org.opencontainers.image.base.digest"] in digests
    else:
        assert "org.opencontainers.image.base.digest" not in labels
        assert labels["io.t4serve.base.id"] == base_info["Id"]
        # Not pulled: t4serve's own local base, tagged and labelled as such.
        assert base.startswith("t4serve"), f"an image named {base} that was never pulled"
        base_labels = base_info["Config"]["Labels"] or {}
        assert "scripts/base-image" in base_labels["io.t4serve.base.built-by"]
        assert base_labels["io.t4serve.base.debian-suite"] == "trixie"


WRITES = "/cache/huggingface /cache/compile/triton /cache/compile/vllm /cache/compile/inductor /cache/t4serve " \
    "/tmp/t4serve /home/t4serve"


def test_runs_as_non_root_and_owns_its_caches(run_in_image: RunInImage, image_config: dict[str, Any]) -> None:
    assert image_config["User"] == "t4serve"
    code = f"id -u; id -g; for d in {WRITES}; do touch $d/w; done"
    out = run_in_image("-c", code, entrypoint="sh")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["1000", "1000"]
    # The venv (and the patched vLLM in it) is not writable by the server.
    out = run_in_image("-c", "touch /opt/venv/lib/probe", entrypoint="sh")
    assert out.returncode != 0


def random_uid() -> str:
    """An arbitrary uid with no passwd entry, as OpenShift assigns from a project's range."""
    return str(random.randint(100_000, 2_000_000_000))


def test_what_it_writes_belongs_to_group_0_with_the_owners_permissions(run_in_image: RunInImage) -> None:
    """OpenShift's image guidelines: an arbitrary uid runs in group 0, so the paths the program writes are group 0's,
    with the group's permissions equal to the owner's; HOME is set (no passwd entry gives none)."""
    out = run_in_image("-c", f"stat -c '%n %U %g %A' {WRITES}", entrypoint="sh")
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        name, owner, group, mode = line.split()
        assert (owner, group) == ("t4serve", "0"), line
        assert mode[1:4] == mode[4:7], f"{name}: group permissions {mode[4:7]} differ from the owner's {mode[1:4]}"
    uid = random_uid()
    code = f'echo "$HOME $(pwd) $(id -u) $(id -g)"; for d in {WRITES}; do touch $d/w || exit 1; done'
    out = run_in_image("-c", code, entrypoint="sh", user=f"{uid}:0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["/home/t4serve", "/home/t4serve", uid, "0"]


def test_any_uid_in_group_0_plans_and_answers_the_healthcheck(run_in_image: RunInImage) -> None:
    """`docker run --user UID:0` (OpenShift, Kubernetes runAsUser): plan and healthcheck run, no traceback. The serve
    path under such a uid runs in tests/image/test_supervision.py."""
    uid = random_uid()
    out = run_in_image("plan", "--gpu", "t4", user=f"{uid}:0", env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "vllm serve" in out.stdout and "--max-model-len" in out.stdout
    # Docker's own form: a bare uid runs in group 0.
    out = run_in_image("plan", "--gpu", "t4", "--json", user=uid, env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plan"]["argv"][:2] == ["vllm", "serve"]
    out = run_in_image("healthcheck", user=f"{uid}:0")
    assert out.returncode == 1, out
    assert out.stderr.startswith("t4serve healthcheck: not ready: ") and "Traceback" not in out.stderr


def test_apt_leaves_no_cache_in_the_image(run_in_image: RunInImage) -> None:
    """No downloaded .debs, package caches or lists, whatever apt configuration the base has."""
    code = "find /var/cache/apt /var/lib/apt/lists -type f | grep -v '/lock$'; du -sk /var/cache/apt | cut -f1"
    out = run_in_image("-c", code, entrypoint="sh")
    assert out.returncode == 0, out.stderr
    *files, kib = out.stdout.split()
    assert files == [] and int(kib) < 64, out.stdout


def test_gcc_and_python_keep_what_triton_uses_and_nothing_the_image_drops(run_in_image: RunInImage) -> None:
    code = (
        "for p in /usr/libexec/gcc/*/*/cc1 /usr/include/python3.13/Python.h /usr/share/doc/gcc-14-base/copyright; "
        "do test -e $p || echo missing $p; done; "
        "ls /usr/libexec/gcc/*/*/lto1 /usr/bin/*lto-dump* /usr/lib/python3*/config-*/libpython*.a /usr/share/man/* "
        "2>/dev/null; find /usr/share/locale -type f ! -name locale.alias | head -n 3"
    )
    out = run_in_image("-c", code, entrypoint="sh")
    assert out.stdout == "", out.stdout


def test_triton_jit_can_build_its_c_module(run_in_image: RunInImage) -> None:
    # What Triton does at first use: compile a C file against Python's headers into a shared object, then find
    # libcuda through `ldconfig -p` (absent without a GPU, but ldconfig itself must answer).
    code = (
        "set -e; cd /tmp; printf '#include <Python.h>\\nint f(void){return PY_MAJOR_VERSION;}\\n' > m.c; "
        'gcc -shared -fPIC -I"$(python3 -c "import sysconfig;print(sysconfig.get_paths()[\'include\'])")" '
        "m.c -o m.so; test -s m.so; ldconfig -p >/dev/null; echo ok"
    )
    out = run_in_image("-c", code, entrypoint="sh")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_without_a_gpu_serve_exits_3_with_the_finding_and_fix(run_in_image: RunInImage) -> None:
    out = run_in_image(timeout=180)  # the image's own CMD: serve
    text = out.stdout + out.stderr
    assert out.returncode == 3, f"exit {out.returncode}, expected 3 (preflight):\n{text}"
    assert re.search(r"(?i)\bgpu\b", text), text
    assert re.search(r"(?i)fix", text), f"the no-GPU finding names no fix:\n{text}"
    assert "Traceback" not in text


def test_healthcheck_is_defined_and_unhealthy_before_start(
    image_config: dict[str, Any], run_in_image: RunInImage
) -> None:
    health = image_config.get("Healthcheck")
    assert health, "no HEALTHCHECK in the image"
    assert health["Test"] == ["CMD", "t4serve", "healthcheck"]
    assert health["StartPeriod"] / 1e9 >= 2 * SLOWEST_PUBLISHED_LOAD_S
    # Nothing started in this container: Docker's contract is exit 1 for unhealthy (0 healthy, 2 reserved).
    out = run_in_image("healthcheck")
    assert out.returncode == 1, f"exit {out.returncode}:\n{out.stdout}\n{out.stderr}"


# --- no CA bundle or secret in any layer ----------------------------------------------------------------------

PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----\s+(.+?)\s+-----END CERTIFICATE-----", re.S)
PUBLIC_CERT_SOURCES = ("/usr/share/ca-certificates/mozilla",)


def host_ca_bundle() -> Path | None:
    """The bundle scripts/build-image passes as the `pip_ca` secret (same variables, same order)."""
    for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        value = os.environ.get(var)
        if value and Path(value).is_file():
            return Path(value)
    return None


def pem_certificates(data: bytes) -> list[bytes]:
    """DER bytes of each PEM certificate in `data`."""
    return [base64.b64decode(b"".join(m.group(1).split())) for m in PEM_BLOCK.finditer(data)]


def public_certificates() -> set[bytes]:
    """Mozilla's public roots as this host has them (the Debian ca-certificates package and pip's certifi): those
    are in every Python image legitimately, so only the bundle's other certificates are secret."""
    public: set[bytes] = set()
    for folder in PUBLIC_CERT_SOURCES:
        for path in Path(folder).glob("*.crt") if Path(folder).is_dir() else []:
            public.update(pem_certificates(path.read_bytes()))
    try:
        from pip._vendor import certifi  # the test venv's pip always vendors it

        public.update(pem_certificates(Path(certifi.where()).read_bytes()))
    except ImportError:
        pass
    return public


def secret_needles(bundle: bytes, public: set[bytes]) -> list[bytes]:
    """Byte strings whose presence in a layer means the bundle leaked: for each non-public certificate, a slice of
    its DER and the first 64-character line of its PEM body (how it would appear in a copied .crt or .pem)."""
    needles = []
    for der in pem_certificates(bundle):
        if der in public:
            continue
        needles.append(der[64:128] if len(der) >= 128 else der)
        needles.append(base64.b64encode(der)[:64])
    return needles


def scan_image_tar(stream: IO[bytes], needles: Iterable[bytes]) -> list[str]:
    """Findings of `docker save` output read as a stream: files named like the secret or under run/secrets, and
    files holding any needle. Layers are streamed, never written to disk (the image is ~10 GB)."""
    pattern = re.compile(b"|".join(re.escape(n) for n in needles)) if needles else None
    overlap = max((len(n) for n in needles), default=0)
    findings = []
    with tarfile.open(fileobj=stream, mode="r|") as outer:
        for layer in outer:
            if not (layer.isfile() and layer.name.endswith("layer.tar")):
                continue
            layer_file = outer.extractfile(layer)
            assert layer_file is not None
            with tarfile.open(fileobj=layer_file, mode="r|") as inner:
                for member in inner:
                    name = member.name.lstrip("./")
                    if name.startswith("run/secrets/") or Path(name).name == "pip_ca":
                        findings.append(f"{layer.name}: {name} (secret path)")
                    if pattern is None or not member.isfile() or member.size < overlap:
                        continue
                    content = inner.extractfile(member)
                    assert content is not None
                    if any(pattern.search(chunk) for chunk in _chunks(content, overlap)):
                        findings.append(f"{layer.name}: {name} (holds the CA bundle's private certificate)")
    # tarfile stops at the first zero block of the end-of-archive marker and leaves what follows unread (the rest
    # of the marker, any record padding). Read to EOF: closing the pipe while `docker save` still writes kills it
    # with SIGPIPE (exit -13), which is how CI saw this test fail.
    while stream.read(1 << 20):
        pass
    return findings


def _chunks(f: IO[bytes], overlap: int, size: int = 8 << 20) -> Iterator[bytes]:
    tail = b""
    while block := f.read(size):
        yield tail + block
        tail = block[-overlap:] if overlap else b""


def _fake_save(files: dict[str, bytes]) -> io.BytesIO:
    """A `docker save`-shaped tar with one layer holding `files`."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    outer = io.BytesIO()
    with tarfile.open(fileobj=outer, mode="w") as tar:
        info = tarfile.TarInfo("abc123/layer.tar")
        info.size = layer.tell()
        layer.seek(0)
        tar.addfile(info, layer)
    outer.seek(0)
    return outer


def test_layer_scanner_finds_a_planted_certificate() -> None:
    # The scanner's own control: without this, a scanner that finds nothing would pass the real test vacuously.
    bundle = host_ca_bundle()
    if bundle is None:
        pytest.skip("no CA bundle on this host (PIP_CERT, SSL_CERT_FILE, REQUESTS_CA_BUNDLE unset)")
    data = bundle.read_bytes()
    needles = secret_needles(data, public_certificates())
    if not needles:
        pytest.skip(f"{bundle} holds only public certificates: nothing secret to find")
    saved = _fake_save({"opt/x/cacert.pem": b"junk" * 5000 + data, "run/secrets/pip_ca": b"", "etc/ok": b"x" * 200})
    saved.seek(0, io.SEEK_END)
    saved.write(bytes(20 * 512))  # record padding after the end-of-archive marker, as `docker save` writes it
    saved.seek(0)
    findings = scan_image_tar(saved, needles)
    assert saved.read() == b"", "the scanner must read the stream to EOF, or `docker save` dies of SIGPIPE"
    assert any("opt/x/cacert.pem" in f and "private" in f for f in findings), findings
    assert any("run/secrets/pip_ca" in f for f in findings), findings
    assert not any("etc/ok" in f for f in findings)


def test_no_layer_contains_the_ca_bundle_or_a_secret(docker_bin: str, image_ref: str) -> None:
    bundle = host_ca_bundle()
    needles = secret_needles(bundle.read_bytes(), public_certificates()) if bundle else []
    save = subprocess.Popen([docker_bin, "save", image_ref], stdout=subprocess.PIPE)
    assert save.stdout is not None
    started = time.monotonic()
    try:
        findings = scan_image_tar(save.stdout, needles)
    finally:
        save.stdout.close()
        rc = save.wait(timeout=600)
    assert rc == 0, "docker save failed"
    print(f"\nscanned every layer of {image_ref} for {len(needles)} needles in {time.monotonic() - started:.0f}s")
    assert findings == []


# --- code-only rebuild ------------------------------------------------------------------------------------------


def test_code_only_change_rebuilds_only_the_top_layers(docker_bin: str, image_ref: str) -> None:
    """Build a copy of the context as it is (from cache), then again with one package file changed, one the Turing
    attention proof does not read (t4serve.turing.inputs); print the seconds of the second build. The two images must
    share every layer except those the build stage's change produces: the proof stage stays cached, and so does the
    layer of its record. The baseline is rebuilt rather than taken from `image_ref`, which may predate the cache."""
    base, probe = "t4serve:rebuild-base", "t4serve:rebuild-probe"
    context = Path(os.environ.get("TMPDIR", "/tmp")) / f"t4serve-rebuild-{os.getpid()}"
    shutil.rmtree(context, ignore_errors=True)

    def build(tag: str) -> float:
        started = time.monotonic()
        done = subprocess.run(
            [str(REPO / "scripts" / "build-image")],
            env={**os.environ, "T4SERVE_IMAGE": tag, "DOCKER": docker_bin, "T4SERVE_BUILD_CONTEXT": str(context)},
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        return time.monotonic() - started

    try:
        context.mkdir(parents=True)
        for name in ("pyproject.toml", "README.md", ".dockerignore"):
            shutil.copy2(REPO / name, context / name)
        shutil.copytree(REPO / "docker", context / "docker")
        shutil.copytree(REPO / "entrypoint", context / "entrypoint", ignore=shutil.ignore_patterns("__pycache__"))
        build(base)
        changed = context / "entrypoint" / "t4serve" / "cli.py"
        assert Path("t4serve/cli.py") not in module_closure(context / "entrypoint")
        changed.write_text(changed.read_text() + f"# rebuild probe {time.time()}\n")
        seconds = build(probe)
        print(f"\ncode-only rebuild of {image_ref}: {seconds:.1f} s")
        before = _layers(docker_bin, base)
        after = _layers(docker_bin, probe)
        shared = sum(1 for a, b in zip(before, after, strict=False) if a == b)
        # Base, packages, user, the venv copy and the attention proof stay; only the build stage's delta and the
        # manifest may change.
        assert len(after) == len(before)
        assert len(after) - shared <= 2, f"{len(after) - shared} of {len(after)} layers changed"
    finally:
        subprocess.run([docker_bin, "rmi", probe, base], capture_output=True)
        shutil.rmtree(context, ignore_errors=True)


def _layers(docker: str, image: str) -> list[str]:
    out = subprocess.run(
        [docker, "image", "inspect", "-f", "{{json .RootFS.Layers}}", image], capture_output=True, text=True, check=True
    )
    layers: list[str] = json.loads(out.stdout)
    return layers
