"""Every OLLAPY_* setting: typed accessors that refuse invalid or out-of-range values with one clear line.

Unit tests call each accessor with bad values (the error names the variable,
the value and what it accepts) and with good ones (the value it returns);
two CLI tests run ``list`` / ``ps`` with a bad variable and check the exit
code and that stderr is one ``error:`` line (no traceback).
"""
from __future__ import annotations

import math

import pytest
from conftest import run_cli

from ollapy import config
from ollapy.errors import SettingError, UsageError

# (variable, accessor, bad values, what the message says it accepts)
BAD = [
    ("OLLAPY_NUM_PARALLEL", config.num_parallel, ["abc", "0", "-2", "1.5"], "an integer >= 1"),
    ("OLLAPY_CONTEXT_LENGTH", config.num_ctx, ["lots", "0", "-4096", "8"], "an integer >= 16"),
    ("OLLAPY_MAX_QUEUE", config.max_queue, ["x", "-1"], "an integer >= 0"),
    ("OLLAPY_NUM_THREAD", config.num_thread, ["many", "-3"], "an integer >= 0"),
    ("OLLAPY_MAX_LOADED_MODELS", config.max_loaded_models, ["two", "0", "-1"], "an integer >= 1"),
    ("OLLAPY_PULL_RETRIES", config.pull_retries, ["x", "-1", "1000"], "an integer from 0 to 100"),
    ("OLLAPY_KEEP_ALIVE", config.keep_alive, ["forever", "5x", "m5", "1h-3m", "nan"], "a duration"),
    ("OLLAPY_DEBUG", config._debug_checked, ["maybe", "2", "yess"], "a boolean"),
    ("OLLAPY_NOHISTORY", config.nohistory, ["please"], "a boolean"),
    ("OLLAPY_CACHE", config.cache_enabled, ["sometimes", "-1"], "a boolean"),
    ("OLLAPY_CACHE_RAM", config.cache_ram_bytes, ["-1", "lots", "1XB", "inf", "-5GiB"], "a byte size >= 0"),
    ("OLLAPY_CACHE_DISK", config.cache_disk_bytes, ["-10GiB", "ten"], "a byte size >= 0"),
    ("OLLAPY_MAX_BODY", config.max_body, ["-1", "big"], "a byte size >= 0"),
    ("OLLAPY_EXTRA_BUFTS", config.extra_bufts, ["maybe", "1"], "one of auto, on, off"),
    ("OLLAPY_KV_CACHE_TYPE", config.kv_cache_type, ["q5_1", "f32"], "one of f16, q8_0, q4_0"),
    ("OLLAPY_REGISTRY", config.registry_url, ["registry.ollama.ai", "ftp://x", "http://", "http://x:abc"],
     "an http:// or https:// URL"),
    ("OLLAPY_ORIGINS", config.origins, ["localhost:3000", "https://ok.example,not an origin"], "comma-separated"),
    ("OLLAPY_HOST", config.host, ["::bad::", "host:99999", "http://x:abc", "ftp://x:1", "x:0", "a b:1",
                                  "http://x:1/path", "user@x:1"], "[http[s]://]host[:port]"),
]


@pytest.mark.parametrize("env,accessor,values,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_value_is_one_line_naming_the_variable(monkeypatch, env, accessor, values, expected):
    for value in values:
        monkeypatch.setenv(env, value)
        with pytest.raises(SettingError) as info:
            accessor()
        exc = info.value
        assert isinstance(exc, UsageError) and exc.exit_code == 2 and exc.status == 400
        assert str(exc).startswith(f"{env}={value!r} is not valid: expected {expected}"), str(exc)
        assert "\n" not in str(exc)
        with pytest.raises(SettingError):  # check_settings finds it too (the CLI runs it first)
            config.check_settings()


def test_num_parallel_message_exactly(monkeypatch):
    monkeypatch.setenv("OLLAPY_NUM_PARALLEL", "abc")
    with pytest.raises(SettingError) as info:
        config.num_parallel()
    assert info.value.message == "OLLAPY_NUM_PARALLEL='abc' is not valid: expected an integer >= 1"


GOOD = [
    ("OLLAPY_NUM_PARALLEL", config.num_parallel, " 4 ", 4),
    ("OLLAPY_CONTEXT_LENGTH", config.num_ctx, "16", 16),
    ("OLLAPY_MAX_QUEUE", config.max_queue, "0", 0),
    ("OLLAPY_NUM_THREAD", config.num_thread, "0", 0),
    ("OLLAPY_MAX_LOADED_MODELS", config.max_loaded_models, "2", 2),
    ("OLLAPY_PULL_RETRIES", config.pull_retries, "0", 0),
    ("OLLAPY_KEEP_ALIVE", config.keep_alive, "5m", 300.0),
    ("OLLAPY_KEEP_ALIVE", config.keep_alive, "1h30m", 5400.0),
    ("OLLAPY_KEEP_ALIVE", config.keep_alive, "90", 90.0),
    ("OLLAPY_KEEP_ALIVE", config.keep_alive, "0", 0.0),
    ("OLLAPY_KEEP_ALIVE", config.keep_alive, "-1", math.inf),
    ("OLLAPY_KEEP_ALIVE", config.keep_alive, "-1m", math.inf),
    ("OLLAPY_DEBUG", config._debug_checked, "TRUE", True),
    ("OLLAPY_NOHISTORY", config.nohistory, "off", False),
    ("OLLAPY_CACHE", config.cache_enabled, "no", False),
    ("OLLAPY_CACHE_RAM", config.cache_ram_bytes, "1.5GiB", 1610612736),
    ("OLLAPY_CACHE_DISK", config.cache_disk_bytes, "0", 0),
    ("OLLAPY_MAX_BODY", config.max_body, "500M", 500_000_000),
    ("OLLAPY_EXTRA_BUFTS", config.extra_bufts, "OFF", "off"),
    ("OLLAPY_KV_CACHE_TYPE", config.kv_cache_type, "Q8_0", "q8_0"),
    ("OLLAPY_REGISTRY", config.registry_url, "http://127.0.0.1:5000/", "http://127.0.0.1:5000"),
    ("OLLAPY_ORIGINS", config.origins, "https://a.example, chrome-extension://*", ["https://a.example",
                                                                                  "chrome-extension://*"]),
    ("OLLAPY_HOST", config.host, "0.0.0.0:8080", "http://0.0.0.0:8080"),
    ("OLLAPY_HOST", config.host, "myhost", "http://myhost:11435"),
    ("OLLAPY_HOST", config.host, "https://example.com/", "https://example.com:443"),
    ("OLLAPY_HOST", config.host, "::1", "http://[::1]:11435"),
    ("OLLAPY_HOST", config.host, "[::1]:9000", "http://[::1]:9000"),
    ("OLLAPY_HOST", config.host, ":9000", "http://127.0.0.1:9000"),
]


@pytest.mark.parametrize("env,accessor,value,want", GOOD, ids=[f"{g[0]}={g[2]}" for g in GOOD])
def test_good_value(monkeypatch, env, accessor, value, want):
    monkeypatch.setenv(env, value)
    assert accessor() == want


def test_defaults_pass_and_every_setting_has_an_accessor(monkeypatch):
    for env in config.SETTINGS:
        monkeypatch.delenv(env, raising=False)
    assert set(config.ACCESSORS) == set(config.SETTINGS)
    config.check_settings()
    assert config.host() == "http://127.0.0.1:11435" and config.host_port() == ("127.0.0.1", 11435)
    assert config.keep_alive() == 300.0 and config.num_parallel() == 1 and config.max_loaded_models() == 3


def test_host_port_follows_host(monkeypatch):
    monkeypatch.setenv("OLLAPY_HOST", "[::1]:9000")
    assert config.host_port() == ("::1", 9000)
    monkeypatch.setenv("OLLAPY_HOST", "host:99999")
    with pytest.raises(SettingError):
        config.host_port()


def test_debug_never_raises_while_reporting(monkeypatch):
    monkeypatch.setenv("OLLAPY_DEBUG", "maybe")
    assert config.debug() is False  # error reporting asks it; check_settings reports the bad value instead


def test_callers_use_the_strict_accessors(monkeypatch):
    """The server's keep-alive default, max loaded models and the pull retry budget no longer fall back silently."""
    from ollapy.server import scheduler as runtime
    from ollapy.store import download

    monkeypatch.setenv("OLLAPY_KEEP_ALIVE", "soon")
    with pytest.raises(SettingError, match="OLLAPY_KEEP_ALIVE='soon'"):
        runtime.parse_keep_alive(None)
    monkeypatch.setenv("OLLAPY_MAX_LOADED_MODELS", "x")
    with pytest.raises(SettingError, match="OLLAPY_MAX_LOADED_MODELS='x'"):
        runtime.max_loaded()
    monkeypatch.setenv("OLLAPY_PULL_RETRIES", "-1")
    with pytest.raises(SettingError, match="OLLAPY_PULL_RETRIES='-1'"):
        download.pull_retries()



# ---- the one Go-duration parser (OLLAPY_KEEP_ALIVE and a request's keep_alive) ----------------
# (value, seconds with allow_negative=False, seconds with allow_negative=True); None = ValueError
DURATIONS = [
    ("5m", 300.0, 300.0),
    ("1h30m", 5400.0, 5400.0),
    ("300ms", 0.3, 0.3),
    ("1.5s", 1.5, 1.5),
    (".5s", 0.5, 0.5),
    ("2h45m30.5s", 9930.5, 9930.5),
    ("10us", 1e-5, 1e-5),
    ("10µs", 1e-5, 1e-5),
    ("7ns", 7e-9, 7e-9),
    ("+5m", 300.0, 300.0),
    (" 90 ", 90.0, 90.0),
    ("1.5", 1.5, 1.5),
    ("0", 0.0, 0.0),
    ("0s", 0.0, 0.0),
    (90, 90.0, 90.0),
    (2.5, 2.5, 2.5),
    (0, 0.0, 0.0),
    ("-1", None, math.inf),
    ("-1m", None, math.inf),
    ("-0.5s", None, math.inf),
    (-1, None, math.inf),
    (-3.5, None, math.inf),
    ("", None, None),
    ("  ", None, None),
    ("forever", None, None),
    ("5x", None, None),
    ("m5", None, None),
    ("5 m", None, None),
    ("1h-3m", None, None),
    ("--5m", None, None),
    ("-", None, None),
    ("nan", None, None),
    ("inf", None, None),
    ("-inf", None, None),
    (math.nan, None, None),
    (math.inf, None, None),
    (True, None, None),
    (10**400, None, None),
]


@pytest.mark.parametrize("value,plain,negative_forever", DURATIONS, ids=[repr(d[0])[:20] for d in DURATIONS])
def test_parse_duration_table(value, plain, negative_forever):
    from ollapy.duration import parse_duration

    for allow_negative, want in ((False, plain), (True, negative_forever)):
        if want is None:
            with pytest.raises(ValueError):
                parse_duration(value, allow_negative=allow_negative)
        else:
            assert parse_duration(value, allow_negative=allow_negative) == pytest.approx(want, rel=1e-12), value


def test_both_keep_alive_callers_use_the_one_parser(monkeypatch):
    """The env setting and the request field agree on every form; each turns ValueError into its own error."""
    from ollapy.errors import OptionError
    from ollapy.server import scheduler as runtime

    for value, _plain, want in DURATIONS:
        if value == "":  # the default to both callers (an empty variable counts as unset)
            continue
        if isinstance(value, str):
            monkeypatch.setenv("OLLAPY_KEEP_ALIVE", value)
            if want is None:
                with pytest.raises(SettingError, match="OLLAPY_KEEP_ALIVE="):
                    config.keep_alive()
            else:
                assert config.keep_alive() == pytest.approx(want, rel=1e-12)
        if want is None:
            with pytest.raises(OptionError, match="is not a duration"):
                runtime.parse_keep_alive(value)
        else:
            assert runtime.parse_keep_alive(value) == pytest.approx(want, rel=1e-12)
    monkeypatch.setenv("OLLAPY_KEEP_ALIVE", "2m")
    assert runtime.parse_keep_alive(None) == runtime.parse_keep_alive("") == 120.0


def _one_error_line(proc) -> str:
    err = proc.stderr.decode()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1, err  # one line: the error with its hint in parentheses
    assert lines[0].lower().startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("env,value", [("OLLAPY_NUM_PARALLEL", "abc"), ("OLLAPY_KEEP_ALIVE", "5x"),
                                       ("OLLAPY_CACHE_RAM", "-1")])
def test_cli_list_with_bad_setting(env, value):
    proc = run_cli("list", env={env: value})
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc)
    assert f"{env}={value!r} is not valid: expected" in line
    assert proc.stdout == b""


@pytest.mark.parametrize("value", ["::bad::", "host:99999", "http://x:abc"])
def test_cli_ps_with_bad_host(value):
    proc = run_cli("ps", env={"OLLAPY_HOST": value})
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc)
    assert f"OLLAPY_HOST={value!r} is not valid: expected [http[s]://]host[:port]" in line
    for raw_name in ("ValueError", "InvalidURL", "Port could not be cast", "out of range 0-65535"):
        assert raw_name not in line
