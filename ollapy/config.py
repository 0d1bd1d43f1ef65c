"""Every ``OLLAPY_*`` setting as a typed accessor: its value read, checked and converted.

The settings themselves (variable, default, description) are declared in :mod:`ollapy.settings`, whose names
are re-exported here (``config.HOST``, ``config.SETTINGS``...); the table in README.md is generated from
:data:`SETTINGS` by ``scripts/gen_docs.py``. Paths come from platformdirs. Nothing here imports llama_cpp.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import platformdirs

from ollapy.duration import parse_duration
from ollapy.settings import (
    ALLOWED_HOSTS,
    API_KEY,
    CACHE_DIR,
    CACHE_DISK,
    CACHE_ENABLED,
    CACHE_NAMESPACE,
    CACHE_RAM,
    CACHE_REMOTE,
    CACHE_REMOTE_PASSWORD_FILE,
    CACHE_TENANT,
    CATALOGUE,
    DEBUG,
    DRAFT_ROW_COST,
    EXTRA_BUFTS,
    HOST,
    KEEP_ALIVE,
    KV_CACHE_TYPE,
    MAX_BODY,
    MAX_LOADED,
    MAX_MEMORY,
    MAX_QUEUE,
    MODELS,
    NO_WEBUI,
    NOHISTORY,
    NUM_CTX,
    NUM_PARALLEL,
    NUM_THREAD,
    ORIGINS,
    PULL_RETRIES,
    REGISTRY,
    REQUEST_IMAGE_PIXELS,
    RESPONSES_STORE,
    RPC,
    RUNNER,
    RUNNER_TIMEOUT,
    SERVER_IMAGE_PIXELS,
    SETTINGS,
    TEST_MODELS,
    Setting,
    _setting,  # noqa: F401 - still importable here; declare new settings in ollapy.settings
)

APP = "ollapy"


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_BOOL_TEXT = "a boolean: 1, 0, true, false, yes, no, on or off"


def invalid(s: Setting, expected: str, hint: str = "") -> Exception:
    """The one error for a bad ``OLLAPY_*`` value: ``OLLAPY_X='v' is not valid: expected ...`` (UsageError, exit 2)."""
    from ollapy.errors import SettingError

    return SettingError(s.env, s.raw(), expected, hint=hint)


def _bool(s: Setting) -> bool:
    """``s`` as a boolean; raises SettingError for anything but 1/0/true/false/yes/no/on/off."""
    v = s.raw().strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise invalid(s, _BOOL_TEXT)


def _int(s: Setting, minimum: int | None = None, maximum: int | None = None) -> int:
    """``s`` as an integer in ``[minimum, maximum]``; raises SettingError (not a number, or out of range)."""
    if minimum is not None and maximum is not None:
        expected = f"an integer from {minimum} to {maximum}"
    elif minimum is not None:
        expected = f"an integer >= {minimum}"
    else:
        expected = "an integer"
    try:
        value = int(s.raw().strip())
    except ValueError:
        raise invalid(s, expected) from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise invalid(s, expected)
    return value


def _choice(s: Setting, choices: tuple[str, ...]) -> str:
    """``s`` lower-cased when it is one of ``choices``; raises SettingError otherwise."""
    v = s.raw().strip().lower()
    if v not in choices:
        raise invalid(s, "one of " + ", ".join(choices))
    return v


def debug() -> bool:
    """True when ``OLLAPY_DEBUG`` is set to a true value.

    Never raises (error reporting itself asks it): a bad value reads as off
    here and is reported by :func:`check_settings`, which the CLI runs first.
    """
    return DEBUG.raw().strip().lower() in _TRUE


def _debug_checked() -> bool:
    return _bool(DEBUG)


_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?$")
_HOST_TEXT = "[http[s]://]host[:port] with a port from 1 to 65535, e.g. 127.0.0.1:11435"
DEFAULT_PORT = 11435


def _host_parts() -> tuple[str, str, int]:
    """``(scheme, hostname, port)`` of ``OLLAPY_HOST``; raises SettingError for a bad value.

    Without a scheme the port defaults to 11435; with ``http://`` or
    ``https://`` and no port, to 80 or 443 (as Ollama does). An empty host
    (``:8080``) means 127.0.0.1. A bare IPv6 address (``::1``) is accepted.
    """
    import ipaddress
    from urllib.parse import urlsplit

    raw = HOST.raw().strip().strip("\"'").strip()
    scheme_given = "://" in raw
    text = raw if scheme_given else "http://" + raw
    try:
        ipaddress.IPv6Address(text.split("://", 1)[1].rstrip("/"))
        text = text.split("://", 1)[0] + "://[" + text.split("://", 1)[1].rstrip("/") + "]"
    except ValueError:
        pass
    try:
        u = urlsplit(text)
        port = u.port
        hostname = u.hostname or ""
    except ValueError:
        raise invalid(HOST, _HOST_TEXT) from None
    scheme = u.scheme.lower()
    if scheme not in ("http", "https") or u.path.strip("/") or u.query or u.fragment or "@" in u.netloc:
        raise invalid(HOST, _HOST_TEXT)
    if "[" in u.netloc:
        try:
            ipaddress.IPv6Address(hostname)
        except ValueError:
            raise invalid(HOST, _HOST_TEXT) from None
    elif hostname and not _HOSTNAME.match(hostname):
        raise invalid(HOST, _HOST_TEXT)
    if port is None:
        port = {"http": 80, "https": 443}[scheme] if scheme_given else DEFAULT_PORT
    if not 1 <= port <= 65535:
        raise invalid(HOST, _HOST_TEXT)
    return scheme, hostname or "127.0.0.1", port


def host() -> str:
    """Return ``http[s]://host:port`` for ``OLLAPY_HOST`` (scheme and port optional in the variable).

    Raises SettingError for a value that is not ``[http[s]://]host[:port]``.
    """
    scheme, hostname, port = _host_parts()
    shown = f"[{hostname}]" if ":" in hostname else hostname
    return f"{scheme}://{shown}:{port}"


def models_dir() -> Path:
    """Model store root (``OLLAPY_MODELS`` or platformdirs user data dir / models)."""
    raw = MODELS.raw()
    return Path(raw).expanduser() if raw else Path(platformdirs.user_data_dir(APP)) / "models"


def cache_dir() -> Path:
    """Prompt-cache root (``OLLAPY_CACHE_DIR`` or platformdirs user cache dir / prompt-cache)."""
    raw = CACHE_DIR.raw()
    return Path(raw).expanduser() if raw else Path(platformdirs.user_cache_dir(APP)) / "prompt-cache"


def step_costs_dir() -> Path:
    """The draft policy's remembered step times (engine/step_costs.py): ``step-costs`` beside the prompt-cache
    root, so ``OLLAPY_CACHE_DIR`` moves both."""
    return cache_dir().parent / "step-costs"


def state_dir() -> Path:
    """Directory for history and sessions (platformdirs user state dir)."""
    return Path(platformdirs.user_state_dir(APP))


def draft_row_cost() -> float | None:
    """The pinned per-row cost of the draft policy (a fraction of a one-row step), or None to measure it; raises
    SettingError."""
    raw = DRAFT_ROW_COST.raw().strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise invalid(DRAFT_ROW_COST, "a number from 0 to 1, or empty") from None
    if not 0.0 <= value <= 1.0:
        raise invalid(DRAFT_ROW_COST, "a number from 0 to 1, or empty")
    return value


def num_parallel() -> int:
    """Default number of parallel slots (>= 1); raises SettingError."""
    return _int(NUM_PARALLEL, 1)


MIN_CTX = 16


def num_ctx() -> int:
    """Default per-slot context length in tokens (>= 16); raises SettingError."""
    return _int(NUM_CTX, MIN_CTX)


def max_queue() -> int:
    """Bound of the request queue of one engine (>= 0; 0 = no waiting); raises SettingError."""
    return _int(MAX_QUEUE, 0)


def request_image_pixels() -> int:
    """Decoded pixels one request's images may total (>= 1); raises SettingError."""
    return _int(REQUEST_IMAGE_PIXELS, 1)


def server_image_pixels() -> int:
    """Decoded pixels the requests of this process may hold at once (>= 1); raises SettingError."""
    return _int(SERVER_IMAGE_PIXELS, 1)


def num_thread() -> int:
    """CPU threads (0 = choose automatically); raises SettingError."""
    return _int(NUM_THREAD, 0)


def max_loaded_models() -> int:
    """``OLLAPY_MAX_LOADED_MODELS`` (>= 1); raises SettingError."""
    return _int(MAX_LOADED, 1)


def pull_retries() -> int:
    """``OLLAPY_PULL_RETRIES``: retries per blob download (0 to 100); raises SettingError."""
    return _int(PULL_RETRIES, 0, 100)


def nohistory() -> bool:
    """True when ``OLLAPY_NOHISTORY`` turns the chat history file off; raises SettingError."""
    return _bool(NOHISTORY)


def registry_url() -> str:
    """``OLLAPY_REGISTRY`` without a trailing slash; raises SettingError unless it is an http(s) URL."""
    from urllib.parse import urlsplit

    raw = REGISTRY.raw().strip().rstrip("/")
    try:
        u = urlsplit(raw)
        u.port  # noqa: B018 - validates the port
    except ValueError:
        raise invalid(REGISTRY, "an http:// or https:// URL, e.g. https://registry.ollama.ai") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise invalid(REGISTRY, "an http:// or https:// URL, e.g. https://registry.ollama.ai")
    return raw


def keep_alive() -> float:
    """``OLLAPY_KEEP_ALIVE`` in seconds (``inf`` for a negative value = forever); raises SettingError."""
    try:
        return parse_duration(KEEP_ALIVE.raw(), allow_negative=True)
    except ValueError:
        raise invalid(KEEP_ALIVE, "a duration such as 5m, 1h, 30s, 0 (unload at once) or -1 (forever)") from None


def extra_bufts() -> str:
    """``auto``, ``on`` or ``off`` (see :data:`EXTRA_BUFTS`); raises SettingError."""
    return _choice(EXTRA_BUFTS, ("auto", "on", "off"))


def rpc() -> str:
    """``OLLAPY_RPC`` normalized (``"host:port,host:port"``, ``""`` = none); raises SettingError."""
    from ollapy.errors import OptionError
    from ollapy.rpc_endpoint import parse_endpoints

    try:
        return ",".join(parse_endpoints(RPC.raw()))
    except OptionError:
        raise invalid(RPC, "HOST:PORT items separated by commas, e.g. 192.168.1.10:50052") from None


def runner() -> str:
    """``auto`` or ``process`` (see :data:`RUNNER`); raises SettingError."""
    return _choice(RUNNER, ("auto", "process"))


def runner_timeout() -> float:
    """``OLLAPY_RUNNER_TIMEOUT`` in seconds (>= 1); raises SettingError."""
    return float(_int(RUNNER_TIMEOUT, 1))


def max_memory() -> int | None:
    """``OLLAPY_MAX_MEMORY`` in bytes, None when unset (then the runtime measures what is available);
    raises SettingError."""
    return _size(MAX_MEMORY) if MAX_MEMORY.raw() else None


ACCESSORS: dict[str, Callable[[], object]] = {}


# ---- prompt cache (ollapy/cache) ------------------------------------------------------------
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
               "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_size(text: str) -> int:
    """Parse a byte size such as ``1073741824``, ``500M``, ``1.5GiB``; raises ValueError."""
    s = text.strip().lower().replace("_", "").replace(" ", "")
    num = s.rstrip("kmgtib")
    unit = s[len(num):]
    if unit not in _SIZE_UNITS or not num:
        raise ValueError(text)
    value = float(num) * _SIZE_UNITS[unit]
    if not 0 <= value < float("inf"):
        raise ValueError(text)
    return int(value)


def _size(s: Setting) -> int:
    try:
        return parse_size(s.raw())
    except ValueError:
        raise invalid(s, "a byte size >= 0 such as 2GiB, 500M or 500000000") from None


def cache_ram_bytes() -> int:
    """RAM tier cap of the prompt cache, in bytes."""
    return _size(CACHE_RAM)


def cache_disk_bytes() -> int:
    """Disk tier cap of the prompt cache, in bytes."""
    return _size(CACHE_DISK)


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: the only form of a store URL ever shown."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
    except ValueError:
        return "<unparsable URL>"
    return urlunsplit((parts.scheme, f"{parts.username or ''}:***@{host}", parts.path, parts.query, parts.fragment))


def cache_remote() -> str:
    """``OLLAPY_CACHE_REMOTE`` stripped (``""``: no remote tier); raises SettingError for another scheme than
    redis, rediss, valkey, valkeys or unix (the rest of the URL is checked when the store opens)."""
    url = CACHE_REMOTE.raw().strip()
    if url and url.split("://", 1)[0].lower() not in ("redis", "rediss", "valkey", "valkeys", "unix"):
        from ollapy.errors import SettingError

        raise SettingError(CACHE_REMOTE.env, redact_url(url), "redis://[user:password@]host:port[/db], rediss://, "
                           "valkey://, valkeys:// or unix:///path")
    return url


def cache_remote_password_file() -> str:
    """``OLLAPY_CACHE_REMOTE_PASSWORD_FILE`` (``""``: none)."""
    return CACHE_REMOTE_PASSWORD_FILE.raw().strip()


def cache_namespace() -> str:
    """``OLLAPY_CACHE_NAMESPACE``; raises SettingError unless it is 1-64 characters of letters, digits, ``._-``."""
    ns = CACHE_NAMESPACE.raw().strip()
    if not (0 < len(ns) <= 64 and all(c.isascii() and (c.isalnum() or c in "._-") for c in ns)):
        raise invalid(CACHE_NAMESPACE, "1 to 64 letters, digits, '.', '_' or '-', e.g. prod-eu")
    return ns


def cache_tenant() -> str:
    """The server-side tenant id that goes into the prompt cache's salt: ``OLLAPY_CACHE_TENANT``, else a hash
    of ``OLLAPY_API_KEY`` when a key is set (the key itself never), else ``""`` (no tenant)."""
    import hashlib

    t = CACHE_TENANT.raw().strip()
    if t:
        return t
    key = API_KEY.raw().strip()
    return "key-" + hashlib.blake2b(key.encode(), digest_size=8).hexdigest() if key else ""


def cache_enabled() -> bool:
    """False when ``OLLAPY_CACHE`` turns the prompt cache off; raises SettingError for a bad boolean."""
    return _bool(CACHE_ENABLED)


def kv_cache_type() -> str:
    """Default ``kv_cache_type`` load option: f16, q8_0 or q4_0."""
    return _choice(KV_CACHE_TYPE, ("f16", "q8_0", "q4_0"))


# ---- server (ollapy/server, ollapy/server/scheduler.py) ------------------------------------------------
_ORIGIN = re.compile(r"^(\*|[A-Za-z*][A-Za-z0-9+.*-]*://[^\s/?#]*)$")


def origins() -> list[str]:
    """Extra CORS origins from ``OLLAPY_ORIGINS`` (``scheme://host[:port]``, ``*`` wildcards); raises SettingError."""
    out = [o.strip() for o in ORIGINS.raw().split(",") if o.strip()]
    for o in out:
        if not _ORIGIN.match(o):
            raise invalid(ORIGINS, "comma-separated origins such as https://example.com,chrome-extension://*")
    return out


_ALLOWED_HOST = re.compile(r"^(\*|(\*\.)?[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?)$")


def allowed_hosts() -> list[str]:
    """Extra Host names from ``OLLAPY_ALLOWED_HOSTS``, lower-cased (``name``, ``*.domain`` or ``*``); raises
    SettingError for anything else (a port, a scheme, a path)."""
    out = [h.strip().lower() for h in ALLOWED_HOSTS.raw().split(",") if h.strip()]
    for h in out:
        if not _ALLOWED_HOST.match(h):
            raise invalid(ALLOWED_HOSTS, "comma-separated host names such as myhost.lan,*.example.com (no port)")
    return out


def no_webui() -> bool:
    """True when ``OLLAPY_NO_WEBUI`` turns the server's chat page off; raises SettingError for a non-boolean."""
    return _bool(NO_WEBUI)


def max_body() -> int:
    """Request body limit of the server, in bytes."""
    return _size(MAX_BODY)


def responses_store_bytes() -> int:
    """Bound of the server's store of ``/v1/responses`` responses, in bytes."""
    return _size(RESPONSES_STORE)


def api_key() -> str:
    """``OLLAPY_API_KEY`` without surrounding blanks (``""`` = no key); raises SettingError for a key with
    blanks or control characters inside (it could not travel in an HTTP header)."""
    key = API_KEY.raw().strip()
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in key) or not key.isascii():
        from ollapy.errors import SettingError

        # the value is a secret: never echoed in the error
        raise SettingError(API_KEY.env, "…", "printable ASCII without blanks, e.g. the output of "
                                              "`openssl rand -hex 32`")
    return key


def host_port() -> tuple[str, int]:
    """``(host, port)`` that ``ollapy serve`` binds, from ``OLLAPY_HOST`` (default port 11435)."""
    _, hostname, port = _host_parts()
    return hostname, port


def _catalogue_raw() -> str:
    return CATALOGUE.raw()


def _test_models_raw() -> str:
    return TEST_MODELS.raw()


ACCESSORS.update({
    HOST.env: host, MODELS.env: models_dir, CACHE_DIR.env: cache_dir, DEBUG.env: _debug_checked,
    NUM_PARALLEL.env: num_parallel, NUM_CTX.env: num_ctx, MAX_QUEUE.env: max_queue, EXTRA_BUFTS.env: extra_bufts,
    DRAFT_ROW_COST.env: draft_row_cost,
    NUM_THREAD.env: num_thread, KEEP_ALIVE.env: keep_alive, MAX_LOADED.env: max_loaded_models,
    NOHISTORY.env: nohistory, TEST_MODELS.env: _test_models_raw, REGISTRY.env: registry_url,
    CATALOGUE.env: _catalogue_raw, PULL_RETRIES.env: pull_retries, CACHE_RAM.env: cache_ram_bytes,
    CACHE_DISK.env: cache_disk_bytes, CACHE_ENABLED.env: cache_enabled, KV_CACHE_TYPE.env: kv_cache_type,
    ORIGINS.env: origins, MAX_BODY.env: max_body, RESPONSES_STORE.env: responses_store_bytes, RPC.env: rpc,
    RUNNER.env: runner, RUNNER_TIMEOUT.env: runner_timeout, MAX_MEMORY.env: max_memory,
    API_KEY.env: api_key, ALLOWED_HOSTS.env: allowed_hosts,
    REQUEST_IMAGE_PIXELS.env: request_image_pixels, SERVER_IMAGE_PIXELS.env: server_image_pixels,
})
ACCESSORS[NO_WEBUI.env] = no_webui
ACCESSORS.update({CACHE_REMOTE.env: lambda: cache_remote(), CACHE_REMOTE_PASSWORD_FILE.env: lambda: cache_remote_password_file(),
                  CACHE_NAMESPACE.env: lambda: cache_namespace(), CACHE_TENANT.env: lambda: cache_tenant()})


def check_settings() -> None:
    """Read every ``OLLAPY_*`` setting through its accessor; raise the first SettingError.

    The CLI calls this before any command, so a bad value is one clear line
    and exit 2 instead of a surprise later (or a silently odd value).
    """
    for env in SETTINGS:
        ACCESSORS[env]()
