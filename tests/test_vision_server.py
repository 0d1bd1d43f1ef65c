"""Images through ``ollapy serve`` with the official ollama client, on SmolLM2 plus a synthetic projector whose
manifest carries Ollama's projector layer (application/vnd.ollama.image.projector)."""
from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.test_vision_engine import _script, picture

SMOLLM2_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def install_vision_model(models: Path, gguf: Path, projector: Path, name: str = "vis") -> None:
    """Write a manifest for ``name`` with a model layer and a projector layer (blobs linked, not copied)."""
    blobs = models / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    layers = []
    for path, mt, sha in ((gguf, "application/vnd.ollama.image.model", SMOLLM2_SHA),
                          (projector, "application/vnd.ollama.image.projector",
                           hashlib.sha256(projector.read_bytes()).hexdigest())):
        blob = blobs / f"sha256-{sha}"
        if not blob.exists():
            os.symlink(path, blob)
        layers.append({"mediaType": mt, "digest": f"sha256:{sha}", "size": path.stat().st_size})
    man = models / "manifests" / "registry.ollama.ai" / "library" / name / "latest"
    man.parent.mkdir(parents=True, exist_ok=True)
    man.write_text(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                               "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                                          "digest": "sha256:" + "0" * 64, "size": 2},
                               "layers": layers}))


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    import ollama

    from tests.conftest import live_server

    base = tmp_path_factory.mktemp("vision-serve")
    proj = _script().write_projector(base / "mmproj.gguf", "gemma3", 0, 576)
    install_vision_model(base / "models", smollm2_path, proj)
    with live_server(base, env={"OLLAPY_NUM_PARALLEL": "2"}) as url:
        yield url, ollama.Client(host=url)


OPTS = {"temperature": 0, "num_predict": 8}


def test_show_reports_vision(server):
    _, oc = server
    shown = oc.show("vis")
    assert "vision" in shown.capabilities


def test_chat_and_generate_take_images(server):
    _, oc = server
    img = base64.b64encode(picture(1)).decode()
    a = oc.chat(model="vis", messages=[{"role": "user", "content": "Describe it.", "images": [img]}], options=OPTS)
    b = oc.chat(model="vis", messages=[{"role": "user", "content": "Describe it.", "images": [picture(1, "BMP")]}],
                options=OPTS)
    assert a.message.content == b.message.content and b.prompt_eval_count == a.prompt_eval_count
    g = oc.generate(model="vis", prompt="Describe it.", images=[picture(2)], options=OPTS)
    assert g.response and g.prompt_eval_count > 16


@pytest.mark.parametrize("images, words", [
    (["@@not base64@@"], "not valid base64"),
    ([base64.b64encode(b"").decode()], "empty"),
    ([base64.b64encode(b"garbage bytes").decode()], "not an image"),
])
def test_bad_images_are_400(server, images, words):
    import httpx

    url, _ = server
    r = httpx.post(url + "/api/chat", json={"model": "vis", "stream": False, "messages": [
        {"role": "user", "content": "x", "images": images}]}, timeout=120)
    assert r.status_code == 400 and words in r.json()["error"], r.text


def test_generate_context_of_an_image_prompt_round_trips(server):
    """The context /api/generate returns for an image prompt held the image's placeholder ids (negative), and
    sending it back was a 400 ("context holds -760761467, not a token id"). As Ollama's, it holds token ids only
    (the picture is never in a context) and is taken back."""
    _, oc = server
    g = oc.generate(model="vis", prompt="Describe it.", images=[picture(4)], options=OPTS)
    assert g.context and min(g.context) >= 0
    again = oc.generate(model="vis", prompt="And the colours?", context=g.context, options=OPTS)
    assert again.response and again.done_reason


def test_official_client_creates_a_vision_model_from_files(server, smollm2_path, tmp_path):
    """What ``ollama.Client.create`` sends for a vision model, ``files`` = the GGUF and its projector (issue 53,
    finding 10: a 400 "create from files needs exactly one .gguf file" before); the model then takes images."""
    _, oc = server
    proj = _script().write_projector(tmp_path / "mmproj-other.gguf", "gemma3", 5, 576)
    files = {"model.gguf": oc.create_blob(smollm2_path), "mmproj.gguf": oc.create_blob(proj)}
    assert oc.create(model="vis-files", files=files).status == "success"
    assert "vision" in oc.show("vis-files").capabilities
    r = oc.chat(model="vis-files", messages=[{"role": "user", "content": "Describe it.", "images": [picture(5)]}],
                options=OPTS)
    assert r.message.content and r.prompt_eval_count > 16


def test_remote_image_url_refused_on_v1(server):
    import openai

    url, _ = server
    oai = openai.OpenAI(base_url=url + "/v1", api_key="none")
    with pytest.raises(openai.BadRequestError, match="send the image inline"):
        oai.chat.completions.create(model="vis", messages=[{"role": "user", "content": [
            {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}])
    data = "data:image/png;base64," + base64.b64encode(picture(3)).decode()
    r = oai.chat.completions.create(model="vis", temperature=0, max_tokens=6, messages=[{"role": "user", "content": [
        {"type": "text", "text": "Describe it."}, {"type": "image_url", "image_url": {"url": data}}]}])
    assert r.usage.prompt_tokens > 16


def test_api_reports_image_encode_duration(server):
    import httpx

    url, _ = server
    img = base64.b64encode(picture(11)).decode()
    r = httpx.post(url + "/api/generate", json={"model": "vis", "prompt": "Describe it.", "images": [img],
                                                "stream": False, "options": OPTS}, timeout=300).json()
    assert r["image_encode_duration"] > 0 and r["prompt_eval_count"] > 16


def test_responses_input_image(server):
    import openai

    url, _ = server
    oai = openai.OpenAI(base_url=url + "/v1", api_key="none")
    data = "data:image/png;base64," + base64.b64encode(picture(12)).decode()
    r = oai.responses.create(model="vis", temperature=0, max_output_tokens=6, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Describe it."}, {"type": "input_image", "image_url": data}]}])
    assert r.usage.input_tokens > 16
    with pytest.raises(openai.BadRequestError, match="send the image inline"):
        oai.responses.create(model="vis", input=[{"role": "user", "content": [
            {"type": "input_text", "text": "x"}, {"type": "input_image", "image_url": "http://example.com/a.png"}]}])


def test_anthropic_image_block(server):
    import anthropic

    url, _ = server
    ac = anthropic.Anthropic(base_url=url, api_key="none")
    data = base64.b64encode(picture(13)).decode()
    msg = ac.messages.create(model="vis", max_tokens=6, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
        {"type": "text", "text": "Describe it."}]}])
    assert msg.usage.input_tokens > 16
    with pytest.raises(anthropic.BadRequestError, match="not valid base64"):
        ac.messages.create(model="vis", max_tokens=6, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "@@@"}},
            {"type": "text", "text": "x"}]}])


def test_model_without_projector_refuses_images(server, smollm2_path):
    import ollama

    _, oc = server
    blob = oc.create_blob(smollm2_path)
    oc.create(model="plain", files={"model.gguf": blob})
    with pytest.raises(ollama.ResponseError, match='does not support vision'):
        oc.chat(model="plain", messages=[{"role": "user", "content": "x", "images": [picture(1)]}])


def test_text_and_image_chats_mix_across_slots(server):
    from concurrent.futures import ThreadPoolExecutor

    _, oc = server
    img = [{"role": "user", "content": "Describe it.", "images": [picture(21)]}]
    txt = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    alone = [oc.chat(model="vis", messages=m, options=OPTS).message.content for m in (img, txt)]
    with ThreadPoolExecutor(4) as ex:
        together = list(ex.map(lambda m: oc.chat(model="vis", messages=m, options=OPTS).message.content,
                               [img, txt, img, txt]))
    assert together == alone * 2
