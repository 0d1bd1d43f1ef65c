"""Prompt building for a loaded model: :class:`PromptBuilder`.

Renders chat messages with the model's chat template (tools, thinking switches, an assistant prefill),
tokenizes without duplicating BOS, puts images' placeholder ids in place (:mod:`ollapy.engine.media`), works
out ``num_keep`` (BOS + system prompt) and the prompt-cache save points (end of the system prompt, end of the
previous turn), shortens a chat that does not fit ``num_ctx`` message by message, and compiles Ollama's
``format`` into a GBNF grammar. :class:`~ollapy.engine.model.LoadedModel` (:mod:`ollapy.engine.model`), which
loads the model and submits to the engine, is the class this one is a base of.
"""
from __future__ import annotations

import collections
import json
import logging
import threading
from typing import TYPE_CHECKING

from ollapy.chat.templates import template_reads_suffix
from ollapy.engine.backend.templating import (
    json_schema_grammar,
    render_chat_template,
    template_mentions_tools,
)
from ollapy.engine.request import Prompt
from ollapy.errors import OptionError
from ollapy.options import Options
from ollapy.tokens import common_prefix

if TYPE_CHECKING:
    from ollapy.chat.fim import FimRequest
    from ollapy.chat.templates import Template
    from ollapy.engine.backend.context import Backend
    from ollapy.engine.interface import ContextFacts
    from ollapy.engine.media import MediaPrompter

log = logging.getLogger("ollapy.engine")
_MARK = "OLLAPYMARK7f3a"  # stands for a user message's content when locating the system prompt's end


class PromptBuilder:
    """The prompt building of :class:`~ollapy.engine.model.LoadedModel` (a base class: the attributes below are set
    by ``LoadedModel.__init__``). Runs on the caller's thread; the memo of prefix tokens is guarded by its lock."""

    name: str
    backend: Backend
    template: Template
    bos_text: str
    eos_text: str
    facts: ContextFacts
    media: MediaPrompter | None
    _prefix_tokens: collections.OrderedDict[str, tuple[int, ...]]
    _prefix_lock: threading.Lock

    def _message_images(self, messages: list[dict]) -> tuple[list[dict], list, object]:
        """``messages`` with a media marker per image in front of its message's content, the images decoded
        (:func:`ollapy.engine.media.decode_image`), in prompt order, and the reservation of their pixels in the
        process's budget (:data:`ollapy.engine.media.SERVER_PIXELS`), for the caller to release once the prompt is
        built. Every image's header is read, and the request's and the process's pixel budgets checked, before
        any image is decoded. Raises ImageError (400), BusyError (503: the process's budget)."""
        from ollapy.engine import media as mediamod
        from ollapy.errors import ImageError

        if not any(m.get("images") for m in messages):
            return messages, [], mediamod.NO_RESERVATION
        if self.media is None:
            raise ImageError(f'"{self.name}" does not support vision',
                             hint="send images to a vision model (a GGUF with its mmproj projector)")
        mediamod.check_count(sum(len(m.get("images") or ()) for m in messages))
        raws = []  # bytes, or Ollama's base64 strings (a CLI session's history)
        for m in messages:
            for raw in m.get("images") or ():
                what = f"image {len(raws) + 1}"
                raws.append((mediamod.decode_base64_image(raw, what) if isinstance(raw, str) else raw, what))
        pixels = mediamod.check_request_pixels([mediamod.image_size(raw, what) for raw, what in raws])
        held = mediamod.SERVER_PIXELS.reserve(pixels)
        try:
            images = [mediamod.decode_image(raw, what) for raw, what in raws]
        except BaseException:
            held.release()
            raise
        out = []
        for m in messages:
            imgs = m.get("images") or ()
            if not imgs:
                out.append(m)
                continue
            marks = "".join(self.media.marker for _ in imgs)
            out.append({**{k: v for k, v in m.items() if k != "images"}, "content": marks + "\n" + str(m.get("content") or "")})
        return out, images, held

    def _media_tokens(self, text: str, images: list) -> tuple[list[int], tuple]:
        """Tokens (placeholder ids for images) and image spans of ``text`` with its markers; never two BOS."""
        tokens, media = self.media.build(self._strip_bos_text(text), images)
        bos = self.backend.bos
        if len(tokens) >= 2 and tokens[0] == bos and tokens[1] == bos:
            from dataclasses import replace

            tokens.pop(0)
            media = tuple(replace(sp, start=sp.start - 1) for sp in media)
        return tokens, media

    def _strip_bos_text(self, text: str) -> str:
        """``text`` without a leading BOS text when the tokenizer adds BOS itself: llama.cpp's rule for a rendered
        chat template (``common/chat.cpp``, "to avoid double BOS"), so ``llama_tokenize`` neither adds a second
        BOS nor logs its double-BOS warning."""
        if self.backend.add_bos and self.bos_text and text.startswith(self.bos_text):
            return text[len(self.bos_text):]
        return text

    def tokenize(self, text: str) -> list[int]:
        """Tokenize text with the model's special-token rules; never two BOS tokens."""
        toks = self.backend.tokenize(self._strip_bos_text(text), add_special=True, parse_special=True)
        bos = self.backend.bos
        while len(toks) >= 2 and toks[0] == bos and toks[1] == bos:
            toks.pop(0)
        return toks

    def tokenize_text(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids of ``text`` exactly as ``llama_tokenize`` gives them (llama.cpp server's ``/tokenize``):
        ``add_special`` adds BOS/EOS as the model wants, ``parse_special`` reads special-token text as tokens."""
        return self.backend.tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_pieces(self, tokens: list[int]) -> list[bytes]:
        """Each token's bytes with special tokens rendered (llama.cpp's ``common_token_to_piece``): a piece may
        be part of a UTF-8 character. Raises OptionError for an id outside the vocabulary."""
        n_vocab = self.facts.n_vocab
        bad = next((t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab), None)
        if bad is not None:
            raise OptionError(f"token {bad!r} is not an id of this model's vocabulary (0 to {n_vocab - 1})",
                              hint="send token ids that /tokenize of the same model returned")
        return [self.backend.token_piece(t, special=True) for t in tokens]

    def _tokenize_prefix(self, text: str) -> list[int]:
        """:meth:`tokenize` for the system-prompt and earlier-turns prefixes that every turn of a chat (and every
        client sharing a system prompt) renders again: the last 64 texts are kept."""
        with self._prefix_lock:
            toks = self._prefix_tokens.get(text)
            if toks is not None:
                self._prefix_tokens.move_to_end(text)
                return list(toks)
        toks = self.tokenize(text)
        with self._prefix_lock:
            self._prefix_tokens[text] = tuple(toks)
            while len(self._prefix_tokens) > 64:
                self._prefix_tokens.popitem(last=False)
        return toks

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template renders tool definitions (it reads ``tools``), as Ollama's capability."""
        return template_mentions_tools(self.template.text)

    @property
    def supports_thinking(self) -> bool:
        """Whether the chat template has a reasoning section (:func:`ollapy.chat.thinking.supports_thinking`)."""
        from ollapy.chat.thinking import supports_thinking

        return supports_thinking(self.template.text)

    @staticmethod
    def template_variables(think: bool | str | None) -> dict:
        """Template variables for a ``think`` value: None (unset) none; else ``enable_thinking`` and
        ``think`` (Qwen3-style switches) and, for a level, ``reasoning_effort``."""
        if think is None:
            return {}
        on = think is True or isinstance(think, str)
        out: dict = {"enable_thinking": on, "think": on}
        if isinstance(think, str):
            out["reasoning_effort"] = think
        return out

    def render(self, messages: list[dict], add_generation_prompt: bool = True, *, tools: list[dict] | None = None,
               think: bool | str | None = None) -> str:
        """Render chat messages to prompt text with the selected template.

        ``tools`` (function tools, OpenAI/Ollama shape) reach the template as ``tools``;
        ``think`` sets the template's thinking switches (:meth:`template_variables`).

        A chat whose last message is an assistant turn with content (and no
        tool calls) is a prefill: the answer continues that message instead of
        starting a new turn. The earlier messages are rendered with the
        generation prompt and the assistant text is appended verbatim, as
        llama.cpp's server does (``prefill_assistant``) and Ollama's template
        layer does for a trailing assistant message. Raises OptionError for
        template errors.
        """
        last = messages[-1] if messages else None
        if (add_generation_prompt and len(messages) > 1 and last.get("role") == "assistant"
                and last.get("content") and not last.get("tool_calls")):
            return self.render(messages[:-1], add_generation_prompt=True, tools=tools, think=think) + str(last["content"])
        try:
            return render_chat_template(self.template.text, messages, self.bos_text, self.eos_text, add_generation_prompt,
                                        tools=tools, variables=self.template_variables(think))
        except Exception as exc:  # noqa: BLE001 - jinja errors, raise_exception() in templates: all become OptionError
            raise OptionError(f"chat template error: {exc}", hint="check the message roles and order") from None

    def chat_prompt(self, messages: list[dict], options: Options | None = None, *, tools: list[dict] | None = None,
                    think: bool | str | None = None) -> Prompt:
        """Build the prompt for a chat: tokens, ``keep`` (BOS + system) and cache save points.

        ``tools`` and ``think`` are passed to the template as in :meth:`render`; split the answer
        with :class:`ollapy.chat.reply.ReplyParser` (``opened`` from
        :func:`ollapy.chat.thinking.prompt_opens_thinking` of the prompt's ``text``).

        With ``options`` whose ``truncate`` is true, a chat that does not fit
        ``num_ctx`` is shortened message by message so the template's structure
        survives: the system prompt stays, the oldest turns go first, then the
        start of the last message (its most recent text is kept). The result
        leaves half the context for the answer and has ``truncated`` set.
        """
        extra = {"tools": tools, "think": think}
        prompt = self._chat_prompt(messages, **extra)
        if options is None or not options.truncate or len(prompt.tokens) < self.backend.num_ctx or prompt.media:
            return prompt
        return self._fit_chat(list(messages), prompt, **extra)

    def _fit_chat(self, msgs: list[dict], prompt: Prompt, **extra) -> Prompt:
        budget = max(1, self.backend.num_ctx // 2)
        while len(prompt.tokens) > budget:
            idx = next((i for i, m in enumerate(msgs[:-1]) if m.get("role") != "system"), None)
            if idx is None:
                break
            del msgs[idx]
            prompt = self._chat_prompt(msgs, **extra)
        if len(prompt.tokens) > budget and msgs and msgs[-1].get("role") != "system":
            last = dict(msgs[-1])
            ctoks = self.backend.tokenize(last.get("content") or "", add_special=False, parse_special=False)
            keep_n = max(0, len(ctoks) - (len(prompt.tokens) - budget) - 8)
            tail = b"".join(self.backend.token_piece(t, special=False) for t in ctoks[len(ctoks) - keep_n:])
            last["content"] = tail.decode("utf-8", "ignore")
            msgs[-1] = last
            prompt = self._chat_prompt(msgs, **extra)
        log.debug("chat truncated to %d tokens (num_ctx %d)", len(prompt.tokens), self.backend.num_ctx)
        return Prompt(prompt.tokens, prompt.keep, prompt.save_points, prompt.text, truncated=True)

    def _chat_prompt(self, messages: list[dict], **extra) -> Prompt:
        messages, images, held = self._message_images(messages)
        with held:  # the decoded pixels count against the process's budget until the prompt is built
            return self._chat_prompt_of(messages, images, **extra)

    def _chat_prompt_of(self, messages: list[dict], images: list, **extra) -> Prompt:
        text = self.render(messages, **extra)
        media = ()
        if images:  # text and image chunks; placeholder ids stand for each image's embeddings (engine/media.py)
            tokens, media = self._media_tokens(text, images)
        else:
            tokens = self.tokenize(text)
        log.debug("chat prompt (%d messages, %d tokens): %r", len(messages), len(tokens), text)
        points: list[int] = []
        keep = 1 if tokens and tokens[0] == self.backend.bos else 0
        sys_msgs = [m for m in messages if m.get("role") == "system"]
        if sys_msgs and len(messages) > len(sys_msgs):
            try:
                # the text before the first user message's content: the system prompt (and the user turn's
                # header) for a template with a system role and for one that merges the system prompt into
                # the first user turn (Gemma), whose render of the system message alone shares no prefix
                marked = self.render(sys_msgs + [{"role": "user", "content": _MARK}], add_generation_prompt=False,
                                     **extra)
                cut = marked.find(_MARK)
                head_text = marked[:cut] if cut > 0 else self.render(sys_msgs, add_generation_prompt=False, **extra)
                head = self._tokenize_prefix(head_text)
                keep = max(keep, common_prefix(head, tokens))
                points.append(keep)
            except OptionError:
                pass
        if len(messages) >= 2 and messages[-1].get("role") == "user":
            try:
                prev_text = self.render(messages[:-1], add_generation_prompt=False, **extra)
                n_prev = prev_text.count(self.media.marker) if images else 0
                if n_prev:  # earlier turns with images: their placeholder ids, so the turn's end is a save point
                    prev = self._media_tokens(prev_text, images[:n_prev])[0]
                else:
                    prev = self._tokenize_prefix(prev_text)
                points.append(common_prefix(prev, tokens))
            except OptionError:
                pass
        # the previous turn's end when it is the system prompt's own end (a one-question chat) is covered by the
        # system point just after it: one state, not two of nearly the same length
        pts = tuple(sorted({p for p in points if 0 < p < len(tokens) and not (p < keep and all(m.get("role") ==
                                                                                  "system" for m in messages[:-1]))}))
        return Prompt(tokens, keep, pts, text, media=media)

    def raw_prompt(self, text: str) -> Prompt:
        """A prompt used verbatim (Ollama's ``raw``): tokenized, BOS added when the model wants it."""
        tokens = self.tokenize(text)
        return Prompt(tokens, 1 if tokens and tokens[0] == self.backend.bos else 0, (), text)

    @property
    def supports_insert(self) -> bool:
        """Whether the model completes between a prefix and a suffix (Ollama's ``insert`` capability): its
        template reads ``suffix`` (:func:`template_reads_suffix`) or its vocabulary has FIM tokens."""
        return template_reads_suffix(self.template.text) or self.facts.fim.usable

    def fim_prompt(self, request: FimRequest, options: Options | None = None) -> Prompt:
        """The prompt of a code completion (``/infill``, or Ollama's and OpenAI's ``suffix``).

        A vocabulary with FIM tokens has them laid out by :func:`ollapy.chat.fim.fim_tokens` (repository context,
        the ``fim_layout``), with a save point where the next keystroke's prompt departs (the stable part); an
        Ollama registry template for such a model renders the same tokens (``<|fim_prefix|>{{ .Prompt }}...``).
        Otherwise a template that reads ``suffix`` (a Go template with ``.Suffix``, translated) is rendered with
        ``prompt`` and ``suffix`` as Ollama renders it (the typed text stays in ``prompt``; no repository context).
        Either way the finished state is not cached (``save_end`` False): a keystroke's tail is no later
        request's prefix. Raises OptionError when the model has neither (Ollama's ``"NAME" does not support
        insert``) or for an unknown ``fim_layout``.
        """
        from ollapy.chat.fim import FimError, fim_tokens

        options = options or Options()
        if not self.facts.fim.usable:
            if not template_reads_suffix(self.template.text):
                raise OptionError(f'"{self.name}" does not support insert',
                                  hint="use a code model whose vocabulary has FIM tokens (e.g. qwen2.5-coder)")
            text = self._render_insert(request.prefix + (request.typed or ""), request.suffix)
            tokens = self.tokenize(text)
            return Prompt(tokens, 1 if tokens and tokens[0] == self.backend.bos else 0, (), text, save_end=False)

        def plain(text: str) -> list[int]:
            return self.backend.tokenize(text, add_special=False, parse_special=False)

        def special(text: str) -> list[int]:
            return self.backend.tokenize(text, add_special=False, parse_special=True)

        try:
            lay = fim_tokens(request, self.facts.fim, plain, num_ctx=self.backend.num_ctx,
                             room=max(0, options.num_predict),
                             bos=self.backend.bos if self.backend.add_bos else None,
                             tokenize_typed=special if request.typed is not None else plain)
        except FimError as exc:  # only the caller's mistakes: any other exception is a bug, not a 400
            hint = "fim_layout is one of auto, plain, moved-line" if "layout" in str(exc) else \
                "use a model whose vocabulary has FIM tokens"
            raise OptionError(str(exc), hint=hint) from None
        points = (lay.stable,) if 0 < lay.stable < len(lay.tokens) else ()
        text = b"".join(self.backend.token_piece(t, special=True) for t in lay.tokens).decode("utf-8", "replace")
        return Prompt(lay.tokens, 0, points, text, truncated=lay.truncated, save_end=False)

    def _render_insert(self, prompt: str, suffix: str) -> str:
        """The template rendered as Ollama renders it for ``suffix``: ``.Prompt`` and ``.Suffix`` set, no
        messages (a legacy template reads its ``.Prompt`` from the one user turn). Raises OptionError."""
        try:
            return render_chat_template(self.template.text, [{"role": "user", "content": prompt}], self.bos_text,
                                        self.eos_text, True, variables={"prompt": prompt, "suffix": suffix})
        except Exception as exc:  # noqa: BLE001 - template errors become OptionError, as in render()
            raise OptionError(f"chat template error: {exc}", hint="check the template's .Suffix branch") from None

    def grammar_for(self, fmt) -> str | None:
        """GBNF for Ollama's ``format``: None, ``"json"``, or a JSON schema (dict). Raises OptionError."""
        if fmt in (None, ""):
            return None
        if fmt == "json":
            return json_schema_grammar(None)
        if isinstance(fmt, dict):
            try:
                return json_schema_grammar(json.dumps(fmt))
            except Exception as exc:  # noqa: BLE001
                raise OptionError(f"unsupported JSON schema: {exc}") from None
        raise OptionError(f"format must be 'json' or a JSON schema object, got {fmt!r}")
