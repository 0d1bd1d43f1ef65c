"""``ollapy run`` through a running ``ollapy serve``: the same interface as the in-process runner.

:func:`probe_server` asks ``OLLAPY_HOST`` for a heartbeat (short timeout); when
a server answers it loads the model there (so unknown models and bad options
fail before anything is printed) and returns ``(RemoteRunner, ref)``. A model
the server does not have is pulled by the server first (its ``/api/pull``,
:func:`pull_on_server`) unless ``run --no-pull`` said not to, as the in-process
path pulls it into the local store. The server applies the model's
SYSTEM/MESSAGE lines itself, so the ref carries only the system prompt (for
the REPL's ``/show system``) and no messages.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import SimpleNamespace

from ollapy.options import Options


@dataclass
class RemoteRef:
    """What the CLI needs of a model served remotely."""

    name: str
    system: str | None = None
    messages: list = field(default_factory=list)
    template: str | None = None
    license: str | None = None
    capabilities: list = field(default_factory=list)


class RemoteChunk(SimpleNamespace):
    """A chunk like :class:`~ollapy.cli.embedded.SplitStream`'s: ``text`` (answer), ``thinking`` (reasoning),
    ``done``, ``done_reason``, ``metrics`` (dict on the last one)."""


_METRIC_KEYS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
                "eval_duration", "prompt_cache_tokens", "truncated", "draft", "draft_tokens", "draft_accepted",
                "image_encode_duration")
_OPTIONAL_METRICS = frozenset({"draft", "draft_tokens", "draft_accepted", "image_encode_duration"})


class RemoteStream:
    """Iterates a server chat stream as chunks; ``cancel()`` drops the connection (the server frees the slot)."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def __iter__(self):
        for obj in self.stream:
            part = (obj.get("message") or {}) if "message" in obj else obj
            text = part.get("content", "") if "message" in obj else obj.get("response", "")
            thinking = part.get("thinking") or ""
            if obj.get("done"):
                # as the engine's Metrics.as_dict: the draft and image fields only when the server sent them
                metrics = {k: obj.get(k, 0) for k in _METRIC_KEYS if k in obj or k not in _OPTIONAL_METRICS}
                metrics["prefix_source"] = obj.get("prompt_cache_source") or "none"  # `--verbose` names it
                yield RemoteChunk(text=text or "", thinking=thinking, done=True, done_reason=obj.get("done_reason"),
                                  metrics=metrics)
                return
            yield RemoteChunk(text=text or "", thinking=thinking, done=False, done_reason=None, metrics=None)

    def cancel(self) -> None:
        self.stream.cancel()


def to_server_options(cli_options: dict) -> dict:
    """The options a request to a server carries: JSON values, without the ones the server decides
    (:data:`ollapy.options.SERVER_DECIDED_OPTIONS`: its slots serve every client, and asking for others would
    reload its model for everyone)."""
    from ollapy.options import SERVER_DECIDED_OPTIONS

    return {k: list(v) if isinstance(v, tuple) else v for k, v in cli_options.items()
            if k not in SERVER_DECIDED_OPTIONS}


class RemoteRunner:
    """Runs chats on a server. ``options`` are the merged options as the server reported them."""

    def __init__(self, client, name: str, cli_options: dict, keep_alive=None, capabilities=None) -> None:
        self.client = client
        self.name = name
        self.keep_alive = keep_alive
        self.capabilities = list(capabilities or ["completion"])  # from /api/show
        self._cli = dict(cli_options)
        self._ps = self._find_ps()
        self.options = Options().merged({k: v for k, v in cli_options.items()})

    def _find_ps(self) -> dict:
        try:
            names = {self.name, f"{self.name}:latest"}  # a name without a tag is :latest on the server
            for m in self.client.ps():
                if m.get("name") in names or m.get("model") in names:
                    return m
        except Exception:  # noqa: BLE001
            pass
        return {}

    @property
    def num_ctx(self) -> int:
        """Context length per slot of the model on the server."""
        return int(self._ps.get("context_length") or self.options.num_ctx)

    def chat(self, messages: list[dict], cli_options: dict, fmt=None, cache: bool = True, think=None):
        """Stream a chat from the server; returns an iterable of chunks with ``cancel()``.

        ``think`` (validated; None: the model's default) is checked against the server's capabilities
        first (:func:`ollapy.chat.reply.check_capabilities`, OptionError), then sent as ``/api/chat``'s ``think``.
        """
        from ollapy.chat.reply import check_capabilities

        check_capabilities(self.name, can_think="thinking" in self.capabilities, think=think)
        opts = to_server_options(cli_options)
        # request-time options changed with /set parameter live on self.options
        base = Options()
        for k in ("temperature", "top_k", "top_p", "min_p", "num_predict", "repeat_penalty", "seed", "stop",
                  "presence_penalty", "frequency_penalty", "num_keep", "typical_p", "repeat_last_n", "mirostat",
                  "mirostat_tau", "mirostat_eta", "dry_multiplier", "dry_base", "dry_allowed_length",
                  "dry_penalty_last_n", "dry_sequence_breakers", "top_n_sigma", "xtc_probability", "xtc_threshold"):
            v = getattr(self.options, k)
            if v != getattr(base, k) and k not in opts:
                opts[k] = list(v) if isinstance(v, tuple) else v
        stream = self.client.chat(self.name, messages, options=opts, format=fmt, keep_alive=self.keep_alive,
                                  stream=True, cache=cache, think=think)
        return RemoteStream(stream)

    def info(self) -> dict:
        """Model facts from the server (``/api/show`` + ``/api/ps``)."""
        out = {"name": self.name, "server": self.client.host}
        try:
            show = self.client.show(self.name)
            det = show.get("details") or {}
            # one line naming the template's source, as in process; the text itself for `/show template`
            out.update(architecture=det.get("family"), template=show.get("template_source") or "from the server",
                       template_text=show.get("template"),
                       context_length=next((v for k, v in (show.get("model_info") or {}).items()
                                            if k.endswith(".context_length")), None))
        except Exception:  # noqa: BLE001
            pass
        ps = self._find_ps() or self._ps
        if ps:
            out.update(num_ctx=ps.get("context_length"), num_parallel=ps.get("num_parallel"), size=ps.get("size"))
        return out

    def close(self) -> None:
        """Nothing to unload: the server's keep_alive decides."""
        self.client.close()


def port_open(timeout: float = 0.3) -> bool:
    """True when something accepts TCP connections at OLLAPY_HOST (a refused connect answers at once)."""
    import socket
    from urllib.parse import urlsplit

    from ollapy import config

    u = urlsplit(config.host())
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or 11435), timeout=timeout):
            return True
    except OSError:
        return False


_PULL_HINT = re.compile(r" \(try `ollapy pull [^`]*`\)$")


def pull_on_server(client, name: str, progress=None) -> None:
    """Have the server pull ``name`` into its store (``/api/pull``), its statuses on stderr as a pull in this
    process shows them: ``progress`` (default :func:`ollapy.store.progress.make_progress`: bars on a terminal,
    one plain line per stage otherwise) gets each blob as ``start``/``advance``/``finish`` and every other status
    as a ``stage`` line (each text once; the closing ``success`` not at all).

    Raises the server's error: a model no source has is ModelNotFound, without the server's "try `ollapy pull`"
    hint (that pull is what failed).
    """
    from ollapy.errors import ModelNotFound, OllapyError
    from ollapy.store.progress import make_progress

    own = progress is None
    progress = progress or make_progress()
    blobs: dict[str, list] = {}  # label -> [task, completed, finished]
    said: set[str] = {"", "success"}
    try:
        for s in client.pull(name):
            status = str(s.get("status") or "")
            if "completed" not in s and "total" not in s:
                if status not in said:
                    said.add(status)
                    progress.stage(status)
                continue
            label = s.get("digest") or status.removeprefix("pulling ")
            total, done = int(s.get("total") or 0), int(s.get("completed") or 0)
            blob = blobs.get(label)
            if blob is None:
                blob = blobs[label] = [progress.start(label, total or None, done), done, False]
            elif done > blob[1]:
                progress.advance(blob[0], done - blob[1])
                blob[1] = done
            if total and done >= total and not blob[2]:
                blob[2] = True
                progress.finish(blob[0])
        for task, _, finished in blobs.values():  # a blob of unknown size ends with the pull
            if not finished:
                progress.finish(task)
    except OllapyError as exc:
        words = _PULL_HINT.sub("", exc.message)
        if words != exc.message or isinstance(exc, ModelNotFound):
            raise ModelNotFound(words, exc.hint if isinstance(exc, ModelNotFound) else "", name=name) from None
        raise
    finally:
        if own:
            progress.close()


def missing_on(client, name: str) -> bool:
    """True when the server says it has no model ``name`` (``/api/show`` answers 404)."""
    from ollapy.errors import ModelNotFound

    try:
        client.show(name)
    except ModelNotFound:
        return True
    except Exception:  # noqa: BLE001 - another failure is not "missing": the load's own error is reported
        return False
    return False


def probe_server(name: str, cli_options: dict, settings, pull: bool = True):
    """``(RemoteRunner, RemoteRef)`` when a server answers at OLLAPY_HOST, else None.

    A model the server does not have is pulled through it first (:func:`pull_on_server`) when ``pull``;
    without ``pull`` its 404 is raised as it is. Raises the server's error (unknown model 404, bad options
    400...) as the matching OllapyError, like the in-process path would.
    """
    if not port_open():
        return None  # nothing listens: skip importing httpx at all (fast start of in-process runs)
    try:
        from ollapy.cli.client import Client
    except ImportError:
        return None
    client = Client()
    if not client.heartbeat():
        client.close()
        return None
    from ollapy.errors import ModelNotFound

    keep_alive = getattr(settings, "keepalive", None)
    opts = to_server_options(cli_options)
    try:
        client.load(name, opts, keep_alive)
    except ModelNotFound:
        if not pull or not missing_on(client, name):  # e.g. a missing draft model: pulling `name` would not help
            raise
        pull_on_server(client, name)
        client.load(name, opts, keep_alive)
    show = {}
    try:
        show = client.show(name)
    except Exception:  # noqa: BLE001 - a path model may not be showable
        show = {}
    caps = show.get("capabilities") or ["completion"]
    runner = RemoteRunner(client, name, cli_options, keep_alive, caps)
    parallel = getattr(settings, "parallel", None)
    slots = runner._ps.get("num_parallel")
    if parallel is not None and slots and parallel != slots:
        from ollapy.cli.output import info

        info(f"--parallel {parallel}: the server at {client.host} serves {name} with {slots} slot"
             f"{'s' if slots != 1 else ''} (its OLLAPY_NUM_PARALLEL); using those (--local loads it here instead)")
    ref = RemoteRef(name=name, system=show.get("system") or None, template=show.get("template") or None,
                    license=show.get("license") or None, capabilities=list(caps))
    return runner, ref
