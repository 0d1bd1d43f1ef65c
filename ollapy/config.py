"""Every ``OLLAPY_*`` setting as a typed accessor with a description.

The table in README.md is generated from :data:`SETTINGS` by
``scripts/gen_docs.py``. Paths come from platformdirs. Nothing here imports
llama_cpp.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import platformdirs

APP = "ollapy"


@dataclass(frozen=True)
class Setting:
    """One environment setting: its variable, default (as text) and meaning."""

    env: str
    default: str
    description: str

    def raw(self) -> str:
        """Return the variable's value, or the default when unset or empty."""
        value = os.environ.get(self.env, "")
        return value if value != "" else self.default


SETTINGS: dict[str, Setting] = {}


def _setting(env: str, default: str, description: str) -> Setting:
    s = Setting(env, default, description)
    SETTINGS[env] = s
    return s


HOST = _setting(
    "OLLAPY_HOST",
    "127.0.0.1:11435",
    "Address of `ollapy serve` (host:port); the CLI uses a server there when one answers.",
)
MODELS = _setting("OLLAPY_MODELS", "", "Model store directory (default: the platform's user data dir + /models).")
CACHE_DIR = _setting("OLLAPY_CACHE_DIR", "", "Prompt-cache directory (default: the platform's user cache dir + /prompt-cache).")
DEBUG = _setting("OLLAPY_DEBUG", "0", "1 shows debug logs (slot chosen, cache hits, shifts) and tracebacks on errors.")
NUM_PARALLEL = _setting("OLLAPY_NUM_PARALLEL", "1", "Parallel slots per loaded model (each gets num_ctx tokens of KV cache).")
NUM_CTX = _setting("OLLAPY_CONTEXT_LENGTH", "4096", "Default context length per slot (num_ctx).")
MAX_QUEUE = _setting("OLLAPY_MAX_QUEUE", "512", "Requests that may wait for a slot before new ones get a 'busy' error.")
EXTRA_BUFTS = _setting(
    "OLLAPY_EXTRA_BUFTS",
    "auto",
    "CPU extra buffer types (weight repacking, AMX): auto (off only on AMX CPUs with an AMX build, where ggml crashes), on, off.",
)
NUM_THREAD = _setting("OLLAPY_NUM_THREAD", "0", "CPU threads for decoding (0 = number of physical cores).")
KEEP_ALIVE = _setting(
    "OLLAPY_KEEP_ALIVE",
    "5m",
    "How long a server keeps an idle model loaded (negative = forever, 0 = unload at once).",
)
MAX_LOADED = _setting("OLLAPY_MAX_LOADED_MODELS", "3", "Most models a server keeps loaded at once.")
NOHISTORY = _setting("OLLAPY_NOHISTORY", "0", "1 disables the interactive chat history file.")
TEST_MODELS = _setting("OLLAPY_TEST_MODELS", "", "Directory of the test GGUF models fetched by scripts/fetch_test_models.py.")
REGISTRY = _setting(
    "OLLAPY_REGISTRY",
    "https://registry.ollama.ai",
    "Ollama registry URL that names without a host are pulled from (a mirror may be set here).",
)
CATALOGUE = _setting(
    "OLLAPY_CATALOGUE",
    "",
    "Directory of catalogue files (*.toml) mapping aliases like smollm2:135m to sources (default: the bundled models/).",
)
PULL_RETRIES = _setting(
    "OLLAPY_PULL_RETRIES",
    "6",
    "Retries with backoff for a blob download after a network error or a 5xx answer.",
)


def _bool(s: Setting) -> bool:
    return s.raw().strip().lower() in {"1", "true", "yes", "on"}


def _int(s: Setting) -> int:
    try:
        return int(s.raw())
    except ValueError:
        from .errors import UsageError

        raise UsageError(f"{s.env}={s.raw()!r} is not an integer", hint=f"unset {s.env} or set it to a number") from None


def debug() -> bool:
    """True when ``OLLAPY_DEBUG`` is set to a true value."""
    return _bool(DEBUG)


def host() -> str:
    """Return ``http://host:port`` for ``OLLAPY_HOST`` (scheme optional in the variable)."""
    h = HOST.raw().strip()
    if "://" not in h:
        h = "http://" + h
    return h.rstrip("/")


def models_dir() -> Path:
    """Model store root (``OLLAPY_MODELS`` or platformdirs user data dir / models)."""
    raw = MODELS.raw()
    return Path(raw).expanduser() if raw else Path(platformdirs.user_data_dir(APP)) / "models"


def cache_dir() -> Path:
    """Prompt-cache root (``OLLAPY_CACHE_DIR`` or platformdirs user cache dir / prompt-cache)."""
    raw = CACHE_DIR.raw()
    return Path(raw).expanduser() if raw else Path(platformdirs.user_cache_dir(APP)) / "prompt-cache"


def state_dir() -> Path:
    """Directory for history and sessions (platformdirs user state dir)."""
    return Path(platformdirs.user_state_dir(APP))


def num_parallel() -> int:
    """Default number of parallel slots."""
    return max(1, _int(NUM_PARALLEL))


def num_ctx() -> int:
    """Default per-slot context length in tokens."""
    return max(16, _int(NUM_CTX))


def max_queue() -> int:
    """Bound of the request queue of one engine."""
    return max(0, _int(MAX_QUEUE))


def num_thread() -> int:
    """CPU threads (0 = choose automatically)."""
    return max(0, _int(NUM_THREAD))


def extra_bufts() -> str:
    """``auto``, ``on`` or ``off`` (see :data:`EXTRA_BUFTS`)."""
    v = EXTRA_BUFTS.raw().strip().lower()
    if v not in {"auto", "on", "off"}:
        from .errors import UsageError

        raise UsageError(f"OLLAPY_EXTRA_BUFTS={v!r} is not valid", hint="use auto, on or off")
    return v


ACCESSORS: dict[str, Callable[[], object]] = {}


# ---- prompt cache (ollapy/cache) ------------------------------------------------------------
CACHE_RAM = _setting(
    "OLLAPY_CACHE_RAM",
    "1GiB",
    "Prompt-cache RAM tier cap per process in bytes (suffixes K, M, G, KiB, MiB, GiB; 0 = no RAM tier).",
)
CACHE_DISK = _setting(
    "OLLAPY_CACHE_DISK",
    "10GiB",
    "Prompt-cache disk tier cap in bytes, enforced on every write (pinned entries are not evicted).",
)
CACHE_ENABLED = _setting("OLLAPY_CACHE", "1", "0 turns the prompt cache (RAM and disk tiers) off for every run.")
KV_CACHE_TYPE = _setting(
    "OLLAPY_KV_CACHE_TYPE",
    "f16",
    "Default KV cache type: f16, q8_0 or q4_0 (quantized types turn flash attention on).",
)

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
        from .errors import UsageError

        raise UsageError(f"{s.env}={s.raw()!r} is not a byte size", hint=f"e.g. {s.env}=2GiB or {s.env}=500000000") from None


def cache_ram_bytes() -> int:
    """RAM tier cap of the prompt cache, in bytes."""
    return _size(CACHE_RAM)


def cache_disk_bytes() -> int:
    """Disk tier cap of the prompt cache, in bytes."""
    return _size(CACHE_DISK)


def cache_enabled() -> bool:
    """False when ``OLLAPY_CACHE`` turns the prompt cache off."""
    return CACHE_ENABLED.raw().strip().lower() not in {"0", "false", "no", "off"}


def kv_cache_type() -> str:
    """Default ``kv_cache_type`` load option: f16, q8_0 or q4_0."""
    v = KV_CACHE_TYPE.raw().strip().lower()
    if v not in {"f16", "q8_0", "q4_0"}:
        from .errors import UsageError

        raise UsageError(f"OLLAPY_KV_CACHE_TYPE={v!r} is not valid", hint="use f16, q8_0 or q4_0")
    return v


# ---- server (ollapy/server, ollapy/runtime.py) ------------------------------------------------
ORIGINS = _setting(
    "OLLAPY_ORIGINS",
    "",
    "Extra CORS origins a server allows, comma separated (`*` wildcards); local origins are always allowed.",
)
MAX_BODY = _setting("OLLAPY_MAX_BODY", "32MiB", "Largest request body a server accepts (blob uploads excepted).")


def origins() -> list[str]:
    """Extra CORS origins from ``OLLAPY_ORIGINS``."""
    return [o.strip() for o in ORIGINS.raw().split(",") if o.strip()]


def max_body() -> int:
    """Request body limit of the server, in bytes."""
    return _size(MAX_BODY)


def host_port() -> tuple[str, int]:
    """``(host, port)`` that ``ollapy serve`` binds, from ``OLLAPY_HOST`` (default port 11435)."""
    from urllib.parse import urlsplit

    u = urlsplit(host())
    return (u.hostname or "127.0.0.1"), (u.port or 11435)
