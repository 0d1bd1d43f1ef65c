"""The table of ``OLLAPY_*`` settings: each variable, its default (as text) and its meaning.

:data:`SETTINGS` holds every :class:`Setting` in declaration order; the table in README.md (docs/settings.md) is
generated from it by ``scripts/gen_docs.py``. Reading a value as its type, and checking it, is
:mod:`ollapy.config`'s (which re-exports every name here). Nothing here imports llama_cpp.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


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
MAX_QUEUE = _setting("OLLAPY_MAX_QUEUE", "512", "Requests that may wait for a slot (per model), or for a model "
                     "to load, before new ones get a 'busy' error (HTTP 503 with Retry-After).")
REQUEST_IMAGE_PIXELS = _setting("OLLAPY_REQUEST_IMAGE_PIXELS", "64000000",
                                 "Decoded pixels (width x height, summed over its images) one request may send; more "
                                 "is a 400. Each image is decoded to 3 bytes a pixel.")
SERVER_IMAGE_PIXELS = _setting("OLLAPY_SERVER_IMAGE_PIXELS", "256000000",
                                "Decoded pixels all requests of a process may hold at once while their prompts are "
                                "built; a request that would pass it gets a 'busy' error (HTTP 503 with Retry-After).")
EXTRA_BUFTS = _setting(
    "OLLAPY_EXTRA_BUFTS",
    "auto",
    "CPU extra buffer types (weight repacking, AMX): auto (off: repacked weights multiply rows in groups of 4, so a "
    "row would depend on the batch), on, off.",
)
DRAFT_ROW_COST = _setting("OLLAPY_DRAFT_ROW_COST", "",
                          "Speculative decoding: what one more row costs in a decode step, as a fraction of a one-row "
                          "step (0 to 1), for the draft policy; empty = measured from the engine's own steps (and "
                          "remembered in step-costs/ beside the prompt cache for the next process).")
NUM_THREAD = _setting("OLLAPY_NUM_THREAD", "0",
                      "CPU threads for decoding. 0 = ollapy chooses from the process's own CPUs (its affinity mask, "
                      "capped by a cgroup CPU quota): every one up to 4, half of them above (about the physical "
                      "cores), and fewer for decode steps while other processes keep those CPUs busy; a number is "
                      "used as it is.")
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


RPC = _setting(
    "OLLAPY_RPC",
    "",
    "Default `rpc` option: RPC servers (host:port, comma-separated) whose devices take model layers; "
    "such models run in a child runner process.",
)
RUNNER = _setting(
    "OLLAPY_RUNNER",
    "auto",
    "Where models run: auto (in this process; models that use RPC servers in a child runner process), "
    "or process (every model in a child runner process, so a crash in llama.cpp ends only that model).",
)
RUNNER_TIMEOUT = _setting(
    "OLLAPY_RUNNER_TIMEOUT",
    "120",
    "Seconds a request waits for a runner child to answer a call (prompt building, accepting a generation, "
    "embeddings) before it fails with a 502; a stopped runner never stalls other models.",
)
MAX_MEMORY = _setting(
    "OLLAPY_MAX_MEMORY",
    "",
    "Memory the server's loaded models may take (weights + KV cache, e.g. 16GiB); loading past it unloads idle "
    "models, least recently used first (default: the memory available when the model loads).",
)


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
CACHE_REMOTE = _setting(
    "OLLAPY_CACHE_REMOTE",
    "",
    "A Valkey/Redis server as the prompt cache's remote tier, shared by replicas: redis://[user:password@]host:port[/db], "
    "rediss:// (TLS), valkey://, valkeys:// or unix:///path (needs `pip install 'ollapy[remote]'`; empty = none). "
    "See docs/scaling.md.",
)
CACHE_REMOTE_PASSWORD_FILE = _setting(
    "OLLAPY_CACHE_REMOTE_PASSWORD_FILE",
    "",
    "A file whose first line is the remote tier's password (overrides one in OLLAPY_CACHE_REMOTE; never logged).",
)
CACHE_NAMESPACE = _setting(
    "OLLAPY_CACHE_NAMESPACE",
    "default",
    "The remote tier's key prefix: deployments sharing one Valkey/Redis server with different namespaces never "
    "share entries.",
)
CACHE_TENANT = _setting(
    "OLLAPY_CACHE_TENANT",
    "",
    "A server-side tenant id in the prompt cache's salt, so tenants never share cached prefixes (default: derived "
    "from OLLAPY_API_KEY when one is set; clients never choose it).",
)
KV_CACHE_TYPE = _setting(
    "OLLAPY_KV_CACHE_TYPE",
    "f16",
    "Default KV cache type: f16, q8_0 or q4_0 (quantized types turn flash attention on).",
)


# ---- server (ollapy/server, ollapy/server/scheduler.py) ------------------------------------------------
ORIGINS = _setting(
    "OLLAPY_ORIGINS",
    "",
    "Extra CORS origins a server allows, comma separated (`*` wildcards); local origins are always allowed.",
)
ALLOWED_HOSTS = _setting(
    "OLLAPY_ALLOWED_HOSTS",
    "",
    "Extra names a loopback-bound server answers in the Host header, comma separated (`*.example.com` wildcards, "
    "`*` = any); loopback names, private addresses and the served address are always allowed (DNS rebinding guard).",
)
NO_WEBUI = _setting("OLLAPY_NO_WEBUI", "0", "1 turns off the chat page that `ollapy serve` shows a browser at `/` "
                    "(as `serve --no-webui`); every client then gets `Ollama is running (ollapy)`.")
MAX_BODY = _setting("OLLAPY_MAX_BODY", "32MiB", "Largest request body a server accepts (blob uploads excepted).")
RESPONSES_STORE = _setting(
    "OLLAPY_RESPONSES_STORE",
    "64MiB",
    "Memory for /v1/responses stored with `store: true` (for previous_response_id); least recently used out first.",
)
API_KEY = _setting(
    "OLLAPY_API_KEY",
    "",
    "API key: a server set with it answers 401 to any request but `GET /` without `Authorization: Bearer KEY` "
    "or `x-api-key: KEY`; the CLI and `ollapy launch` (to the agent) send it (default: none, no authentication).",
)


# ---- scripts (read by scripts/*.sh at install and check time, never by ollapy itself) -------------------------
#: Variables the repository's scripts read; docs/settings.md lists them under the settings (scripts/gen_docs.py).
SCRIPT_SETTINGS: dict[str, Setting] = {}


def _script_setting(env: str, default: str, description: str) -> Setting:
    s = Setting(env, default, description)
    SCRIPT_SETTINGS[env] = s
    return s


LLAMA_VERSION = _script_setting("OLLAPY_LLAMA_VERSION", "0.3.36",
                                "scripts/install_llama.sh: the llama-cpp-python version it builds.")
CMAKE_ARGS = _script_setting("OLLAPY_CMAKE_ARGS", "",
                             "scripts/install_llama.sh: extra CMake flags for the llama.cpp build, e.g. "
                             "`-DGGML_CUDA=on`, `-DGGML_METAL=on`, `-DGGML_VULKAN=on` (llama.cpp's RPC backend is "
                             "always on); the wheel is cached per set of flags.")
VULKAN_SDK = _script_setting("OLLAPY_VULKAN_SDK", "",
                             "scripts/install_vulkan_deps.sh: where it unpacks the Vulkan headers (default: the "
                             "user cache dir + /ollapy/vulkan-sdk).")
CLIENTS_DIR = _script_setting("OLLAPY_CLIENTS_DIR", "",
                              "scripts/check_clients.sh: scratch folder of the clients it installs (default "
                              "~/.cache/ollapy/clients).")
AGENTS_DIR = _script_setting("OLLAPY_AGENTS_DIR", "",
                             "scripts/check_agents.sh: scratch folder of the coding agents it installs (default "
                             "~/.cache/ollapy/agents).")

#: Variables ollapy sets for its own child processes (a runner, a Vulkan probe); a user never sets them.
INTERNAL_VARIABLES = ("OLLAPY_RUNNER_SYS_PATH", "OLLAPY_VK_SOFTWARE_DEVICE")
