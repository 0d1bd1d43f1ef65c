"""An httpx client of ollapy's (Ollama-compatible) HTTP API, used by the CLI when a server is running.

``heartbeat()`` answers within a short timeout so ``ollapy run`` falls back to
in-process quickly when nothing listens at ``OLLAPY_HOST``. Streaming calls
return iterators of the decoded NDJSON objects; closing the iterator (or
:meth:`Stream.cancel`) closes the connection, which makes the server cancel
the request and free its slot.
"""
from __future__ import annotations

import json
from typing import Any, Iterator

import httpx

from ollapy import config
from ollapy.errors import BusyError, ModelNotFound, OllapyError, UsageError
from ollapy.surrogates import scrub_strings


class ServerNotRunning(OllapyError):
    """No ollapy server answers at OLLAPY_HOST."""


def _error_for(status: int, message: str) -> OllapyError:
    if status == 401:
        exc = OllapyError("the server refused the API key" if config.api_key() else
                          "the server requires an API key",
                          hint="set OLLAPY_API_KEY to the key the server was started with")
        exc.status = 401
        return exc
    if status == 404:
        return ModelNotFound(message)
    if status in (400, 413, 422):
        return UsageError(message)
    if status == 503:
        return BusyError(message)
    exc = OllapyError(message)
    exc.status = status
    return exc


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        resp.read()
        body = resp.json()
        msg = body.get("error") if isinstance(body, dict) else None
        if isinstance(msg, dict):
            msg = msg.get("message")
    except Exception:  # noqa: BLE001
        msg = None
    raise _error_for(resp.status_code, msg or f"server answered HTTP {resp.status_code}")


class Stream:
    """An NDJSON response being read: iterate for dicts; ``cancel()`` closes the connection."""

    def __init__(self, cm, resp: httpx.Response) -> None:
        self._cm = cm
        self.resp = resp
        self._closed = False

    def __iter__(self) -> Iterator[dict]:
        try:
            for line in self.resp.iter_lines():
                if not line.strip():
                    continue
                obj = json.loads(line)
                if "error" in obj:
                    raise OllapyError(obj["error"] if isinstance(obj["error"], str) else json.dumps(obj["error"]))
                yield obj
        except httpx.HTTPError as exc:
            if self._closed:
                return
            raise OllapyError(f"connection to the server failed: {exc}") from None
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Close the connection (the server cancels the request)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._cm.__exit__(None, None, None)
        except Exception:  # noqa: BLE001
            pass


class Client:
    """A client of ``ollapy serve`` (or Ollama) at ``host`` (default ``OLLAPY_HOST``); with an ``api_key``
    (default ``OLLAPY_API_KEY``) every request carries ``Authorization: Bearer KEY``."""

    def __init__(self, host: str | None = None, timeout: float | None = None, api_key: str | None = None) -> None:
        self.host = (host or config.host()).rstrip("/")
        if "://" not in self.host:
            self.host = "http://" + self.host
        key = config.api_key() if api_key is None else api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=self.host, timeout=httpx.Timeout(timeout, connect=5.0), trust_env=False,
                                 headers=headers)

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    # ---- simple calls ---------------------------------------------------------------------------
    def heartbeat(self, timeout: float = 0.5) -> bool:
        """True when a server answers ``GET /`` within ``timeout`` seconds."""
        try:
            r = self.http.get("/", timeout=timeout)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    def _call(self, method: str, path: str, **kw) -> httpx.Response:
        if "json" in kw:  # text from argv or a file may hold lone surrogates, which JSON as UTF-8 cannot carry
            kw["json"] = scrub_strings(kw["json"])
        try:
            r = self.http.request(method, path, **kw)
        except httpx.ConnectError:
            raise ServerNotRunning(f"no ollapy server is running at {self.host}",
                                   hint="start one with `ollapy serve`, or set OLLAPY_HOST") from None
        except httpx.HTTPError as exc:
            raise OllapyError(f"request to {self.host} failed: {exc}") from None
        _raise_for(r)
        return r

    def version(self) -> str:
        """The server's ollapy version (``/api/version``'s ``ollapy_version``; its ``version`` is the Ollama API
        level it speaks, or an older ollapy's own version)."""
        data = self._call("GET", "/api/version").json()
        return data.get("ollapy_version") or data.get("version", "")

    def ps(self) -> list[dict]:
        """Loaded models (``/api/ps``)."""
        return self._call("GET", "/api/ps").json().get("models", [])

    def show(self, model: str) -> dict:
        """Model facts (``/api/show``)."""
        return self._call("POST", "/api/show", json={"model": model}).json()

    def load(self, model: str, options: dict | None = None, keep_alive: Any = None) -> dict:
        """Load a model without generating (empty prompt)."""
        body: dict[str, Any] = {"model": model}
        if options:
            body["options"] = options
        if keep_alive is not None:
            body["keep_alive"] = keep_alive
        return self._call("POST", "/api/generate", json=body).json()

    def pull(self, model: str, *, insecure: bool = False) -> Stream:
        """``/api/pull``: a :class:`Stream` of status dicts (``status``; a blob's also carry ``digest``, ``total``
        and ``completed`` bytes); the server's last one is ``{"status": "success"}``."""
        body: dict[str, Any] = {"model": model, "stream": True}
        if insecure:
            body["insecure"] = True
        return self._stream("/api/pull", body)

    def stop(self, model: str) -> dict:
        """Unload a model (``keep_alive: 0`` with no prompt)."""
        return self._call("POST", "/api/generate", json={"model": model, "keep_alive": 0}).json()

    def embed(self, model: str, inputs: list[str], *, truncate: bool = True, dimensions: int | None = None,
              options: dict | None = None, keep_alive: Any = None) -> dict:
        """``/api/embed``: the response dict (``embeddings``: one L2-normalised list of floats per input)."""
        body: dict[str, Any] = {"model": model, "input": inputs, "truncate": truncate}
        if dimensions is not None:
            body["dimensions"] = dimensions
        if options:
            body["options"] = {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}
        if keep_alive is not None:
            body["keep_alive"] = keep_alive
        return self._call("POST", "/api/embed", json=body).json()

    # ---- generation -----------------------------------------------------------------------------
    def _stream(self, path: str, body: dict) -> Stream:
        cm = self.http.stream("POST", path, json=scrub_strings(body))
        try:
            resp = cm.__enter__()
        except httpx.ConnectError:
            raise ServerNotRunning(f"no ollapy server is running at {self.host}",
                                   hint="start one with `ollapy serve`") from None
        try:
            _raise_for(resp)
        except BaseException:
            cm.__exit__(None, None, None)
            raise
        return Stream(cm, resp)

    def chat(self, model: str, messages: list[dict], *, options: dict | None = None, format: Any = None,
             keep_alive: Any = None, stream: bool = True, cache: bool = True, think: bool | str | None = None):
        """``/api/chat``: a :class:`Stream` of dicts when streaming, else the one response dict.

        ``think`` (true/false or "high"/"medium"/"low"; None: not sent, the model's default) asks for the
        reasoning in ``message.thinking``."""
        body = _body(model, options, format, keep_alive, stream, cache)
        body["messages"] = messages
        if think is not None:
            body["think"] = think
        if stream:
            return self._stream("/api/chat", body)
        return self._call("POST", "/api/chat", json=body).json()

    def generate(self, model: str, prompt: str, *, system: str | None = None, raw: bool = False,
                 options: dict | None = None, format: Any = None, keep_alive: Any = None, stream: bool = True):
        """``/api/generate``: a :class:`Stream` of dicts when streaming, else the one response dict."""
        body = _body(model, options, format, keep_alive, stream, True)
        body["prompt"] = prompt
        if system is not None:
            body["system"] = system
        if raw:
            body["raw"] = True
        if stream:
            return self._stream("/api/generate", body)
        return self._call("POST", "/api/generate", json=body).json()


def _body(model, options, format, keep_alive, stream, cache) -> dict:
    body: dict[str, Any] = {"model": model, "stream": stream}
    if options:
        body["options"] = {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}
    if format is not None:
        body["format"] = format
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    if not cache:
        body["cache"] = False
    return body
