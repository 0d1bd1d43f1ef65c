"""The server's API key (OLLAPY_API_KEY, serve --api-key / --api-key-file) through the official clients and the CLI,
and /api/show without server paths."""
from __future__ import annotations

import httpx
import ollama
import openai
import pytest
from conftest import live_server, run_cli

KEY = "k3y-0f-the-server"
QUESTION = "What is the capital of France? Answer in one word."
GREEDY = {"temperature": 0, "num_predict": 8}


def test_api_key_401_and_200_through_the_official_clients_and_the_cli(smollm2_path, tmp_path):
    with live_server(tmp_path, env={"OLLAPY_API_KEY": KEY}) as url:
        assert httpx.get(url).status_code == 200 and httpx.head(url).status_code == 200  # the heartbeat stays open

        # Ollama's client: without the key a ResponseError 401 in Ollama's {"error"} shape; with it, the real thing
        with pytest.raises(ollama.ResponseError) as no_key:
            ollama.Client(host=url).list()
        assert no_key.value.status_code == 401 and no_key.value.error.startswith("missing or invalid API key")
        with pytest.raises(ollama.ResponseError) as wrong:
            ollama.Client(host=url, headers={"Authorization": "Bearer not-" + KEY}).list()
        assert wrong.value.status_code == 401
        oc = ollama.Client(host=url, headers={"Authorization": f"Bearer {KEY}"})
        # SmolLM2's catalogue parameters (repeat_penalty 1: see test_quickstart_answer.py)
        oc.create(model="smol", files={"model.gguf": oc.create_blob(smollm2_path)}, parameters={"repeat_penalty": 1.0})
        answer = oc.chat(model="smol", messages=[{"role": "user", "content": QUESTION}], options=GREEDY)
        assert "Paris" in answer.message.content
        by_header = ollama.Client(host=url, headers={"x-api-key": KEY})  # Anthropic's header works as well
        assert [m.model for m in by_header.list().models] == ["smol:latest"]

        # /api/show names the model, never the blob's path on the server
        modelfile = oc.show("smol").modelfile
        assert modelfile.splitlines()[0] == "FROM smol:latest" and str(tmp_path) not in modelfile

        # OpenAI's SDK: a wrong api_key is its AuthenticationError with OpenAI's error object; the right one answers
        with pytest.raises(openai.AuthenticationError) as bad:
            openai.OpenAI(base_url=url + "/v1", api_key="wrong").models.list()
        assert bad.value.status_code == 401 and bad.value.body["code"] == "invalid_api_key"
        assert bad.value.body["type"] == "invalid_request_error"
        oai = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
        assert [m.id for m in oai.models.list().data] == ["smol:latest"]
        done = oai.chat.completions.create(model="smol", messages=[{"role": "user", "content": QUESTION}],
                                           temperature=0, max_tokens=8)
        assert "Paris" in done.choices[0].message.content

        # Anthropic's route answers in Anthropic's error shape (the key is checked before the route exists)
        r = httpx.post(url + "/v1/messages", json={"model": "smol", "max_tokens": 8, "messages": []})
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"
        # every other route, unknown ones included, is closed too
        for method, path in (("GET", "/api/version"), ("GET", "/api/tags"), ("GET", "/api/ps"), ("GET", "/metrics"),
                             ("POST", "/api/generate"), ("GET", "/no/such/route"), ("POST", "/")):
            assert httpx.request(method, url + path).status_code == 401, path

        # the CLI sends OLLAPY_API_KEY; without it, one line and exit 1
        host = {"OLLAPY_HOST": url.removeprefix("http://")}
        r = run_cli("run", "smol", "-o", "temperature=0", "-o", "num_predict=8", QUESTION,
                    env={**host, "OLLAPY_API_KEY": KEY})
        assert r.returncode == 0 and "Paris" in r.stdout.decode(), r.stderr
        r = run_cli("run", "smol", QUESTION, env=host)
        assert r.returncode == 1 and r.stdout == b""
        assert r.stderr.decode().splitlines() == [
            "Error: the server requires an API key (set OLLAPY_API_KEY to the key the server was started with)"]
        r = run_cli("ps", env={**host, "OLLAPY_API_KEY": KEY})
        assert r.returncode == 0 and "smol:latest" in r.stdout.decode()


def test_serve_reads_the_key_from_a_file_and_refuses_two_sources(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    with live_server(tmp_path, "--api-key-file", str(key_file)) as url:
        assert httpx.get(url + "/api/version").status_code == 401
        r = httpx.get(url + "/api/version", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and r.json()["version"]
    r = run_cli("serve", "--api-key", KEY, "--api-key-file", str(key_file), timeout=60)
    assert r.returncode == 2 and r.stderr.decode().startswith("Error: --api-key and --api-key-file are exclusive")
    (tmp_path / "empty").write_text("\n")
    r = run_cli("serve", "--api-key-file", str(tmp_path / "empty"), timeout=60)
    assert r.returncode == 2 and "is empty" in r.stderr.decode()
    r = run_cli("serve", env={"OLLAPY_API_KEY": "two words"}, timeout=60)
    assert r.returncode == 2 and "OLLAPY_API_KEY" in r.stderr.decode() and "two words" not in r.stderr.decode()


def test_presented_keys_and_constant_time_match():
    from ollapy.server.auth import key_matches, presented_keys

    headers = [(b"authorization", b"Bearer abc"), (b"x-api-key", b"def"), (b"authorization", b"Basic xyz")]
    assert presented_keys(headers) == [b"abc", b"def"]
    assert key_matches(b"def", presented_keys(headers)) and not key_matches(b"xyz", presented_keys(headers))
    assert not key_matches(b"abc", []) and presented_keys([(b"authorization", b"Bearer ")]) == []
