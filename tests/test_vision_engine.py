"""Vision prompts through the engine on SmolLM2-135M with a synthetic projector (scripts/make_test_vlm.py).

The projector's weights are random: these tests check the pipeline (image tokens, encoding, decoding into a
slot's sequence, the prefix identity, limits and errors), never the answer's quality.
"""
from __future__ import annotations

import base64
import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ollapy.engine import media
from ollapy.errors import ContextError, ImageError
from ollapy.options import Options

ROOT = Path(__file__).resolve().parents[1]
IMAGE_TOKENS = 16  # the synthetic gemma3-type projector: 32x32 pixels, 4x4 patches, 2x2 pooling


def _script():
    spec = importlib.util.spec_from_file_location("make_test_vlm", ROOT / "scripts" / "make_test_vlm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def projector(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vlm") / "mmproj-test.gguf"
    return _script().write_projector(out, "gemma3", 0, 576)


def picture(seed: int, fmt: str = "PNG", size=(50, 40)) -> bytes:
    rng = np.random.default_rng(seed)
    im = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    im.save(buf, fmt)
    return buf.getvalue()


OPTS = Options(num_ctx=512, num_parallel=2, temperature=0, num_predict=8)


@pytest.fixture(scope="module")
def vlm(smollm2_path, projector):
    from ollapy.engine.model import LoadedModel

    with LoadedModel(smollm2_path, OPTS, projector_path=projector, name="smol-vision") as m:
        yield m


def ask(m, images, text="Describe the picture.", **kw):
    return m.chat([{"role": "user", "content": text, "images": images}], OPTS, **kw).result()


def test_projector_script_is_deterministic(tmp_path):
    mod = _script()
    a = mod.write_projector(tmp_path / "a.gguf", "gemma3", 3, 576).read_bytes()
    b = mod.write_projector(tmp_path / "b.gguf", "gemma3", 3, 576).read_bytes()
    c = mod.write_projector(tmp_path / "c.gguf", "gemma3", 4, 576).read_bytes()
    assert a == b and a != c


def test_image_tokens_counted_and_images_differ(vlm):
    text_only = vlm.chat_prompt([{"role": "user", "content": "\nDescribe the picture."}])
    p = vlm.chat_prompt([{"role": "user", "content": "Describe the picture.", "images": [picture(1)]}])
    assert len(p.media) == 1 and p.media[0].n_tokens == IMAGE_TOKENS
    assert all(t < 0 for t in p.tokens[p.media[0].start:p.media[0].end])
    t1, c1 = ask(vlm, [picture(1)], cache=False)
    assert c1.metrics.prompt_eval_count == len(p.tokens) > len(text_only.tokens) + IMAGE_TOKENS - 4
    assert c1.metrics.image_encode_duration > 0
    t2, _ = ask(vlm, [picture(2)], cache=False)
    assert t1 != t2  # another picture, another answer


def test_same_pixels_same_identity_any_encoding(vlm):
    a = vlm.chat_prompt([{"role": "user", "content": "x", "images": [picture(7, "PNG")]}])
    b = vlm.chat_prompt([{"role": "user", "content": "x", "images": [picture(7, "BMP")]}])
    c = vlm.chat_prompt([{"role": "user", "content": "x", "images": [picture(8, "PNG")]}])
    assert a.tokens == b.tokens  # PNG and BMP of equal pixels: the same prefix identity
    assert a.tokens[:a.media[0].start] == c.tokens[:c.media[0].start]
    assert a.tokens[a.media[0].start] != c.tokens[c.media[0].start]  # another image differs from its first position


def test_resent_image_reuses_its_prefix_and_equals_cold(vlm):
    cold, _ = ask(vlm, [picture(3)], cache=False)
    first, _ = ask(vlm, [picture(3, "BMP")])
    again, c = ask(vlm, [picture(3)])
    assert c.metrics.prompt_cache_tokens > vlm.chat_prompt(
        [{"role": "user", "content": "Describe the picture.", "images": [picture(3)]}]).media[0].end - 1
    assert cold == first == again


def test_text_and_image_prompts_mix_across_slots(vlm):
    alone_img, _ = ask(vlm, [picture(4)], cache=False)
    alone_txt, _ = vlm.chat([{"role": "user", "content": "What is the capital of France? Answer in one word."}],
                            OPTS, cache=False).result()
    r1 = vlm.chat([{"role": "user", "content": "Describe the picture.", "images": [picture(4)]}], OPTS, cache=False)
    r2 = vlm.chat([{"role": "user", "content": "What is the capital of France? Answer in one word."}], OPTS, cache=False)
    assert r1.result()[0] == alone_img and r2.result()[0] == alone_txt


def test_num_ctx_too_small_for_images(smollm2_path, projector):
    from ollapy.engine.model import LoadedModel

    small = Options(num_ctx=64, num_parallel=1, temperature=0, num_predict=4)
    with LoadedModel(smollm2_path, small, projector_path=projector) as m:
        imgs = [picture(i) for i in range(4)]
        with pytest.raises(ContextError, match=r"image embeddings\) but the context holds 64"):
            m.chat([{"role": "user", "content": "hi", "images": imgs}], small)


@pytest.mark.parametrize("raw, words", [
    (b"", "empty"),
    (b"not an image at all", "not an image"),
    (picture(5)[:60], "could not be decoded"),
])
def test_bad_images_are_refused(vlm, raw, words):
    with pytest.raises(ImageError, match=words):
        vlm.chat_prompt([{"role": "user", "content": "x", "images": [raw]}])


def test_bad_base64_and_limits():
    with pytest.raises(ImageError, match="not valid base64"):
        media.decode_base64_image("@@@not base64@@@")
    assert media.decode_base64_image("data:image/png;base64," + base64.b64encode(b"abc").decode()) == b"abc"
    with pytest.raises(ImageError, match=f"over the limit of {media.MAX_IMAGES}"):
        media.check_count(media.MAX_IMAGES + 1)
    with pytest.raises(ImageError, match="pixels, over the limit"):
        old = media.MAX_PIXELS
        media.MAX_PIXELS = 100
        try:
            media.decode_image(picture(1))
        finally:
            media.MAX_PIXELS = old


def test_webp_decodes_like_png():
    rgb = Image.fromarray(np.full((20, 30, 3), 120, np.uint8))
    webp, png = io.BytesIO(), io.BytesIO()
    rgb.save(webp, "WEBP", lossless=True)
    rgb.save(png, "PNG")
    assert media.decode_image(webp.getvalue()).digest == media.decode_image(png.getvalue()).digest


def test_model_without_projector_says_so(smollm2_path):
    from ollapy.engine.model import LoadedModel

    with LoadedModel(smollm2_path, Options(num_ctx=256, num_parallel=1), name="smollm2") as m:
        with pytest.raises(ImageError, match='"smollm2" does not support vision'):
            m.chat_prompt([{"role": "user", "content": "x", "images": [picture(1)]}])


def test_span_helpers_never_cut_an_image():
    sp = (media.MediaSpan(10, 16, "k"),)
    assert media.floor_outside(12, sp) == 10 and media.floor_outside(26, sp) == 26 and media.floor_outside(5, sp) == 5
    assert media.clip_chunk_end(0, 40, sp) == 10 and media.clip_chunk_end(26, 40, sp) == 40
    assert media.points_outside((4, 10, 20, 26, 30), sp) == (4, 10, 26, 30)


def test_gemma3_projector_non_causal_on_gemma(gemma_path, tmp_path):
    from ollapy.engine.model import LoadedModel

    proj = _script().write_projector(tmp_path / "mmproj-gemma.gguf", "gemma3", 0, 640)
    o = Options(num_ctx=512, num_parallel=1, temperature=0, num_predict=6)
    with LoadedModel(gemma_path, o, projector_path=proj) as m:
        p = m.chat_prompt([{"role": "user", "content": "Describe the picture.", "images": [picture(1)]}])
        assert p.media[0].non_causal and p.media[0].n_tokens == IMAGE_TOKENS
        ask1 = m.chat([{"role": "user", "content": "Describe the picture.", "images": [picture(1)]}], o, cache=False)
        ask2 = m.chat([{"role": "user", "content": "Describe the picture.", "images": [picture(2)]}], o, cache=False)
        ask3 = m.chat([{"role": "user", "content": "Describe the picture.", "images": [picture(1, "BMP")]}], o,
                      cache=False)
        a, b, c = ask1.result()[0], ask2.result()[0], ask3.result()[0]
        assert a == c and a != b


def test_context_shift_never_cuts_inside_an_image(smollm2_path, projector):
    from ollapy.engine.model import LoadedModel

    o = Options(num_ctx=128, num_parallel=1, temperature=0.8, seed=1, num_predict=150)
    with LoadedModel(smollm2_path, o, projector_path=projector) as m:
        msgs = [{"role": "user", "content": "Describe the picture at length.", "images": [picture(6)]}]
        span = m.chat_prompt(msgs).media[0]
        keep = span.start + 5  # a kept prefix that would end inside the image
        _, final = m.chat(msgs, Options(num_ctx=128, num_parallel=1, temperature=0.8, seed=1, num_predict=150,
                                        num_keep=keep)).result()
        assert final.metrics.shifts >= 1
        held = m.engine.slots[0].tokens  # after the shift only the kept prefix is exact: it holds all of the image
        assert sum(t < 0 for t in held) in (0, IMAGE_TOKENS) and len(held) >= span.end


def test_previous_turn_with_an_image_is_a_save_point(vlm):
    first = [{"role": "user", "content": "Describe the picture.", "images": [picture(9)]}]
    turn2 = first + [{"role": "assistant", "content": "A picture."}, {"role": "user", "content": "And the colours?"}]
    p1, p2 = vlm.chat_prompt(first), vlm.chat_prompt(turn2)
    assert p2.media[0] == p1.media[0]
    assert max(p2.save_points) > p2.media[0].end  # the end of the first turn, past its image


def test_a_chunk_dropped_while_it_is_encoded_is_freed_after_the_encode(vlm, monkeypatch):
    """Issue 53: the keeper of image chunks used to free a chunk (the same picture kept again by another request,
    or the least recently used one over KEPT_CHUNKS) while the loop thread encoded it: a use-after-free. Here both
    happen at the worst moment, inside the encode: the request still gets its answer, and nothing fails."""
    proj = vlm.media.projector
    real_encode = type(proj).encode
    others = [picture(100 + i, size=(8, 8)) for i in range(media.KEPT_CHUNKS + 2)]
    calls = []

    def encode_while_dropped(self, chunk):
        calls.append(chunk.n_tokens)
        # another request's prompt with the same picture, then enough pictures to push it out of the kept ones
        vlm.chat_prompt([{"role": "user", "content": "Describe the picture.", "images": [picture(21)]}])
        for i in range(0, len(others), media.MAX_IMAGES):
            vlm.chat_prompt([{"role": "user", "content": "x", "images": others[i:i + media.MAX_IMAGES]}])
        return real_encode(self, chunk)

    monkeypatch.setattr(type(proj), "encode", encode_while_dropped)
    text, c = ask(vlm, [picture(21)], cache=False)  # a picture no slot holds: encoded
    monkeypatch.undo()
    assert calls == [IMAGE_TOKENS] and c.metrics.image_encode_duration > 0 and text


def test_parallel_requests_with_the_same_picture(vlm):
    """Both slots take the same new picture at once (each builds its prompt, keeping the picture's chunk again,
    while the other may be encoding it): every request answers, all alike (greedy, same prompt)."""
    for k in range(3):
        rs = [vlm.chat([{"role": "user", "content": "Describe the picture.", "images": [picture(40 + k)]}], OPTS,
                       cache=False) for _ in range(4)]
        answers = [r.result()[0] for r in rs]
        assert len(set(answers)) == 1 and answers[0], answers


def test_an_image_dropped_before_its_encode_is_a_capacity_limit(vlm, monkeypatch):
    """More image chunks in flight than the server keeps is the server's limit, not the client's error: a 503
    (BusyError, retried by clients), never a 400."""
    from ollapy.errors import BusyError

    monkeypatch.setattr(media, "KEPT_CHUNKS", 1)
    with pytest.raises(BusyError, match="too many images in flight") as err:
        ask(vlm, [picture(23), picture(24)], cache=False)
    assert err.value.status == 503


def _solid_png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 30, 30)).save(buf, "PNG")  # compresses to a few tens of KB
    return buf.getvalue()


def _peak_rss() -> int:
    return int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) * 1024


def test_a_request_over_its_pixel_budget_is_refused_before_a_pixel_is_decoded(vlm):
    """Issue 53: each under the per-image limit, together 108 million pixels (324 MB of RGB) in 3 small PNGs: a 400
    naming OLLAPY_REQUEST_IMAGE_PIXELS, read from the headers, with no decoded image's worth of memory spent."""
    big = _solid_png(6000, 6000)
    assert len(big) < 1_000_000
    before = _peak_rss()
    with pytest.raises(ImageError, match="OLLAPY_REQUEST_IMAGE_PIXELS") as err:
        vlm.chat_prompt([{"role": "user", "content": "x", "images": [big, big, big]}])
    assert err.value.status == 400
    assert _peak_rss() - before < 50 * 1024 * 1024  # not one 108 MB RGB copy was made
    assert media.SERVER_PIXELS.held == 0


def test_the_process_pixel_budget_is_a_503_and_is_given_back(vlm, monkeypatch):
    from ollapy.errors import BusyError

    budget = media.PixelBudget(capacity=3000)
    monkeypatch.setattr(media, "SERVER_PIXELS", budget)
    msg = [{"role": "user", "content": "x", "images": [picture(31)]}]  # 50 x 40 = 2,000 pixels
    with budget.reserve(2000):  # another request's images being decoded
        with pytest.raises(BusyError, match="OLLAPY_SERVER_IMAGE_PIXELS") as err:
            vlm.chat_prompt(msg)
        assert err.value.status == 503
    vlm.chat_prompt(msg)  # alone it fits; its pixels are given back once the prompt is built
    assert budget.held == 0
    with pytest.raises(ImageError):
        vlm.chat_prompt([{"role": "user", "content": "x", "images": [picture(31), b"not an image"]}])
    assert budget.held == 0  # given back when a later image fails too


EPS = (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n%%EndComments\n"
       b"newpath 0 0 moveto 8 8 lineto stroke showpage\n%%EOF\n")


@pytest.mark.parametrize("raw", [EPS, picture(32, "TIFF"), picture(33, "PPM")], ids=["eps", "tiff", "ppm"])
def test_only_the_promised_formats_are_opened(raw, monkeypatch):
    """PNG, JPEG, WebP, GIF and BMP (docs/vision.md); nothing else reaches a Pillow plugin: an EPS never starts
    Ghostscript."""
    from PIL import EpsImagePlugin

    def no_ghostscript(*a, **k):
        raise AssertionError("Pillow's EPS plugin ran")

    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", no_ghostscript)
    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", no_ghostscript)
    with pytest.raises(ImageError, match="not an image in a format ollapy reads"):
        media.decode_image(raw)
    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP"):
        assert media.decode_image(picture(34, fmt)).width == 50
