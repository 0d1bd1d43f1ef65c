"""Request bodies (ollapy.server.ollama.bodies): defaults, Ollama's leniency, one-line errors naming the field."""
from __future__ import annotations

import pytest

from ollapy.errors import InvalidModelName, OptionError, UsageError
from ollapy.server.ollama.bodies import ChatBody, CopyBody, CreateBody, GenerateBody, PullBody
from ollapy.server.openai.bodies import ChatCompletionBody, CompletionBody

MSGS = [{"role": "user", "content": "hi"}]


def test_ollama_defaults_and_leniency():
    b = GenerateBody.from_dict({"model": " smol ", "prompt": "hi", "unknown_field": {"x": 1}, "format": None,
                                "stream": None, "keep_alive": None, "options": {"bogus": 1}})
    assert b.model == "smol" and b.prompt == "hi" and b.stream is True and b.cache is True and b.raw is False
    assert b.format is None and b.keep_alive is None and b.context is None and b.logprob_count == -1
    assert b.options == {"bogus": 1}  # read leniently later by api_options
    assert not hasattr(b, "unknown_field")
    assert GenerateBody.from_dict({"name": "smol"}).model == "smol" and GenerateBody.from_dict({"name": "x"}).prompt == ""
    assert GenerateBody.from_dict({"model": "smol", "format": ""}).format is None
    assert GenerateBody.from_dict({"model": "smol", "format": {"type": "object"}}).format == {"type": "object"}
    assert GenerateBody.from_dict({"model": "smol", "context": [1, 2]}).context == [1, 2]
    assert GenerateBody.from_dict({"model": "smol", "context": []}).context is None
    assert GenerateBody.from_dict({"model": "smol", "logprobs": True, "top_logprobs": 3}).logprob_count == 3
    c = ChatBody.from_dict({"model": "smol", "messages": None, "stream": False, "tools": []})
    assert c.messages == [] and c.stream is False
    assert GenerateBody.from_dict({"model": "./models/x.gguf"}).model == "./models/x.gguf"
    assert GenerateBody.from_dict({"model": "smol", "images": ["aGk="]}).images == ["aGk="]  # for a vision model


@pytest.mark.parametrize("cls, data, exc, words", [
    (GenerateBody, {}, UsageError, "model is required"),
    (GenerateBody, {"model": 3}, UsageError, "model is required"),
    (GenerateBody, {"model": "../../etc/passwd"}, InvalidModelName, "invalid model name"),
    (GenerateBody, {"model": "smol", "prompt": 5}, OptionError, "prompt must be a string"),
    (GenerateBody, {"model": "smol", "format": "yaml"}, OptionError, "format must be 'json' or a JSON schema"),
    (GenerateBody, {"model": "smol", "context": "abc"}, OptionError, "context must be a list of token ids"),
    (GenerateBody, {"model": "smol", "top_logprobs": 2}, OptionError, "top_logprobs needs logprobs: true"),
    (GenerateBody, {"model": "smol", "stream": "maybe"}, OptionError, "stream: input should be a valid boolean"),
    (GenerateBody, {"model": "smol", "raw": [1]}, OptionError, "raw: input should be a valid boolean"),
    (ChatBody, {"model": "smol", "messages": "hi"}, OptionError, "messages must be a list"),
    (ChatBody, {"model": "smol", "messages": MSGS, "tools": [{"type": "function"}]}, OptionError,
     "tools.0.function is required"),
    (ChatBody, {"model": "smol", "messages": MSGS, "think": "maybe"}, OptionError, "invalid think value 'maybe'"),
    (ChatBody, {"model": "smol", "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
     "arguments": "{oops"}}]}]}, OptionError, "invalid tool call arguments: not JSON"),
    (CopyBody, {"source": "a"}, UsageError, "source and destination are required"),
    (CreateBody, {"model": "x", "system": 5}, OptionError, "system: input should be a valid string"),
    (PullBody, {"model": "../x"}, InvalidModelName, "invalid model name"),
    (CreateBody, {"model": "./x.gguf", "from": "smol"}, InvalidModelName, "invalid model name"),
    (PullBody, {"model": "x", "insecure": "sometimes"}, OptionError, "insecure: input should be a valid boolean"),
])
def test_bad_values_are_one_line_errors_naming_the_field(cls, data, exc, words):
    with pytest.raises(exc) as ei:
        cls.from_dict(data)
    text = str(ei.value)
    assert words in text and "\n" not in text, text


def test_openai_defaults_and_mapping():
    b = ChatCompletionBody.from_dict({"model": "smol", "messages": [{"role": "developer", "content": "be brief"},
                                                                    *MSGS], "max_tokens": 5, "stop": "x",
                                      "temperature": 0, "seed": None, "n": 1, "logit_bias": {}})
    assert b.stream is False and b.include_usage is False and b.response_format is None and b.logprob_count == -1
    assert b.messages[0] == {"role": "system", "content": "be brief"} and b.messages[1] == MSGS[0]
    assert b.ollama_options() == {"num_predict": 5, "temperature": 0, "stop": ["x"]}
    b = ChatCompletionBody.from_dict({"model": "smol", "messages": MSGS, "max_tokens": 5, "max_completion_tokens": 7,
                                      "stop": ["a", "b"], "options": {"top_k": 3}, "stream": True,
                                      "stream_options": {"include_usage": True}, "logprobs": True,
                                      "response_format": {"type": "json_object"}})
    assert b.ollama_options() == {"num_predict": 7, "stop": ["a", "b"], "top_k": 3}
    assert b.stream and b.include_usage and b.logprob_count == 0 and b.response_format == "json"
    schema = {"type": "object"}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert ChatCompletionBody.from_dict({"model": "m", "messages": MSGS, "response_format": rf}).response_format == schema
    assert ChatCompletionBody.from_dict({"model": "m", "messages": MSGS,
                                         "response_format": {"type": "text"}}).response_format is None
    c = CompletionBody.from_dict({"model": "smol", "prompt": ["once"], "logprobs": 2})
    assert c.prompt == "once" and c.logprob_count == 2 and c.stream is False
    assert CompletionBody.from_dict({"model": "smol", "prompt": "x", "logprobs": None}).logprob_count == -1


@pytest.mark.parametrize("cls, data, exc, words", [
    (ChatCompletionBody, {"messages": MSGS}, UsageError, "model is required"),
    (ChatCompletionBody, {"model": "smol"}, OptionError, "messages must be a non-empty list"),
    (ChatCompletionBody, {"model": "smol", "messages": []}, OptionError, "messages must be a non-empty list"),
    (ChatCompletionBody, {"model": "smol", "messages": MSGS, "tools": [{}]}, OptionError, "tools.0.function is required"),
    (ChatCompletionBody, {"model": "smol", "messages": MSGS, "tools": [{"type": "custom", "function": {"name": "f"}}]},
     OptionError, "unsupported tool type 'custom'"),
    (ChatCompletionBody, {"model": "smol", "messages": MSGS, "tool_choice": "required"}, OptionError,
     "tool_choice requires tools"),
    (ChatBody, {"model": "smol", "messages": MSGS, "tool_choice": {"type": "function", "function": {"name": "f"}}},
     OptionError, "tool_choice requires tools"),
    (ChatCompletionBody, {"model": "smol", "messages": MSGS, "tool_choice": "always"}, OptionError,
     "invalid tool_choice 'always'"),
    (ChatCompletionBody, {"model": "smol", "messages": MSGS, "reasoning_effort": "max"}, OptionError,
     "invalid reasoning_effort value 'max'"),
    (ChatCompletionBody, {"model": "smol", "messages": MSGS, "n": 2}, OptionError, "n must be 1"),
    (ChatCompletionBody, {"model": "smol", "messages": MSGS, "response_format": "json"}, OptionError,
     "response_format must be an object"),
    (ChatCompletionBody, {"model": "smol", "messages": MSGS, "response_format": {"type": "xml"}}, OptionError,
     "unsupported response_format type 'xml'"),
    (ChatCompletionBody, {"model": "smol", "messages": MSGS, "logprobs": True, "top_logprobs": 50}, OptionError,
     "top_logprobs must be an integer from 0 to 20"),
    (ChatCompletionBody, {"model": "smol", "messages": MSGS, "stream_options": {"include_usage": "often"}},
     OptionError, "stream_options.include_usage: input should be a valid boolean"),
    (CompletionBody, {"model": "smol", "prompt": "x", "stream_options": 3}, OptionError,
     "stream_options: input should be an object, got 3"),
    (CompletionBody, {"model": "smol"}, OptionError, "prompt must be a non-empty string"),
    (CompletionBody, {"model": "smol", "prompt": ["a", "b"]}, OptionError, "prompt must be a string or a list of one"),
    (CompletionBody, {"model": "smol", "prompt": "x", "logprobs": 9}, OptionError,
     "logprobs must be an integer from 0 to 5"),
])
def test_openai_bad_values(cls, data, exc, words):
    with pytest.raises(exc) as ei:
        cls.from_dict(data)
    assert words in str(ei.value) and "\n" not in str(ei.value), str(ei.value)
