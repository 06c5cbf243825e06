"""t4serve.untrusted, function by function: numbers, text, paths, hosts, secrets, bounded files and JSON. The
property-based and end-to-end attacks on these checks are the hardening suites' (test_hardening*.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from t4serve.untrusted import (
    REDACTED,
    Untrusted,
    check_finite,
    check_host,
    check_int,
    check_path,
    check_relative_name,
    check_secret,
    check_text,
    is_inside,
    json_depth,
    load_json_file,
    loads_json,
    parse_float,
    parse_int,
    printable,
    read_tail_bounded,
    read_text_bounded,
    redact_flags,
    secret_values,
)


def test_parse_int() -> None:
    assert parse_int(" 16384 ", 1, 1 << 20) == 16384 and parse_int("-3", -5, 5) == -3
    # ASCII decimal only: no underscores, no other scripts' digits (Arabic-Indic, fullwidth), no base prefix.
    for bad in ("1.5", "0x10", "", "1" * 20, "99", "1_0", "\u0663", "\uff13", "3\u0663", "0o7", "1e1"):
        with pytest.raises(Untrusted, match="integer from 1 to 50"):
            parse_int(bad, 1, 50)


def test_parse_float() -> None:
    assert parse_float("0.9", 0, 1) == 0.9 and parse_float(".5e1", 0, 10) == 5.0
    for bad in ("nan", "inf", "1e309", "0x1p3", "2", "0", "0_5", "\u0660.\u0669", "\uff10.5"):
        with pytest.raises(Untrusted, match="a number > 0 and <= 1"):
            parse_float(bad, 0, 1, lo_open=True)


def test_check_int_and_finite() -> None:
    assert check_int(3, "n", 0, 5) == 3 and check_finite(2, "x") == 2.0
    for bad in (True, 2.0, "3", 9):
        with pytest.raises(Untrusted, match="n must be an integer from 0 to 5"):
            check_int(bad, "n", 0, 5)
    for bad_value in (float("nan"), float("inf"), False, "1"):
        with pytest.raises(Untrusted, match="x must be a"):
            check_finite(bad_value, "x")


def test_text_and_printable() -> None:
    assert check_text("plain é", "v") == "plain é"
    assert check_text("a\tb\n", "v", allow_blanks=True) == "a\tb\n"
    with pytest.raises(Untrusted, match=r"v must hold no control characters \(found '\\n' at index 1\)"):
        check_text("a\nb", "v")
    with pytest.raises(Untrusted, match="must be valid UTF-8"):
        check_text("a\udcff", "v")
    assert printable("a\nb\x1b") == "a\\nb\\x1b" and printable("ok") == "ok"


def test_paths_and_names(tmp_path: Path) -> None:
    assert check_path("/cache/huggingface") == "/cache/huggingface"
    with pytest.raises(Untrusted, match="no component over 255 bytes"):
        check_path("/" + "a" * 256)
    with pytest.raises(Untrusted, match="at most 4095 bytes"):
        check_path("/a" * 2100)
    assert check_relative_name("sub/model.safetensors", "file") == "sub/model.safetensors"
    for bad in ("/etc/passwd", "../x", "a//b", "", 3):
        with pytest.raises(Untrusted):
            check_relative_name(bad, "file")
    (tmp_path / "in").mkdir()
    os.symlink("/", tmp_path / "in" / "out")
    assert is_inside(tmp_path / "in", tmp_path) and not is_inside(tmp_path / "in" / "out", tmp_path)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "127.0.0.1", "gpu-box", "node-1.example.com"])
def test_hosts_accepted(host: str) -> None:
    assert check_host(host) == host


# Each reads as a number in some base to inet_aton or a URL parser: 0x10 is 0.0.0.16, 017.1 is 15.0.0.1.
@pytest.mark.parametrize("host", ["1.5", "nan", "1e5", "a.123", "-bad", "a b", "", "0x10", "0x7f000001", "017.1", "1",
                                  "0x7f.1", "gpu.0x1f", "gpu.0x", "1_0", "\u0663", "\u0661\u0662\u0667.0.0.1"])
def test_hosts_refused(host: str) -> None:
    with pytest.raises(Untrusted):
        check_host(host)


def test_secrets_are_checked_without_being_quoted() -> None:
    assert check_secret("  hf_abc  ", "token") == "hf_abc"
    for bad in ("", "two words", "x" * 5000, "a\x00b"):
        with pytest.raises(Untrusted) as caught:
            check_secret(bad, "token")
        assert bad.strip() == "" or bad.strip() not in caught.value.reason
    with pytest.raises(Untrusted, match="printable ASCII"):
        check_secret("kéy", "key", printable_ascii=True)


def is_secret(flag: str) -> bool:
    return flag == "--api-key"


def test_redacting_flags() -> None:
    assert redact_flags("--seed 1", is_secret) == "--seed 1"
    assert redact_flags("--api-key sk-1 --seed 1", is_secret) == f"--api-key {REDACTED} --seed {REDACTED}"
    assert redact_flags("--api-key=sk-1", is_secret) == f"--api-key={REDACTED}"
    assert redact_flags("'--api-key sk", is_secret) == REDACTED  # unbalanced quote: all of it
    assert secret_values("--api-key sk-1 --seed 1", is_secret) == ["sk-1"]
    assert secret_values("--api-key=sk-22", is_secret) == ["sk-22"]


def test_json_limits() -> None:
    assert loads_json(b'{"a": [1, 2.5, "x"]}', "doc") == {"a": [1, 2.5, "x"]}
    assert json_depth('{"a": "[[[[", "b": [[1]]}') == 3
    for bad, says in (
        (b"\xff", "must be UTF-8 JSON"),
        ("[" * 40 + "]" * 40, "must nest at most 32 levels"),
        ("NaN", "finite numbers only"),
        ("1e309", "finite numbers only"),
        ("1" * 25, "integers of at most 19 digits"),
        ('{"a": 1, "a": 2}', "must not repeat the key 'a'"),
        ("{", "is not valid JSON"),
    ):
        with pytest.raises(Untrusted, match=says):
            loads_json(bad, "doc")


def test_bounded_files(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text('{"ok": true}')
    assert load_json_file(path, 100, "the file") == {"ok": True}
    with pytest.raises(Untrusted, match="at most 5 bytes"):
        load_json_file(path, 5, "the file")
    with pytest.raises(Untrusted, match="must be a regular file"):
        read_text_bounded(tmp_path, 100, "the file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(Untrusted, match=r"fifo must be a regular file \(it is a FIFO\)"):
        read_text_bounded(fifo, 100, "the file")
    with pytest.raises(Untrusted, match=r"/dev/zero must be a regular file \(it is a character device\)"):
        read_text_bounded(Path("/dev/zero"), 100, "the file")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(Untrusted, match="loop cannot be opened"):
        read_text_bounded(tmp_path / "loop", 100, "the file")
    (tmp_path / "log").write_bytes(b"a" * 100 + b"end")
    assert read_tail_bounded(tmp_path / "log", 3, "the log") == b"end"
    with pytest.raises(Untrusted, match="it is a FIFO"):
        read_tail_bounded(fifo, 3, "the log")
    (tmp_path / "latin1").write_bytes(b"caf\xe9")
    with pytest.raises(Untrusted, match="must be UTF-8 text"):
        read_text_bounded(tmp_path / "latin1", 100, "the file")
    with pytest.raises(FileNotFoundError):
        read_text_bounded(tmp_path / "absent", 100, "the file")
