"""Print the cached tokens each OpenAI route reports for a ~1,200-token system prompt sent twice, and the prompt
tokens the generic tool-call format adds (SmolLM2, a fresh `ollapy serve` on a free loopback port).

    .venv/bin/python scripts/measure_cached_tokens.py
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import _model_path, live_api  # noqa: E402
from test_responses_api import LONG_SYSTEM  # noqa: E402
from test_tools_api import ASK, TOOLS  # noqa: E402

GREEDY = {"temperature": 0, "extra_body": {"options": {"repeat_penalty": 1.0}}}
QUESTION = "What is the capital of France?"


def main() -> None:
    with tempfile.TemporaryDirectory() as base, live_api(Path(base), _model_path("smollm2"), {"smol": {}},
                                                         env={"OLLAPY_CONTEXT_LENGTH": "2048"}) as api:
        for i in range(2):
            r = api.oai.responses.create(model="smol", instructions=LONG_SYSTEM, input=QUESTION, max_output_tokens=4,
                                         **GREEDY)
            print(f"/v1/responses #{i + 1}: input_tokens {r.usage.input_tokens}, "
                  f"cached_tokens {r.usage.input_tokens_details.cached_tokens}")
        prompt = f"{LONG_SYSTEM}\nQuestion: {QUESTION}\nAnswer:"
        for i in range(2):
            c = api.oai.completions.create(model="smol", prompt=prompt, max_tokens=4, **GREEDY)
            print(f"/v1/completions #{i + 1}: prompt_tokens {c.usage.prompt_tokens}, "
                  f"cached_tokens {c.usage.prompt_tokens_details.cached_tokens}")
        last = list(api.oai.completions.create(model="smol", prompt=prompt, max_tokens=4, stream=True,
                                               stream_options={"include_usage": True}, **GREEDY))[-1]
        print(f"/v1/completions streamed usage chunk: cached_tokens {last.usage.prompt_tokens_details.cached_tokens}")
        msgs = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": QUESTION}]
        last = list(api.oai.chat.completions.create(model="smol", messages=msgs, max_tokens=4, stream=True,
                                                    stream_options={"include_usage": True}, **GREEDY))[-1]
        print(f"/v1/chat/completions streamed usage chunk: prompt_tokens {last.usage.prompt_tokens}, "
              f"cached_tokens {last.usage.prompt_tokens_details.cached_tokens}")
        plain = api.oai.chat.completions.create(model="smol", messages=ASK, max_tokens=1, **GREEDY)
        tools = api.oai.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, max_tokens=1, **GREEDY)
        print(f"generic tool format: prompt_tokens {plain.usage.prompt_tokens} without tools, "
              f"{tools.usage.prompt_tokens} with {len(TOOLS)} tools")


if __name__ == "__main__":
    main()
