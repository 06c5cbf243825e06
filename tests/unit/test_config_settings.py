"""Settings: every variable's default and parse, every class of bad value, secrets never shown, options and table."""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from t4serve.config.aliases import BF16_REPO, QAT_REPO
from t4serve.config.options import settings_options
from t4serve.config.secrets import Secret, api_key_from_environ
from t4serve.config.settings import VARIABLES, Settings, markdown_table
from t4serve.config.variables import Context, parse_size
from t4serve.errors import ConfigError

TOKEN = "hf_SECRETvalue123"


def parse(env: dict[str, str], cwd: Path | None = None) -> Settings:
    return Settings.from_environ(env, cwd=cwd or Path("/"))


def error_for(env: dict[str, str], cwd: Path | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(env, cwd)
    assert info.value.exit_code == 2
    return info.value


def test_defaults() -> None:
    s = parse({"HOME": "/home/u"})
    assert s.model.target == QAT_REPO and s.model.kind == "alias"
    assert s.served_model_name == QAT_REPO
    assert (s.host, s.port) == ("0.0.0.0", 8000)
    assert s.max_model_len is None and s.max_num_seqs is None and s.kv_cache_memory_bytes is None
    assert s.gpu_memory_utilization == 0.9
    assert s.dtype == "auto" and s.preflight == "strict"
    assert s.vllm_args == ()
    assert s.hf_token is None and s.hf_token_file is None
    assert s.hf_hub_offline is False and s.log_level == "info"
    assert s.manifest == "/etc/t4serve/build-manifest.json"
    assert (s.state_dir, s.cache_dir) == ("/tmp/t4serve", "/cache/t4serve")
    assert s.telemetry_port == 9400 and s.shutdown_timeout == 30
    assert (s.max_restarts, s.restart_window, s.canary) == (3, 300, True)
    assert all(origin == "default" for origin in s.origins.values())


def test_every_variable_has_a_row_and_a_default_doc() -> None:
    names = [v.name for v in VARIABLES]
    assert len(names) == len(set(names))
    for required in ("T4SERVE_MODEL", "T4SERVE_PORT", "HF_TOKEN", "HF_TOKEN_FILE", "T4SERVE_STATE_DIR"):
        assert required in names
    ctx = Context({}, Path("/"))
    for var in VARIABLES:
        doc = var.default_doc
        assert doc and doc == doc.strip() and "\n" not in doc, f"{var.name}: default_doc must say what the default is"
        if var.default:
            # A written default is what the doc says, and a value its own parser takes.
            assert doc == var.default or doc.startswith(f"{var.default} "), (var.name, var.default, doc)
            var.parse(var.default, ctx)
        else:
            # No written default: unset means auto, none, or a default derived from the rest, said in words.
            assert doc == "auto" or doc.startswith("(none") or len(doc.split()) >= 3, (var.name, doc)
    # The secrets have no flag: a token or key on a command line shows in `ps`.
    assert [v.option for v in VARIABLES if v.secret] == [None, None]


@pytest.mark.parametrize(
    ("env", "field", "expected"),
    [
        ({"T4SERVE_MODEL": "bf16"}, "served_model_name", BF16_REPO),
        ({"T4SERVE_MODEL": "QAT"}, "served_model_name", QAT_REPO),
        ({"T4SERVE_MODEL": "org/name-1.5"}, "served_model_name", "org/name-1.5"),
        ({"T4SERVE_SERVED_MODEL_NAME": "gemma"}, "served_model_name", "gemma"),
        ({"T4SERVE_HOST": "127.0.0.1"}, "host", "127.0.0.1"),
        ({"T4SERVE_HOST": "::"}, "host", "::"),
        ({"T4SERVE_HOST": "my-host.local"}, "host", "my-host.local"),
        ({"T4SERVE_PORT": "65535"}, "port", 65535),
        ({"T4SERVE_MAX_MODEL_LEN": "16384"}, "max_model_len", 16384),
        ({"T4SERVE_MAX_MODEL_LEN": "AUTO"}, "max_model_len", None),
        ({"T4SERVE_MAX_NUM_SEQS": "8"}, "max_num_seqs", 8),
        ({"T4SERVE_GPU_MEMORY_UTILIZATION": "1"}, "gpu_memory_utilization", 1.0),
        ({"T4SERVE_GPU_MEMORY_UTILIZATION": "0.85"}, "gpu_memory_utilization", 0.85),
        ({"T4SERVE_KV_CACHE_MEMORY_BYTES": "2.5GiB"}, "kv_cache_memory_bytes", 2684354560),
        ({"T4SERVE_KV_CACHE_MEMORY_BYTES": "3 GB"}, "kv_cache_memory_bytes", 3_000_000_000),
        ({"T4SERVE_KV_CACHE_MEMORY_BYTES": "1048576"}, "kv_cache_memory_bytes", 1048576),
        ({"T4SERVE_KV_CACHE_MEMORY_BYTES": "Profile"}, "kv_cache_memory_bytes", "profile"),
        ({"T4SERVE_DTYPE": "half"}, "dtype", "float16"),
        ({"T4SERVE_DTYPE": "bfloat16"}, "dtype", "bfloat16"),
        ({"T4SERVE_PREFLIGHT": "warn"}, "preflight", "warn"),
        ({"T4SERVE_VLLM_ARGS": "--enforce-eager --compilation-config '{\"mode\": 0}'"}, "vllm_args",
         ("--enforce-eager", "--compilation-config", '{"mode": 0}')),
        ({"HF_HOME": "/cache/huggingface"}, "hf_home", "/cache/huggingface"),
        ({"XDG_CACHE_HOME": "/xdg"}, "hf_home", "/xdg/huggingface"),
        ({"HF_HUB_OFFLINE": "1"}, "hf_hub_offline", True),
        ({"HF_HUB_OFFLINE": "TRUE"}, "hf_hub_offline", True),
        ({"HF_HUB_OFFLINE": "false"}, "hf_hub_offline", False),
        ({"T4SERVE_LOG_LEVEL": "WARN"}, "log_level", "warning"),
        ({"T4SERVE_MANIFEST": "/m.json"}, "manifest", "/m.json"),
        ({"T4SERVE_STATE_DIR": "/run/t4"}, "state_dir", "/run/t4"),
        ({"T4SERVE_CACHE_DIR": "/c"}, "cache_dir", "/c"),
        ({"T4SERVE_TELEMETRY_PORT": "0"}, "telemetry_port", 0),
        ({"T4SERVE_SHUTDOWN_TIMEOUT": "0"}, "shutdown_timeout", 0),
        ({"T4SERVE_MAX_RESTARTS": "0"}, "max_restarts", 0),
        ({"T4SERVE_RESTART_WINDOW": "60"}, "restart_window", 60),
        ({"T4SERVE_CANARY": "off"}, "canary", False),
        # An empty value is unset: compose files write `VAR: ""` for "default".
        ({"T4SERVE_PORT": ""}, "port", 8000),
    ],
)  # fmt: skip
def test_each_variable_parses(env: dict[str, str], field: str, expected: object) -> None:
    assert getattr(parse(env), field) == expected


def test_local_model_directory(tmp_path: Path) -> None:
    model = tmp_path / "gemma"
    model.mkdir()
    (model / "config.json").write_text("{}")
    absolute = parse({"T4SERVE_MODEL": str(model)})
    assert absolute.model.kind == "local" and absolute.model.target == str(model)
    assert absolute.model.repo_id is None
    assert absolute.served_model_name == "gemma"
    relative = parse({"T4SERVE_MODEL": "./gemma"}, cwd=tmp_path)
    assert relative.model.target == str(model)


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("T4SERVE_GPU_MEMORY_UTILIZATION", "1.4", "must be a number in (0, 1], e.g. 0.9"),
        ("T4SERVE_GPU_MEMORY_UTILIZATION", "0", "must be a number in (0, 1]"),
        ("T4SERVE_GPU_MEMORY_UTILIZATION", "nan", "must be a number in (0, 1]"),
        ("T4SERVE_GPU_MEMORY_UTILIZATION", "most", "must be a number in (0, 1]"),
        ("T4SERVE_PORT", "http", "must be an integer from 1 to 65535, e.g. 8000"),
        ("T4SERVE_PORT", "0", "must be an integer from 1 to 65535"),
        ("T4SERVE_PORT", "70000", "must be an integer from 1 to 65535"),
        ("T4SERVE_TELEMETRY_PORT", "-1", "must be an integer from 0 to 65535"),
        ("T4SERVE_MAX_MODEL_LEN", "lots", 'must be "auto" or an integer from 16 to 16777216, e.g. 16384'),
        ("T4SERVE_MAX_MODEL_LEN", "8", 'must be "auto" or an integer from 16 to 16777216'),
        ("T4SERVE_MAX_NUM_SEQS", "0", 'must be "auto" or an integer from 1 to 65536, e.g. 8'),
        ("T4SERVE_KV_CACHE_MEMORY_BYTES", "2.5 gigs", 'must be "auto", "profile" or a whole number of bytes'),
        ("T4SERVE_KV_CACHE_MEMORY_BYTES", "0", 'must be "auto", "profile" or a whole number of bytes'),
        ("T4SERVE_DTYPE", "int8", "must be one of auto, float16, bfloat16, float32"),
        ("T4SERVE_PREFLIGHT", "lenient", "must be one of strict, warn"),
        ("T4SERVE_LOG_LEVEL", "loud", "must be one of debug, info, warning, error"),
        ("HF_HUB_OFFLINE", "maybe", "must be one of 0, 1, true, false"),
        ("T4SERVE_CANARY", "sometimes", "must be on or off"),
        ("T4SERVE_SHUTDOWN_TIMEOUT", "-5", "must be an integer from 0 to 3600"),
        ("T4SERVE_MAX_RESTARTS", "many", "must be an integer from 0 to 1000"),
        ("T4SERVE_RESTART_WINDOW", "0", "must be an integer from 1 to 86400"),
        ("T4SERVE_MODEL", "gemma", "must be qat, bf16, a Hugging Face repo id (org/name), or a local directory"),
        ("T4SERVE_MODEL", "org/na..me", "must be qat, bf16, a Hugging Face repo id"),
        ("T4SERVE_MODEL", "a/b/c", "must be qat, bf16, a Hugging Face repo id"),
        ("T4SERVE_MODEL", "/nonexistent/model", "must be an existing directory holding config.json"),
        ("T4SERVE_SERVED_MODEL_NAME", "my model", "must be one word without whitespace"),
        ("T4SERVE_HOST", "not a host!", "must be an IP address or a host name"),
        ("T4SERVE_VLLM_ARGS", "--chat-template 'unclosed", "must be shell-quoted flags (No closing quotation)"),
    ],
)
def test_bad_values_name_variable_value_accepted_and_example(name: str, value: str, accepted: str) -> None:
    error = error_for({name: value})
    first_line = error.message().splitlines()[0]
    assert first_line.startswith(f"{name}={value}: ")
    assert accepted in first_line
    assert ", e.g. " in first_line
    assert error.fix is not None and error.fix.startswith(f"set {name}=")


def test_directory_without_config_json(tmp_path: Path) -> None:
    error = error_for({"T4SERVE_MODEL": str(tmp_path)})
    assert f"{tmp_path}/config.json is missing" in error.message()


def test_speculation_in_vllm_args_is_refused_with_the_way_out() -> None:
    args = """--speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'"""
    message = error_for({"T4SERVE_VLLM_ARGS": args}).message()
    assert "use T4SERVE_SPECULATIVE instead" in message
    assert "remove --speculative-config from T4SERVE_VLLM_ARGS and set T4SERVE_SPECULATIVE instead" in message


@pytest.mark.parametrize(
    ("args", "flag", "variable"),
    [
        ("--port 9000", "--port", "T4SERVE_PORT"),
        ("--max_model_len=4096", "--max_model_len (--max-model-len)", "T4SERVE_MAX_MODEL_LEN"),
        ("--max-model 4096", "--max-model (--max-model-len)", "T4SERVE_MAX_MODEL_LEN"),
        ("--gpu-memory-utilization 0.5", "--gpu-memory-utilization", "T4SERVE_GPU_MEMORY_UTILIZATION"),
        ("--enforce-eager --dtype=bfloat16", "--dtype", "T4SERVE_DTYPE"),
        ("--served-model-name x", "--served-model-name", "T4SERVE_SERVED_MODEL_NAME"),
        ("--kv-cache-memory-bytes 1G", "--kv-cache-memory-bytes", "T4SERVE_KV_CACHE_MEMORY_BYTES"),
        ("--max-num-seqs 4", "--max-num-seqs", "T4SERVE_MAX_NUM_SEQS"),
        ("--max-num-batched-tokens 8192", "--max-num-batched-tokens", "T4SERVE_MAX_NUM_BATCHED_TOKENS"),
        ("--host 1.2.3.4", "--host", "T4SERVE_HOST"),
        ("--model x/y", "--model", "T4SERVE_MODEL"),
        ("--shutdown-timeout 5", "--shutdown-timeout", "T4SERVE_SHUTDOWN_TIMEOUT"),
        ("--hf-token abc", "--hf-token", "HF_TOKEN or HF_TOKEN_FILE"),
        ("--download-dir /x", "--download-dir", "HF_HOME"),
    ],
)
def test_vllm_args_conflicts_name_flag_and_variable(args: str, flag: str, variable: str) -> None:
    message = error_for({"T4SERVE_VLLM_ARGS": args}).message()
    assert f"must not contain {flag}" in message
    assert f"use {variable} instead" in message
    assert f"set {variable} instead" in message
    # The example completes "use X instead": a setting of X (of the first, where two are named), not a vLLM flag.
    first = variable.split(" or ")[0]
    assert f"instead, e.g. {first}=" in message or f"instead (it reaches vLLM through its environment only), e.g. " \
        f"{first}=" in message


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ("--kv-cache-dtype int8", "use T4SERVE_KV_CACHE_DTYPE instead"),
        ("--tensor-parallel-size 2", "one GPU"),
        ("-tp 2", "one GPU"),
        ("-t 2", "one GPU"),  # argparse reads it as -tp
        ("-tp2", "is not a flag of vLLM"),  # nor does vLLM's parser read it
        ("--config x.yaml", "YAML"),
        ("--help", "print its help and exit"),
    ],
)
def test_vllm_args_fixed_flags(args: str, why: str) -> None:
    assert why in error_for({"T4SERVE_VLLM_ARGS": args}).message()


@pytest.mark.parametrize("args", ["--enforce-eager", "--enable-prefix-caching", "--enable-prefix --seed=3",
                                  "--max-logprobs -1"])
def test_vllm_args_allowed(args: str) -> None:
    assert parse({"T4SERVE_VLLM_ARGS": args}).vllm_args


def test_token_from_env_is_a_secret() -> None:
    s = parse({"HF_TOKEN": TOKEN})
    assert isinstance(s.hf_token, Secret) and s.hf_token.reveal() == TOKEN
    for text in (repr(s), str(s), f"{s.hf_token}", s.summary(), str(s.to_dict())):
        assert TOKEN not in text
    assert "<redacted>" in s.summary()
    with pytest.raises(TypeError):
        pickle.dumps(s.hf_token)


def test_token_from_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    s = parse({"HF_TOKEN_FILE": str(token_file)})
    assert s.hf_token is not None and s.hf_token.reveal() == TOKEN
    assert s.hf_token_file == str(token_file)
    assert TOKEN not in repr(s) and TOKEN not in s.summary()


def test_token_and_token_file_both_set_is_an_error(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("hf_other")
    message = error_for({"HF_TOKEN": TOKEN, "HF_TOKEN_FILE": str(token_file)}).message()
    assert "HF_TOKEN and HF_TOKEN_FILE are both set" in message
    assert TOKEN not in message and "hf_other" not in message


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: p / "absent", "does not exist"),
        (lambda p: p, "is a directory"),
        (lambda p: (p / "bin").write_bytes(b"\xff\xfe\x00") and p / "bin", "readable UTF-8 file"),
        (lambda p: (p / "two").write_text("hf_a hf_b") and p / "two", "whitespace inside"),
    ],
)
def test_token_file_problems(tmp_path: Path, make: object, expected: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    message = error_for({"HF_TOKEN_FILE": str(path)}).message()
    assert message.startswith(f"HF_TOKEN_FILE={path}: ")
    assert expected in message
    assert "hf_a" not in message


@pytest.mark.parametrize(("content", "shown"), [("", "0 bytes"), ("  \n", "3 bytes of whitespace only")])
def test_an_empty_token_file_says_how_to_fill_it(tmp_path: Path, content: str, shown: str) -> None:
    """`printf %s "$HF_TOKEN" > secrets/hf_token` with HF_TOKEN unset: the fix fills the file, it does not advise
    setting HF_TOKEN_FILE, which is already set."""
    path = tmp_path / "hf_token"
    path.write_text(content)
    message = error_for({"HF_TOKEN_FILE": str(path)}).message()
    assert message.startswith(f"HF_TOKEN_FILE={path}: names an empty file ({path}: {shown}); it must hold the token")
    uid = os.getuid()
    assert f"fix: write the token into the file mounted there: on the host `(umask 077 && printf %s hf_YOURTOKEN > " \
           f"secrets/hf_token) && chown {uid} secrets/hf_token` for compose.token-file.yaml's hf_token " \
           "secret" in message
    assert "writes an empty file when HF_TOKEN is unset" in message
    assert "with compose.yaml, HF_TOKEN=hf_... in the environment compose runs in instead" in message
    assert "set HF_TOKEN_FILE=" not in message


def test_a_missing_token_file_says_how_each_route_puts_it_there(tmp_path: Path) -> None:
    """compose.yaml's route (HF_TOKEN in compose's environment), the file route and `docker run` (issue 45); not
    "set HF_TOKEN_FILE=", which is set."""
    message = error_for({"HF_TOKEN_FILE": str(tmp_path / "absent")}).message()
    assert f"({tmp_path / 'absent'} does not exist)" in message
    assert "`HF_TOKEN=hf_... docker compose up`" in message and "compose.token-file.yaml" in message
    assert "-v $PWD/secrets/hf_token:/run/secrets/hf_token:ro" in message
    assert "set HF_TOKEN_FILE=" not in message


def test_an_empty_api_key_file_says_how_to_fill_it(tmp_path: Path) -> None:
    path = tmp_path / "api_key"
    path.write_text("")
    message = error_for({"T4SERVE_API_KEY_FILE": str(path)}).message()
    assert message.startswith(f"T4SERVE_API_KEY_FILE={path}: names an empty file ({path}: 0 bytes); it must hold")
    assert "(umask 077 && openssl rand -hex 32 > secrets/api_key) && chown" in message
    assert "HF_TOKEN" not in message and "set T4SERVE_API_KEY_FILE=" not in message


def _error_as(uid: int, environ: dict[str, str]) -> str:
    """error_for(environ) in a forked child that dropped to `uid` (root reads any file, whatever its mode)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.write(write, error_for(environ).message().encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    return text


def test_an_unreadable_token_file_names_mode_owner_and_the_fix() -> None:
    # Outside pytest's tmp_path, whose parent only its owner may enter.
    with tempfile.TemporaryDirectory(prefix="t4s-secret-") as folder:
        Path(folder).chmod(0o755)
        check_unreadable(Path(folder) / "hf_token")


def check_unreadable(path: Path) -> None:
    path.write_text(TOKEN)
    path.chmod(0o600)
    if os.geteuid() == 0:
        uid = 54321
        message = _error_as(uid, {"HF_TOKEN_FILE": str(path)})
        owner = 0
    else:
        uid = owner = os.getuid()
        path.chmod(0)
        message = error_for({"HF_TOKEN_FILE": str(path)}).message()
    mode = "0600" if os.geteuid() == 0 else "0000"
    assert message.startswith(f"HF_TOKEN_FILE={path}: names a file uid {uid} cannot read ({path}: mode {mode}, owner "
                              f"uid {owner}, group ")  # fmt: skip
    assert f"this process runs as uid {uid}, groups " in message
    assert f"fix: make the file readable by uid {uid} where it comes from" in message
    assert f"on the host `chown {uid} secrets/hf_token`" in message and "keep mode 0600" in message
    assert TOKEN not in message


def test_bad_token_value_is_redacted_in_the_error() -> None:
    message = error_for({"HF_TOKEN": "hf_abc def"}).message()
    assert "hf_abc" not in message
    assert message.startswith("HF_TOKEN=<redacted>: must be one token without whitespace")


API_KEY = "sk-t4s-SECRETkey-0123456789"


def test_api_key_from_env_is_a_secret_shown_nowhere() -> None:
    s = parse({"T4SERVE_API_KEY": API_KEY})
    assert isinstance(s.api_key, Secret) and s.api_key.reveal() == API_KEY
    for text in (repr(s), str(s), f"{s.api_key}", s.summary(), str(s.to_dict())):
        assert API_KEY not in text
    assert s.to_dict()["T4SERVE_API_KEY"]["value"] == "<redacted>"
    assert parse({}).api_key is None and parse({}).to_dict()["T4SERVE_API_KEY"]["value"] == "(unset)"


def test_api_key_from_file(tmp_path: Path) -> None:
    key_file = tmp_path / "api_key"
    key_file.write_text(API_KEY + "\n")
    s = parse({"T4SERVE_API_KEY_FILE": str(key_file)})
    assert s.api_key is not None and s.api_key.reveal() == API_KEY
    assert s.api_key_file == str(key_file)
    assert API_KEY not in repr(s) and API_KEY not in s.summary() and API_KEY not in str(s.to_dict())


def test_api_key_and_its_file_both_set_is_an_error(tmp_path: Path) -> None:
    key_file = tmp_path / "api_key"
    key_file.write_text("sk-other-key")
    error = error_for({"T4SERVE_API_KEY": API_KEY, "T4SERVE_API_KEY_FILE": str(key_file)})
    message = error.message()
    assert "T4SERVE_API_KEY and T4SERVE_API_KEY_FILE are both set" in message
    assert "fix: unset T4SERVE_API_KEY and keep T4SERVE_API_KEY_FILE" in message
    assert API_KEY not in message and "sk-other-key" not in message


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: p / "absent", "does not exist"),
        (lambda p: p, "is a directory"),
        (lambda p: (p / "two").write_text("sk-a sk-b") and p / "two", "whitespace inside"),
        (lambda p: (p / "uni").write_text("sk-a\u00e9") and p / "uni", "printable ASCII"),
    ],
)
def test_api_key_file_problems(tmp_path: Path, make: object, expected: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    error = error_for({"T4SERVE_API_KEY_FILE": str(path)})
    message = error.message()
    assert message.startswith(f"T4SERVE_API_KEY_FILE={path}: ")
    assert expected in message and "e.g. /run/secrets/api_key" in message
    assert "found: " in message and "fix: set T4SERVE_API_KEY_FILE=" in message
    assert "sk-a" not in message


@pytest.mark.parametrize("value", ["sk-a b", "sk-a\u00e9"])
def test_bad_api_key_value_is_redacted_in_the_error(value: str) -> None:
    message = error_for({"T4SERVE_API_KEY": value}).message()
    assert "sk-a" not in message
    assert message.startswith("T4SERVE_API_KEY=<redacted>: must be one key ")


@pytest.mark.parametrize(
    ("args", "flag", "variable", "secret"),
    [
        (f"--enforce-eager --api-key {API_KEY}", "--api-key", "T4SERVE_API_KEY_FILE or T4SERVE_API_KEY", API_KEY),
        (f"--api-key={API_KEY}", "--api-key", "T4SERVE_API_KEY_FILE or T4SERVE_API_KEY", API_KEY),
        (f"--api_key {API_KEY} k2", "--api_key (--api-key)", "T4SERVE_API_KEY_FILE or T4SERVE_API_KEY", "k2"),
        (f"--api-k={API_KEY}", "--api-k (--api-key)", "T4SERVE_API_KEY_FILE or T4SERVE_API_KEY", API_KEY),
        (f"--hf-token {TOKEN}", "--hf-token", "HF_TOKEN or HF_TOKEN_FILE", TOKEN),
    ],
)
def test_secret_flags_in_vllm_args_are_refused_without_echoing_the_secret(
    args: str, flag: str, variable: str, secret: str
) -> None:
    error = error_for({"T4SERVE_VLLM_ARGS": args})
    message = error.message()
    assert f"must not contain {flag}" in message and f"use {variable} instead" in message
    assert "would show in `ps`" in message
    written = next(a for a in args.split() if a.startswith(("--api", "--hf")))
    assert f"fix: remove {written.split('=')[0]} from T4SERVE_VLLM_ARGS and set {variable} instead" in message
    assert secret not in message and API_KEY not in message
    assert "<redacted>" in message


def test_secret_flag_given_as_the_vllm_args_option_is_refused_without_echo() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_environ({}, overrides={"T4SERVE_VLLM_ARGS": f"--api-key {API_KEY}"})
    assert API_KEY not in info.value.message() and "T4SERVE_API_KEY_FILE" in info.value.message()


def test_api_key_from_environ_reads_only_the_key(tmp_path: Path) -> None:
    key_file = tmp_path / "api_key"
    key_file.write_text(API_KEY)
    assert api_key_from_environ({}) is None
    # Other settings do not matter to a client of the server (healthcheck, bench).
    key = api_key_from_environ({"T4SERVE_API_KEY_FILE": str(key_file), "T4SERVE_PORT": "nope"})
    assert key is not None and key.reveal() == API_KEY
    key = api_key_from_environ({"T4SERVE_API_KEY": API_KEY, "T4SERVE_API_KEY_FILE": ""})
    assert key is not None and key.reveal() == API_KEY
    with pytest.raises(ConfigError) as info:
        api_key_from_environ({"T4SERVE_API_KEY": API_KEY, "T4SERVE_API_KEY_FILE": str(key_file)})
    assert "both set" in info.value.message() and API_KEY not in info.value.message()
    with pytest.raises(ConfigError) as info:
        api_key_from_environ({"T4SERVE_API_KEY_FILE": str(tmp_path / "absent")})
    assert "does not exist" in info.value.message()


def test_telemetry_port_must_differ_from_port() -> None:
    message = error_for({"T4SERVE_PORT": "9400"}).message()
    assert "T4SERVE_TELEMETRY_PORT=9400: must differ from T4SERVE_PORT" in message
    assert parse({"T4SERVE_PORT": "9400", "T4SERVE_TELEMETRY_PORT": "0"}).telemetry_port == 0


def test_all_bad_values_reported_at_once() -> None:
    message = error_for({"T4SERVE_PORT": "x", "T4SERVE_DTYPE": "int4"}).message()
    assert message.startswith("2 settings are invalid:")
    assert "T4SERVE_PORT=x" in message and "T4SERVE_DTYPE=int4" in message


def test_parse_size_units() -> None:
    assert parse_size("1KiB") == 1024
    assert parse_size("1kb") == 1000
    assert parse_size("1.5MiB") == 1572864
    assert parse_size("7") == 7
    for bad in ("", "GiB", "-1GiB", "1 parsec", "0.1"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_summary_lists_every_setting_beside_its_default_and_origin() -> None:
    s = parse({"T4SERVE_PORT": "8080"})
    lines = s.summary().splitlines()
    assert len(lines) == len(VARIABLES)
    for var, line in zip(VARIABLES, lines, strict=True):
        assert line.split()[0] == var.name
        assert f"default: {var.default_doc}" in line
    port_line = next(line for line in lines if line.split()[0] == "T4SERVE_PORT")
    assert "8080" in port_line and "[set by env]" in port_line
    assert s.to_dict()["T4SERVE_PORT"] == {"value": "8080", "default": "8000", "origin": "env"}


def test_markdown_table_has_every_variable() -> None:
    table = markdown_table()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [v.name for v in VARIABLES]
    assert "(none: secret)" in next(row for row in rows if row.startswith("| `HF_TOKEN` "))


@click.command()
@settings_options
def _show(settings: Settings) -> None:
    click.echo(f"{settings.port} {settings.origins['T4SERVE_PORT']} {settings.model.target}")


def test_options_read_env_and_flags_override(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    for var in VARIABLES:
        monkeypatch.delenv(var.name, raising=False)
    monkeypatch.setenv("T4SERVE_PORT", "8001")
    result = runner.invoke(_show, [])
    assert result.output.strip() == f"8001 env {QAT_REPO}"
    result = runner.invoke(_show, ["--port", "8002", "--model", "bf16"])
    assert result.output.strip() == f"8002 flag {BF16_REPO}"
    result = runner.invoke(_show, ["--port", "nope"])
    assert isinstance(result.exception, ConfigError)
    assert "T4SERVE_PORT=nope (from --port): must be an integer" in result.exception.message()


def test_help_shows_every_option_with_its_variable() -> None:
    text = CliRunner().invoke(_show, ["--help"], terminal_width=200).output
    for var in VARIABLES:
        if var.option:
            assert var.option in text
            assert var.name in text
    # The token itself has no option: on a command line it would show in `ps`.
    assert "--hf-token " not in text and "env var: HF_TOKEN]" not in text


@pytest.mark.parametrize(("raw", "key"), [("t4", "t4"), ("T4", "t4"), ("a10g", "a10g"), ("RTX-2080-Ti", "rtx2080ti"),
                                          ("none", None), ("off", None)])
def test_size_as_takes_a_known_gpu(raw: str, key: str | None) -> None:
    assert Settings.from_environ({"T4SERVE_SIZE_AS": raw}).size_as == key


def test_size_as_refuses_an_unknown_gpu_naming_the_table() -> None:
    message = error_for({"T4SERVE_SIZE_AS": "k80"}).message()
    assert "T4SERVE_SIZE_AS=k80" in message and "t4, rtx2080ti, a10g" in message and "set T4SERVE_SIZE_AS=t4" in message


def test_max_num_batched_tokens_auto_or_at_least_16() -> None:
    assert Settings.from_environ({}).max_num_batched_tokens is None
    assert Settings.from_environ({"T4SERVE_MAX_NUM_BATCHED_TOKENS": "4096"}).max_num_batched_tokens == 4096
    assert "T4SERVE_MAX_NUM_BATCHED_TOKENS=8" in error_for({"T4SERVE_MAX_NUM_BATCHED_TOKENS": "8"}).message()
