"""Chat templates: which Jinja2 template renders a conversation for a model.

Models that ship ``tokenizer.chat_template`` in their GGUF use it as is
(rendered by llama-cpp-python's Jinja2 formatter in the engine backend). For
models that ship none, :data:`FALLBACKS` has one per architecture family,
written in the same Jinja2 dialect; ChatML is the last resort. The chosen
template's source is reported to the user (``ollapy show``, ``--verbose``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Gemma's turn format; Gemma has no system role, so system messages (all of them, in order: Codex sends two
# developer messages) are prepended to the next user turn.
GEMMA = (
    "{{ bos_token }}"
    "{% set ns = namespace(sys='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.sys = ns.sys + message['content'] + '\n\n' %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (ns.sys if role == 'user' else '') + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% if role == 'user' %}{% set ns.sys = '' %}{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

FALLBACKS: dict[str, tuple[str, str]] = {
    "gemma": ("gemma (built-in fallback)", GEMMA),
    "gemma2": ("gemma (built-in fallback)", GEMMA),
    "gemma3": ("gemma (built-in fallback)", GEMMA),
    "gemma3n": ("gemma (built-in fallback)", GEMMA),
    "llama": ("chatml (built-in fallback)", CHATML),
}


@dataclass(frozen=True)
class Template:
    """A chat template and where it came from (``gguf``, ``modelfile`` or a fallback name)."""

    source: str
    text: str


def select_template(gguf_template: str | None, architecture: str | None, override: str | None = None) -> Template:
    """Pick the template: an explicit override, else the GGUF's, else the architecture's fallback, else ChatML."""
    if override:
        return Template("modelfile", override)
    if gguf_template:
        return Template("gguf tokenizer.chat_template", gguf_template)
    name, text = FALLBACKS.get((architecture or "").lower(), ("chatml (built-in fallback)", CHATML))
    return Template(name, text)


def build_messages(prompt: str | None, system: str | None, history: list[dict] | None = None) -> list[dict]:
    """Assemble chat messages: optional system, prior turns, then the user prompt (if any)."""
    msgs: list[dict] = []
    if system:
        msgs.append({"role": "system", "content": system})
    for m in history or []:
        if m.get("role") == "system" and system:
            continue
        msgs.append({"role": m["role"], "content": m.get("content", "")})
    if prompt is not None:
        msgs.append({"role": "user", "content": prompt})
    return msgs


@functools.lru_cache(maxsize=32)
def template_reads_suffix(template: str | None) -> bool:
    """Whether a (Jinja2) chat template reads a ``suffix`` variable: a registry Go template with ``.Suffix``
    (translated by :mod:`ollapy.chat.gotemplate`), which Ollama renders for ``/api/generate``'s ``suffix``.
    False for a template that does not parse."""
    if not template or "suffix" not in template:
        return False
    import jinja2
    from jinja2 import meta

    try:
        return "suffix" in meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateError:
        return False
