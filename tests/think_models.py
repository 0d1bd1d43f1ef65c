"""The thinking test model ``smol-think``: SmolLM2 with a DeepSeek-R1-style TEMPLATE and one MESSAGE example.

The template's generation prompt opens ``<think>``; the example (a question answered with
``<think>…</think>answer``) makes the greedy answer to :data:`Q` reason, close the section and
answer, so the split is known exactly (:data:`THINKING`, :data:`ANSWER`). Shared by the API tests
(created through the ollama client) and the CLI tests (``ollapy create`` with :func:`think_modelfile`).
"""
from __future__ import annotations

from pathlib import Path

THINK_TEMPLATE = """{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
<think>
{% endif %}"""
EXAMPLE = [{"role": "user", "content": "What is the capital of Italy?"},
           {"role": "assistant", "content": "<think>\nThe user asks for the capital of Italy. It is Rome.\n</think>\nRome"}]
Q = "What is the capital of France?"
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 40}
THINKING, ANSWER = "The user asks for the capital of France. It is Paris.", "Paris"


def think_modelfile(gguf: Path) -> str:
    """Modelfile text of ``smol-think`` over the SmolLM2 GGUF at ``gguf`` (for ``ollapy create -f``)."""
    from ollapy.store.modelfile import format_modelfile

    return format_modelfile(str(gguf), {}, None, THINK_TEMPLATE, None, EXAMPLE)
