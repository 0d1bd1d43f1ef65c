"""Pulls from a loopback Ollama registry: success, resume after a kill, faults, disk full, concurrency, rm/list."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest_plugins = ["store_fixtures"]

from ollapy.errors import DiskFullError, DownloadError, ModelNotFound
from ollapy.store import download, list_models, pull_model, remove_model, resolve_model
from ollapy.store.layout import Store

ROOT = Path(__file__).resolve().parents[1]


def _publish(registry, smollm2_path, name=("library", "tiny", "q4")):
    m = registry.add_model(*name, smollm2_path, template="{{ .Prompt }}", params={"temperature": 0.2, "stop": ["<|im_end|>"]},
                           system="You are terse.", license="Apache-2.0")
    return m, m["layers"][0]["digest"].split(":")[1]


def test_pull_registry_and_resolve(store_env, registry, smollm2_path):
    _, hexd = _publish(registry, smollm2_path)
    ref = resolve_model("tiny:q4", quiet=True)
    assert ref.name == "tiny:q4" and ref.digest == hexd
    assert ref.path == store_env / "blobs" / f"sha256-{hexd}" and ref.path.stat().st_size == smollm2_path.stat().st_size
    assert ref.parameters == {"temperature": 0.2, "stop": ["<|im_end|>"]}
    from ollapy.chat.gotemplate import translate_go_template

    # the registry's Go template is used translated to Jinja (the engine renders Jinja only)
    assert (ref.template, ref.system, ref.license) == (translate_go_template("{{ .Prompt }}"), "You are terse.",
                                                       "Apache-2.0")
    assert "{{ .Prompt }}" not in ref.template
    assert (store_env / "manifests/registry.ollama.ai/library/tiny/q4").is_file()
    assert not list((store_env / "blobs").glob("*-partial"))
    assert registry.bytes_served[hexd] == smollm2_path.stat().st_size
    # already present: no second download
    resolve_model("tiny:q4", quiet=True)
    assert registry.bytes_served[hexd] == smollm2_path.stat().st_size
    # Store files get the mode a plain open() gives (Ollama's are world-readable), not mkstemp's 0600,
    # so a server running as another user can read a shared store.
    plain = store_env / "plain-file"
    plain.write_text("x")
    want = plain.stat().st_mode & 0o777
    made = [store_env / "manifests/registry.ollama.ai/library/tiny/q4", *(store_env / "blobs").glob("sha256-*")]
    assert len(made) == 7 and {p.name: p.stat().st_mode & 0o777 for p in made} == {p.name: want for p in made}


def _pull_proc(name, store_env, registry, *extra):
    env = dict(os.environ, OLLAPY_MODELS=str(store_env), OLLAPY_REGISTRY=registry.url, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "pull", name, *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_resume_after_kill_sends_nothing_twice(store_env, registry, smollm2_path):
    _, hexd = _publish(registry, smollm2_path)
    size = smollm2_path.stat().st_size
    registry.throttle = 0.03
    proc = _pull_proc("tiny:q4", store_env, registry, "--quiet")
    partial = store_env / "blobs" / f"sha256-{hexd}-partial"
    deadline = time.time() + 30
    while time.time() < deadline and (not partial.exists() or partial.stat().st_size < 20 << 20):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    held = partial.stat().st_size
    assert 0 < held < size
    registry.throttle = 0
    served_before = registry.bytes_served[hexd]
    pull_model("tiny:q4", quiet=True)
    assert registry.ranges[hexd][-1] == f"bytes={held}-"
    assert registry.bytes_served[hexd] - served_before == size - held  # nothing already held was sent again
    assert Store(store_env).has_blob(hexd, size) and not partial.exists()


@pytest.mark.parametrize("faults", [["500", "500"], ["truncate:5000000"], ["empty"], ["truncate:1000", "500", "norange"]])
def test_transient_faults_are_retried(store_env, registry, smollm2_path, faults, capsys):
    _, hexd = _publish(registry, smollm2_path)
    registry.faults[hexd] = list(faults)
    ref = resolve_model("tiny:q4", quiet=True)
    assert ref.digest == hexd and ref.path.stat().st_size == smollm2_path.stat().st_size


def test_blobs_asked_unencoded_and_gzip_answer_still_verified(store_env, registry, smollm2_path):
    """Ranges count bytes as sent, so blobs are requested with Accept-Encoding: identity; a server that
    gzips anyway is decoded before hashing, and the blob is the original bytes."""
    _, hexd = _publish(registry, smollm2_path)
    registry.faults[hexd] = ["gzip"]
    ref = resolve_model("tiny:q4", quiet=True)
    assert registry.accept_encodings[hexd] == ["identity"]
    assert registry.bytes_served[hexd] < smollm2_path.stat().st_size  # it really was compressed
    assert ref.path.read_bytes() == smollm2_path.read_bytes()


def test_retries_exhausted_is_clear_error(store_env, registry, smollm2_path, monkeypatch):
    monkeypatch.setenv("OLLAPY_PULL_RETRIES", "2")
    _, hexd = _publish(registry, smollm2_path)
    registry.faults[hexd] = ["500"] * 3
    with pytest.raises(DownloadError, match="gave up after 2 retries"):
        pull_model("tiny:q4", quiet=True)
    assert not (store_env / "manifests/registry.ollama.ai/library/tiny").exists()
    assert list_models() == []


def test_checksum_mismatch_deletes_partial(store_env, registry, smollm2_path):
    _, hexd = _publish(registry, smollm2_path)
    registry.faults[hexd] = ["corrupt"]
    with pytest.raises(DownloadError, match="sha256 mismatch.*partial file deleted"):
        pull_model("tiny:q4", quiet=True)
    assert not (store_env / "blobs" / f"sha256-{hexd}-partial").exists()
    assert not (store_env / "blobs" / f"sha256-{hexd}").exists()
    assert list_models() == []
    pull_model("tiny:q4", quiet=True)  # the next try works
    assert [m.name for m in list_models()] == ["tiny:q4"]


def test_blob_404_and_unknown_model(store_env, registry, smollm2_path):
    _, hexd = _publish(registry, smollm2_path)
    registry.faults[hexd] = ["404"]
    with pytest.raises(DownloadError, match="HTTP 404"):
        pull_model("tiny:q4", quiet=True)
    assert list_models() == []
    with pytest.raises(ModelNotFound) as ei:
        resolve_model("nosuch:thing", quiet=True)
    msg = str(ei.value)
    assert "\n" not in msg and str(store_env) in msg and registry.url in msg and "ollapy list" in msg and "smollm2:1.7b" in msg


def test_disk_full_keeps_partial_and_no_manifest(store_env, registry, smollm2_path, monkeypatch):
    _, hexd = _publish(registry, smollm2_path)
    written = {"n": 0}
    real = download._write_chunk

    def full(f, data):
        if written["n"] > 10 << 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        written["n"] += len(data)
        real(f, data)

    monkeypatch.setattr(download, "_write_chunk", full)
    with pytest.raises(DiskFullError) as ei:
        pull_model("tiny:q4", quiet=True)
    assert str(store_env / "blobs") in str(ei.value) and "\n" not in str(ei.value)
    partial = store_env / "blobs" / f"sha256-{hexd}-partial"
    held = partial.stat().st_size
    assert held > 10 << 20
    assert not (store_env / "manifests/registry.ollama.ai/library/tiny/q4").exists()
    monkeypatch.setattr(download, "_write_chunk", real)
    pull_model("tiny:q4", quiet=True)
    assert registry.ranges[hexd][-1] == f"bytes={held}-"


def test_concurrent_pulls_download_once(store_env, registry, smollm2_path):
    _, hexd = _publish(registry, smollm2_path)
    registry.throttle = 0.01
    procs = [_pull_proc("tiny:q4", store_env, registry) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert registry.bytes_served[hexd] == smollm2_path.stat().st_size
    for _out, err in outs:
        assert "\x1b[" not in err  # not a TTY: plain lines
    # the large model blob (throttled: seconds) is fetched by one process while the other says why it waits; the small
    # layers after it may be taken by either process, so only the model blob's wait is an event both runs agree on
    assert sum(f"sha256:{hexd[:12]}: another pull is fetching it; waiting" in err for _, err in outs) == 1, outs
    assert [m.name for m in list_models()] == ["tiny:q4"]


def test_corrupt_manifest_listed_as_broken_and_removable(store_env, registry, smollm2_path):
    _, hexd = _publish(registry, smollm2_path)
    registry.add_model("library", "other", "latest", smollm2_path)
    pull_model("tiny:q4", quiet=True)
    pull_model("other", quiet=True)
    mpath = store_env / "manifests/registry.ollama.ai/library/tiny/q4"
    mpath.write_text("{ not json")
    rows = {m.name: m for m in list_models()}
    assert rows["tiny:q4"].broken and "unreadable manifest" in rows["tiny:q4"].broken
    assert rows["other:latest"].broken is None
    with pytest.raises(Exception, match="broken"):
        resolve_model("tiny:q4", pull=False)
    remove_model("tiny:q4")
    assert not mpath.exists()
    # the GGUF blob is shared with other:latest, so it stays
    assert (store_env / "blobs" / f"sha256-{hexd}").is_file()
    # hand-edited: layer points at a missing blob
    opath = store_env / "manifests/registry.ollama.ai/library/other/latest"
    data = json.loads(opath.read_text())
    data["layers"][0]["digest"] = "sha256:" + "0" * 64
    opath.write_text(json.dumps(data))
    assert "missing blob" in list_models()[0].broken
    remove_model("other")
    assert list_models() == []


def test_rm_deletes_only_unshared_blobs(store_env, registry, smollm2_path):
    _, hexd = _publish(registry, smollm2_path)
    pull_model("tiny:q4", quiet=True)
    from ollapy.store import copy_model

    copy_model("tiny:q4", "mine/tiny:copy")
    remove_model("tiny:q4")
    assert (store_env / "blobs" / f"sha256-{hexd}").is_file()
    assert resolve_model("mine/tiny:copy", pull=False).digest == hexd
    remove_model("mine/tiny:copy")
    assert not (store_env / "blobs" / f"sha256-{hexd}").exists()
    assert [p.name for p in (store_env / "blobs").iterdir()] == []


def test_short_raw_writes_are_completed(tmp_path):
    """A raw write may take only part of a block (near ENOSPC, signals): the rest must still reach the file."""
    data = os.urandom(100_000)

    class ShortWriter:
        def __init__(self, f):
            self.f, self.calls = f, 0

        def write(self, b):
            self.calls += 1
            return self.f.write(bytes(b[:4096]))

    with open(tmp_path / "out", "wb", buffering=0) as f:
        w = ShortWriter(f)
        download._write_chunk(w, data)
    assert (tmp_path / "out").read_bytes() == data and w.calls == -(-len(data) // 4096)


def test_pull_by_manifest_digest_is_verified(store_env, registry, smollm2_path):
    """`model@sha256:<digest>` fetches that manifest and checks its bytes hash to the digest."""
    import hashlib

    m, hexd = _publish(registry, smollm2_path)
    want = hashlib.sha256(json.dumps(m).encode()).hexdigest()
    name = pull_model(f"tiny@sha256:{want}", quiet=True)
    assert (store_env / "blobs" / f"sha256-{hexd}").is_file() and resolve_model(name.display(), pull=False).digest == hexd
    registry.faults["manifest"] = ["altered"]  # same JSON value, other bytes: not the manifest that was asked for
    with pytest.raises(DownloadError, match=f"sha256 is not {want[:12]}"):
        pull_model(f"tiny@sha256:{want}", quiet=True)
    with pytest.raises(ModelNotFound):
        pull_model(f"tiny@sha256:{'0' * 64}", quiet=True)


def test_registry_template_that_cannot_be_translated_falls_back_to_the_gguf(store_env, registry, smollm2_path):
    """A library template using tool syntax ollapy cannot translate: the GGUF's own chat template applies."""
    registry.add_model("library", "tools", "latest", smollm2_path,
                       template="{{ if .Tools }}{{ .Tools }}{{ end }}{{ .Prompt }}")
    ref = resolve_model("tools", quiet=True)
    assert ref.template is None
