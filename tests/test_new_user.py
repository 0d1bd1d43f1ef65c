"""What a new user who knows Ollama met (issue 23, items 8 and 9): honest `/set parameter`, `run --local`, a
client's `--parallel` with a server, one-line `--verbose` facts through a server, the REPL's sub-help and
license, `serve --host` errors, the chat page's address at `serve`'s start, and the README's port."""
from __future__ import annotations

import os
import re
import sys

import httpx
import pexpect
from conftest import ROOT, live_server, run_cli

QUESTION = "What is the capital of France? Answer in one word."
LICENSE = "apache-2.0"


def _create_smol(smollm2_path, env: dict) -> None:
    """``smol`` in the store of ``env``: SmolLM2 with the catalogue's penalty and a LICENSE."""
    mf = f"FROM {smollm2_path}\nPARAMETER repeat_penalty 1\nLICENSE {LICENSE}\n"
    r = run_cli("create", "smol", "-f", "-", input=mf, env=env)
    assert r.returncode == 0, r.stderr


def _repl(model: str, env: dict, *args: str):
    full = dict(os.environ)
    full.pop("OLLAPY_DEBUG", None)
    full.update(env, OLLAPY_NOHISTORY="1")
    c = pexpect.spawn(sys.executable, ["-m", "ollapy.cli.main", "run", model, "-o", "temperature=0", *args], env=full,
                      encoding="utf-8", timeout=120, cwd=str(ROOT), dimensions=(40, 160))
    c.expect_exact(">>> ")
    return c


def _say(c, line: str, *expected: str) -> str:
    """Send ``line``; wait for each ``expected`` in order and the next prompt; return all printed text."""
    c.sendline(line)
    seen = ""
    for text in expected:
        c.expect_exact(text)
        seen += c.before + c.after
    c.expect_exact(">>> ")
    return (seen + c.before).replace("\r\n", "\n")


def _bye(c) -> None:
    c.sendline("/bye")
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0


def test_repl_sub_help_and_license_as_ollama_show(smollm2_path):
    env = {}
    _create_smol(smollm2_path, env)
    assert run_cli("show", "smol", "--license").stdout.decode().strip() == LICENSE
    c = _repl("smol", env)
    text = _say(c, "/? set", "/set parameter ...     Set a parameter", "/set nothink           Disable thinking")
    assert "/load <model>" not in text  # the sub-help, not the general help
    text = _say(c, "/help show", "/show license      Show model license", "/show template     Show prompt template")
    assert "/load <model>" not in text
    _say(c, "/? shortcuts", "Ctrl + a            Move to the beginning of the line (Home)", "Ctrl + d")
    _say(c, "/?", "/? shortcuts    Help for keyboard shortcuts")
    shown = _say(c, "/show license", LICENSE).split("\n")
    assert shown[1:3] == [LICENSE, ""]  # the echoed command, then exactly what `ollapy show --license` prints
    _say(c, "/set parameter", "Available Parameters:", "/set parameter num_ctx <int>")
    _bye(c)


def test_repl_set_parameter_load_time_options_reload_or_say_why(smollm2_path):
    c = _repl(str(smollm2_path), {}, "-o", "repeat_penalty=1")
    _say(c, "/set parameter num_ctx 512", "'num_ctx' takes effect when the model loads: reloading",
         "Set parameter 'num_ctx' to '512' (model reloaded)")
    _say(c, "/show info", "num_ctx              512")
    _say(c, "/set parameter num_thread 1", "Set parameter 'num_thread' to '1' (model reloaded)")
    _say(c, "/show info", "threads              1")
    _say(c, "/set parameter num_ctx 512", "Set parameter 'num_ctx' to '512'")  # in effect already: no reload
    # a load that fails says so, and the model runs on as it was (nothing was "Set")
    text = _say(c, "/set parameter rpc 127.0.0.1:9", "Error: ", "Parameter 'rpc' not set:")
    assert "Set parameter 'rpc'" not in text
    _say(c, "/show info", "num_ctx              512")
    _say(c, QUESTION, "Paris")
    shown = _say(c, "/show modelfile")
    assert "PARAMETER num_ctx 512" in shown and "rpc" not in shown
    _bye(c)


def test_through_a_server_local_rpc_parallel_verbose_and_set(smollm2_path, tmp_path):
    store = tmp_path / "models"
    with live_server(tmp_path) as url:
        env = {"OLLAPY_HOST": url.removeprefix("http://"), "OLLAPY_MODELS": str(store)}
        _create_smol(smollm2_path, env)

        def ps() -> list[dict]:
            return httpx.get(url + "/api/ps").json()["models"]

        # --local: answered in this process; the server never loads the model
        r = run_cli("run", "smol", "--local", "-o", "temperature=0", QUESTION, env=env)
        assert r.returncode == 0 and "Paris" in r.stdout.decode() and ps() == [], r.stderr
        # an option only the server's operator sets: this run says so and loads the model here
        r = run_cli("run", "smol", "-o", "rpc=127.0.0.1:9", QUESTION, env=env)
        lines = r.stderr.decode().splitlines()
        assert lines[0].startswith("-o rpc is set by a server's operator, not by its clients: loading smol in this "
                                   "process"), lines
        assert r.returncode == 1 and "127.0.0.1:9" in lines[-1] and "cannot be set by a request" not in r.stderr.decode()
        assert ps() == []

        # --verbose through the server: the template's source in one line, the prompt cache's source kept
        args = ("run", "smol", "--verbose", "-o", "temperature=0", QUESTION)
        first = run_cli(*args, env=env)
        second = run_cli(*args, env=env)
        assert first.returncode == 0 and "Paris" in second.stdout.decode()
        for r in (first, second):
            tail = r.stderr.decode().splitlines()
            assert tail[-1] == "chat template:        gguf tokenizer.chat_template", tail
        assert re.search(r"^prompt cache: +\d+ token\(s\) reused \(slot\)$", second.stderr.decode(), re.M), second.stderr

        # a client's --parallel uses the server's slots: no reload now, none for the next plain request
        (slots,) = [m["num_parallel"] for m in ps()]
        r = run_cli("run", "smol", "--each-line", "--parallel", "4", "-o", "temperature=0", "-o", "num_predict=4",
                    input="Say one.\nSay two.\nSay three.\n", env=env)
        assert r.returncode == 0 and len(r.stdout.decode().splitlines()) == 3, r.stderr
        assert r.stderr.decode().splitlines()[0] == (
            f"--parallel 4: the server at {url} serves smol with {slots} slot (its OLLAPY_NUM_PARALLEL); using those "
            "(--local loads it here instead)")
        assert [m["num_parallel"] for m in ps()] == [slots]
        plain = httpx.post(url + "/api/chat", json={"model": "smol", "stream": False, "options": {"num_predict": 2},
                                                    "messages": [{"role": "user", "content": "Hi"}]}, timeout=300)
        assert plain.json()["load_duration"] == 0  # the model was not loaded again

        # the REPL on a server: the server's slots are not the client's to set
        c = _repl("smol", env)
        text = _say(c, "/set parameter num_parallel 4", "'num_parallel' is the server's to set")
        assert "Set parameter" not in text
        _bye(c)
        assert [m["num_parallel"] for m in ps()] == [slots]


def test_serve_host_errors_name_the_flag():
    r = run_cli("serve", "--host", "127.0.0.1:99999", timeout=60)
    assert r.returncode == 2 and r.stderr.decode().splitlines() == [
        "Error: --host '127.0.0.1:99999' is not valid: expected [http[s]://]host[:port] with a port from 1 to 65535, "
        "e.g. 127.0.0.1:11435 (e.g. --host 127.0.0.1:11435 or --host 0.0.0.0:11435)"]
    r = run_cli("serve", "--host", "nonsense", timeout=60)
    assert r.returncode == 1 and r.stderr.decode().splitlines() == [
        "Error: cannot listen on nonsense:11435: --host names no address of this machine (give an IP address or a "
        "name that resolves to one, e.g. --host 127.0.0.1:11435)"]


def _serve_stderr(tmp_path, *args: str) -> str:
    """Start ``ollapy serve ARGS`` on a free loopback port, wait until it answers, stop it; its stderr."""
    import subprocess
    import time

    from rpc_helpers import free_port

    port = free_port()
    env = dict(os.environ, OLLAPY_HOST=f"127.0.0.1:{port}", OLLAPY_MODELS=str(tmp_path / "models"))
    env.pop("OLLAPY_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "serve", *args], env=env, cwd=str(ROOT),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, "ollapy serve did not answer"
                time.sleep(0.1)
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == 0, err
    return err.decode().replace(str(port), "PORT")


def test_serve_says_where_the_chat_page_is(tmp_path):
    lines = _serve_stderr(tmp_path).splitlines()
    at = lines.index("ollapy serve listening on http://127.0.0.1:PORT")
    assert lines[at + 1] == "chat page: http://127.0.0.1:PORT/ (open in a browser)", lines
    assert not [x for x in _serve_stderr(tmp_path, "--no-webui").splitlines() if "chat page" in x]
    from ollapy.cli.serve_cmd import chat_page_url

    assert chat_page_url("0.0.0.0", 11435) == "http://127.0.0.1:11435/"  # a wildcard bind: this machine's loopback
    assert chat_page_url("::", 11435) == "http://[::1]:11435/"
    assert chat_page_url("fe80::1", 8080) == "http://[fe80::1]:8080/"
    assert chat_page_url("192.168.1.5", 8080) == "http://192.168.1.5:8080/"


def test_readme_says_where_to_point_existing_clients():
    readme = (ROOT / "README.md").read_text()
    assert "OLLAMA_HOST=127.0.0.1:11435" in readme and 'base_url="http://127.0.0.1:11435/v1"' in readme
    assert "11434 is Ollama's own port" in readme
