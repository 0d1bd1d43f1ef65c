"""Ollama registry source: ``GET /v2/<ns>/<model>/manifests/<tag>`` then each layer's blob.

The registry for names without a host is ``OLLAPY_REGISTRY`` (default
``https://registry.ollama.ai``); a name with its own host uses ``https://host``
(``http://`` for loopback hosts or with ``insecure=True``). The manifest is
stored as the registry sent it (Ollama's format), after every blob is complete.
"""
from __future__ import annotations

import hashlib
import time
from typing import Any

from ollapy import config
from ollapy.errors import DownloadError, ModelNotFound
from ollapy.store import download
from ollapy.store.download import download_blob
from ollapy.store.layout import MT_MANIFEST, Store
from ollapy.store.names import DEFAULT_HOST, ModelName
from ollapy.store.progress import QuietProgress

_LOOPBACK = ("127.", "localhost", "[::1]", "::1")


class RegistryUnreachable(DownloadError):
    """The registry could not be asked for the manifest (network error or repeated 5xx)."""


def registry_base(name: ModelName, insecure: bool = False) -> str:
    """Base URL of the registry serving ``name`` (no trailing slash)."""
    if name.host == DEFAULT_HOST:
        return config.registry_url()
    scheme = "http" if insecure or name.host.startswith(_LOOPBACK) else "https"
    return f"{scheme}://{name.host}"


def fetch_manifest(client: Any, base: str, name: ModelName, tries: int = 3) -> dict[str, Any]:
    """GET the manifest JSON; raises ModelNotFound on 404 and DownloadError when unreachable or malformed."""
    import httpx

    ref = f"sha256:{name.digest}" if name.digest else name.tag
    url = f"{base}/v2/{name.namespace}/{name.model}/manifests/{ref}"
    last = ""
    for attempt in range(tries):
        try:
            r = client.get(url, headers={"Accept": MT_MANIFEST})
        except httpx.TransportError as exc:
            last = f"cannot reach {base} ({type(exc).__name__})"
        else:
            if r.status_code == 404:
                raise ModelNotFound(f"model {name.display()!r} not found in registry {base}",
                                    hint="check the name, or run `ollapy list` to see local models")
            if r.status_code < 400:
                if name.digest and hashlib.sha256(r.content).hexdigest() != name.digest:
                    raise DownloadError(f"registry {base} sent a manifest for {name.display()} whose sha256 is not "
                                        f"{name.digest[:12]}", hint="the registry changed or is wrong; check the @sha256 digest")
                try:
                    data = r.json()
                    if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
                        raise TypeError("no layers list")
                    return data
                except (ValueError, TypeError) as exc:
                    raise DownloadError(f"registry {base} sent a malformed manifest for {name.display()}: {exc}") from None
            if r.status_code < 500 and r.status_code not in (408, 429):
                raise DownloadError(f"registry {base} answered HTTP {r.status_code} for {name.display()}")
            last = f"HTTP {r.status_code} from {base}"
        if attempt + 1 < tries:
            time.sleep(min(download.BACKOFF_S * 2**attempt, 4.0))
    raise RegistryUnreachable(f"{last} while fetching the manifest of {name.display()}",
                              hint="check the network or OLLAPY_REGISTRY")


def pull_registry(store: Store, name: ModelName, progress: QuietProgress, insecure: bool = False) -> dict[str, Any]:
    """Pull ``name`` from its registry into ``store``: every blob, then the manifest. Returns the manifest."""
    import httpx

    base = registry_base(name, insecure)
    with httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0, connect=10.0)) as client:
        manifest = fetch_manifest(client, base, name)
        progress.stage(f"pulling manifest of {name.display()} from {base}")
        layers = list(manifest["layers"]) + ([manifest["config"]] if isinstance(manifest.get("config"), dict) else [])
        for layer in layers:
            digest = layer.get("digest", "")
            url = f"{base}/v2/{name.namespace}/{name.model}/blobs/{digest}"
            try:
                download_blob(store, url, digest, layer.get("size"), client=client, progress=progress,
                              label=digest[:19])
            except ValueError:
                raise DownloadError(f"registry manifest of {name.display()} has a bad digest {digest[:30]!r}") from None
    manifest.setdefault("ollapy", {})["source"] = f"registry {base}"
    progress.stage("writing manifest")
    store.write_manifest(name, manifest)
    return manifest
