"""Ollama Go-template TEMPLATEs translated to Jinja at ``create`` (ollapy/chat/gotemplate.py).

Each template below is written in the style of Ollama's library templates; the expected prompts are derived by
hand from Go's text/template rules and Ollama's Execute/collate (messages mode, or legacy per-turn execution with
the last turn cut after ``{{ .Response }}``). Rendering goes through ollapy's own formatter (llama-cpp-python's
sandboxed Jinja2 with trim_blocks/lstrip_blocks), the one the engine uses.
"""
from __future__ import annotations

import pytest

pytest_plugins = ["store_fixtures"]

from ollapy.chat import templates as chat
from ollapy.chat.gotemplate import is_go_template, jinja_template, translate_go_template
from ollapy.engine.backend.templating import render_chat_template
from ollapy.errors import UsageError

LLAMA3 = """{{- if .Messages }}
{{- if .System }}<|start_header_id|>system<|end_header_id|>

{{ .System }}<|eot_id|>
{{- end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "user" }}<|start_header_id|>user<|end_header_id|>

{{ .Content }}<|eot_id|>
{{- if $last }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- else if eq .Role "assistant" }}<|start_header_id|>assistant<|end_header_id|>

{{ .Content }}{{ if not $last }}<|eot_id|>{{ end }}
{{- end }}
{{- end }}
{{- else }}
{{- if .System }}<|start_header_id|>system<|end_header_id|>

{{ .System }}<|eot_id|>{{ end }}{{ if .Prompt }}<|start_header_id|>user<|end_header_id|>

{{ .Prompt }}<|eot_id|>{{ end }}<|start_header_id|>assistant<|end_header_id|>

{{ .Response }}<|eot_id|>
{{- end }}"""

MISTRAL = """{{- range $index, $_ := .Messages }}
{{- if eq .Role "user" }}
{{- if and $.System (eq (len (slice $.Messages $index)) 1) }}[INST] {{ $.System }}

{{ .Content }}[/INST]
{{- else }}[INST] {{ .Content }}[/INST]
{{- end }}
{{- else if eq .Role "assistant" }} {{ .Content }}</s>
{{- end }}
{{- end }}"""

CHATML_LEGACY = """{{ if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ .Response }}<|im_end|>
"""

GEMMA = """{{- range $i, $m := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq $m.Role "user" }}<start_of_turn>user
{{ if and $.System (or (eq $i 0) (eq $i 1)) }}{{ $.System }}

{{ end }}{{ $m.Content }}<end_of_turn>
{{ else if eq $m.Role "assistant" }}<start_of_turn>model
{{ $m.Content }}{{ if not $last }}<end_of_turn>
{{ end }}
{{- end }}
{{- if and $last (ne $m.Role "assistant") }}<start_of_turn>model
{{ end }}
{{- end }}"""

PHI3 = """{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
<|{{ .Role }}|>
{{ .Content }}<|end|>
{{ if and (ne .Role "assistant") $last -}}
<|assistant|>
{{ end }}
{{- end }}"""

PROMPT_ONLY = "{{ .Prompt }}"  # legacy; Ollama appends {{ .Response }}
INST_LEGACY = "[INST] {{ if .System }}{{ .System }} {{ end }}{{ .Prompt }} [/INST]"

SYS = {"role": "system", "content": "You are terse."}
HI = {"role": "user", "content": "Hi"}
HELLO = {"role": "assistant", "content": "Hello!"}
BYE = {"role": "user", "content": "Bye"}
PREFILL = {"role": "assistant", "content": "Hel"}
CONVERSATIONS = {"system+user": [SYS, HI], "user": [HI], "multi-turn": [SYS, HI, HELLO, BYE], "prefill": [HI, PREFILL]}

L3H = "<|start_header_id|>{}<|end_header_id|>\n\n"
EXPECTED = {
    "llama3": {
        "system+user": L3H.format("system") + "You are terse.<|eot_id|>" + L3H.format("user") + "Hi<|eot_id|>"
        + L3H.format("assistant"),
        "user": L3H.format("user") + "Hi<|eot_id|>" + L3H.format("assistant"),
        "multi-turn": L3H.format("system") + "You are terse.<|eot_id|>" + L3H.format("user") + "Hi<|eot_id|>"
        + L3H.format("assistant") + "Hello!<|eot_id|>" + L3H.format("user") + "Bye<|eot_id|>" + L3H.format("assistant"),
        "prefill": L3H.format("user") + "Hi<|eot_id|>" + L3H.format("assistant") + "Hel",
    },
    "mistral": {
        "system+user": "[INST] You are terse.\n\nHi[/INST]",
        "user": "[INST] Hi[/INST]",
        "multi-turn": "[INST] Hi[/INST] Hello!</s>[INST] You are terse.\n\nBye[/INST]",
        "prefill": "[INST] Hi[/INST] Hel</s>",
    },
    "chatml-legacy": {
        "system+user": "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "user": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "multi-turn": "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
        "prefill": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHel",
    },
    "gemma": {
        "system+user": "<start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n<start_of_turn>model\n",
        "user": "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
        "multi-turn": "<start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
        "prefill": "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHel",
    },
    "phi3": {
        "system+user": "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n",
        "user": "<|user|>\nHi<|end|>\n<|assistant|>\n",
        "multi-turn": "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
        "<|user|>\nBye<|end|>\n<|assistant|>\n",
        "prefill": "<|user|>\nHi<|end|>\n<|assistant|>\nHel<|end|>\n",
    },
    "prompt-only": {"system+user": "Hi", "user": "Hi", "multi-turn": "HiHello!Bye", "prefill": "HiHel"},
    "inst-legacy": {  # .System reaches only the first turn
        "system+user": "[INST] You are terse. Hi [/INST]",
        "user": "[INST] Hi [/INST]",
        "multi-turn": "[INST] You are terse. Hi [/INST]Hello![INST] Bye [/INST]",
        "prefill": "[INST] Hi [/INST]Hel",
    },
}
TEMPLATES = {"llama3": LLAMA3, "mistral": MISTRAL, "chatml-legacy": CHATML_LEGACY, "gemma": GEMMA, "phi3": PHI3,
             "prompt-only": PROMPT_ONLY, "inst-legacy": INST_LEGACY}


def render(go: str, messages: list[dict], add_generation_prompt: bool = True) -> str:
    return render_chat_template(jinja_template(go), messages, "<s>", "</s>", add_generation_prompt)


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_translated_template_renders_what_ollama_renders(name, conversation):
    go = TEMPLATES[name]
    assert is_go_template(go)
    assert render(go, CONVERSATIONS[conversation]) == EXPECTED[name][conversation]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_add_generation_prompt_does_not_change_an_ollama_template(name):
    """Ollama templates open the assistant turn themselves (Ollama has no such flag): the text is the same."""
    msgs = CONVERSATIONS["multi-turn"]
    assert render(TEMPLATES[name], msgs, add_generation_prompt=False) == EXPECTED[name]["multi-turn"]
    assert render(TEMPLATES[name], msgs[:1], add_generation_prompt=False) == render(TEMPLATES[name], msgs[:1])


def test_messages_are_collated_as_ollama_does():
    """Consecutive messages of one role merge with a blank line (tool messages excepted); .System joins every system
    message; system messages stay in .Messages."""
    go = ("{{ if .System }}SYS={{ .System }};{{ end }}{{- range .Messages }}[{{ .Role }}:{{ .Content }}]{{ else }}none"
          "{{ end }}")
    msgs = [SYS, {"role": "system", "content": "Be kind."}, HI, {"role": "user", "content": "there"},
            {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    assert render(go, msgs) == ("SYS=You are terse.\n\nBe kind.;[system:You are terse.\n\nBe kind.][user:Hi\n\nthere]"
                                "[tool:a][tool:b]")


def test_legacy_turns_system_mid_conversation_and_cut_after_response():
    """A system message after a user message closes that turn; the last turn stops right after {{ .Response }}, even
    inside an if, and the text after it goes."""
    go = "{{ if .System }}S:{{ .System }} {{ end }}U:{{ .Prompt }} A:{{ if .Response }}{{ .Response }}{{ end }}|END\n"
    msgs = [HI, {"role": "system", "content": "new"}, BYE, HELLO]
    assert render(go, msgs) == "U:Hi A:|END\nS:new U:Bye A:Hello!"


def test_other_constructs_with_comments_pipes_and_literals():
    go = ('{{/* a comment */}}{{- with .System }}<<{{ . }}>>{{ else }}<<none>>{{ end -}}\n\n'
          '{{ range $m := .Messages }}{{ $m.Role | len }}{{ if ne $m.Role `user` }}!{{ end }}{{ end }}'
          '{{ if or (lt (len .Messages) 2) (ge (len .Messages) 9) }} few{{ else }} many{{ end }}'
          '{{ with index .Messages 0 }} first={{ .Content }}{{ end }} {{ eq 1 1 }} {{ "q\\"\\n" }}')
    assert render(go, [HI]) == '<<none>>4 few first=Hi true q"\n'
    assert render(go, [SYS, HI]) == '<<You are terse.>>6!4 many first=You are terse. true q"\n'


def test_literal_text_survives_exactly():
    """Quotes, backslashes, escapes-looking text, non-ASCII, CR/LF and tabs in the template text, and Jinja-looking
    message content, come out as written."""
    text = "é✓ 😀 back\\slash \\n q' d\" \u2028 tab\there\r\n"
    assert render(text + "{{ .Prompt }}", [{"role": "user", "content": "x{{ y }}{% z %}"}]) == text + "x{{ y }}{% z %}"


@pytest.mark.parametrize(("go", "construct"), [
    ("{{ .Tools }}{{ .Prompt }}", "{{ .Tools }}"),
    ("{{ if .Tools }}x{{ end }}{{ .Prompt }}", "{{ if .Tools }}"),
    ("{{ range .Messages }}{{ json .ToolCalls }}{{ end }}", "{{ json .ToolCalls }}"),
    ("{{ range .Messages }}{{ .ToolCalls }}{{ end }}", "{{ .ToolCalls }}"),
    ('{{ printf "%s" .Prompt }}', '{{ printf "%s" .Prompt }}'),
    ('{{ define "x" }}y{{ end }}{{ .Prompt }}', '{{ define "x" }}'),
    ("{{ $x := 1 }}{{ $x = 2 }}{{ .Prompt }}", "{{ $x = 2 }}"),
    ("{{ .Think }}{{ .Prompt }}", "{{ .Think }}"),
    ("{{ range .Prompt }}x{{ end }}", "{{ range .Prompt }}"),
    ("{{ $y }}{{ .Prompt }}", "{{ $y }}"),
    ("{{ len () }}{{ .Prompt }}", "{{ len () }}"),
])
def test_untranslatable_constructs_are_refused_naming_them(go, construct):
    with pytest.raises(UsageError) as info:
        translate_go_template(go)
    msg = str(info.value)
    assert f"Go-template construct {construct!r} that ollapy cannot translate; write the template in Jinja" in msg
    assert "\n" not in msg


def test_unclosed_block_is_refused():
    with pytest.raises(UsageError, match="unclosed"):
        translate_go_template("{{ if .System }}{{ .System }}")


@pytest.mark.parametrize("text", [chat.CHATML, chat.GEMMA, chat.LLAMA3, "{{ bos_token }}{{ messages[0]['content'] }}",
                                  "{# c #}{{ messages | length }}"])
def test_jinja_templates_are_kept_as_they_are(text):
    assert not is_go_template(text)
    assert jinja_template(text) == text


def test_detection_rule_for_go_templates():
    for text in ("{{ .Prompt }}", "{{- if .System }}x{{ end }}", "{{ range .Messages }}{{ end }}", "{{/* c */}}",
                 "{{ $.System }}", "plain text, no tags"):
        assert is_go_template(text), text


def test_create_refuses_a_go_template_it_cannot_translate(store_env, smollm2_path, tmp_path):
    from conftest import run_cli

    (tmp_path / "Modelfile").write_text(f'FROM {smollm2_path}\nTEMPLATE """{{{{ .Tools }}}}{{{{ .Prompt }}}}"""\n')
    r = run_cli("create", "bad", "-f", str(tmp_path / "Modelfile"))
    assert r.returncode == 2
    err = r.stderr.decode().strip()
    assert err == ("Error: TEMPLATE uses Go-template construct '{{ .Tools }}' that ollapy cannot translate; "
                   "write the template in Jinja"), err
    assert run_cli("show", "bad").returncode != 0  # nothing was created


CHATML_GO = """{{- range $i, $_ := .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
"""


def test_create_translates_and_run_applies_it_on_smollm2(store_env, smollm2_path, tmp_path):
    """A ChatML Go template through the CLI: stored as Jinja, shown as Jinja, `show --modelfile` re-creates the same
    model, and `run` renders the prompt with it (no SmolLM default system line, which the GGUF's own template adds)."""
    from conftest import run_cli

    (tmp_path / "Modelfile").write_text(f'FROM {smollm2_path}\nTEMPLATE """{CHATML_GO}"""\nPARAMETER temperature 0\n')
    r = run_cli("create", "gochat", "-f", str(tmp_path / "Modelfile"))
    assert r.returncode == 0, r.stderr
    shown = run_cli("show", "gochat", "--template").stdout.decode()
    assert "{%" in shown and ".Messages" not in shown and not is_go_template(shown)
    modelfile = run_cli("show", "gochat", "--modelfile").stdout.decode()
    (tmp_path / "Modelfile2").write_text(modelfile)
    assert run_cli("create", "gochat2", "-f", str(tmp_path / "Modelfile2")).returncode == 0
    assert run_cli("show", "gochat2", "--modelfile").stdout.decode() == modelfile
    assert run_cli("show", "gochat2", "--template").stdout.decode() == shown

    q = "What is the capital of France? One word."
    p = run_cli("run", "gochat", "-o", "num_predict=20", "--verbose", q, env={"OLLAPY_DEBUG": "1"})
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout.decode()
    err = p.stderr.decode()
    assert repr(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n") in err  # the exact prompt, nothing before
    assert "chat template:        modelfile" in err
