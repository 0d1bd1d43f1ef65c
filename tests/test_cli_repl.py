"""PTY tests of the interactive chat, batch mode (--each-line) and named sessions, on SmolLM2."""
from __future__ import annotations

import json
import os
import re
import sys
import time

import pexpect
import pytest
from conftest import ROOT, run_cli


def _spawn(model, *args, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    return pexpect.spawn(sys.executable, ["-m", "ollapy.cli.main", "run", str(model), "-o", "temperature=0", *args],
                         env=env, encoding="utf-8", timeout=90, cwd=str(ROOT), dimensions=(40, 120))


def _start_repl(model, *args, history=False):
    """The chat REPL on ``model`` (greedy, ``args`` added), at its first ``>>> `` prompt; no history file unless asked."""
    c = _spawn(model, *args, env_extra=None if history else {"OLLAPY_NOHISTORY": "1"})
    c.expect_exact(">>> ")
    return c


def _say(c, line, *expected):
    """Send one REPL line, wait for each ``expected`` text in order, then for the next prompt."""
    c.sendline(line)
    for text in expected:
        c.expect_exact(text)
    c.expect_exact(">>> ")


def _bye(c):
    """End the REPL with /bye and check that it exited 0."""
    c.sendline("/bye")
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0


def test_repl_multiline_set_show_clear_ctrlc_ctrld(smollm2_path, tmp_path):
    state = os.environ["XDG_STATE_HOME"]
    c = _start_repl(smollm2_path, "--verbose", history=True)
    c.sendline('"""What is the capital')
    c.expect_exact("... ")
    c.sendline('of France? Answer in one word."""')
    c.expect("Paris")
    c.expect("prompt cache: +0 token")
    c.expect_exact(">>> ")
    _say(c, "/set parameter num_predict 4", "Set parameter 'num_predict' to '4'")
    c.sendline("/show info")
    c.expect("architecture +llama")
    c.expect_exact(">>> ")
    c.sendline("And of Germany?")
    c.expect(r"prompt cache: +(\d+) token")
    reused = int(c.match.group(1))
    assert reused > 30, "the second turn must reuse the first turn's KV"
    c.expect_exact(">>> ")
    _say(c, "/set parameter num_predict 300")
    c.sendline("Write a very long essay about the history of Rome.")
    time.sleep(1.5)
    c.sendintr()
    c.expect_exact("reply cancelled")
    c.expect_exact(">>> ")
    _say(c, "/set parameter num_predict 12")
    c.sendline("Thanks!")
    c.expect(r"eval count: +\d+ token")
    c.expect_exact(">>> ")
    _say(c, "/clear", "Cleared session context")
    c.sendintr()  # Ctrl-C at the prompt clears the line, does not exit
    c.expect_exact("Use Ctrl + d or /bye to exit.")
    c.expect_exact(">>> ")
    c.sendeof()
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 0
    hist = open(os.path.join(state, "ollapy", "history")).read()
    assert "/show info" in hist and "And of Germany?" in hist


def test_repl_bye_and_nohistory(smollm2_path):
    c = _start_repl(smollm2_path)  # OLLAPY_NOHISTORY=1
    _say(c, "/?", "/bye")
    _bye(c)
    assert not os.path.exists(os.path.join(os.environ["XDG_STATE_HOME"], "ollapy", "history"))


def test_repl_set_stop_words_replace_and_show_modelfile_parses(smollm2_path):
    """`/set parameter stop A B` sets two stop strings in place of earlier ones, as Ollama's REPL does, and
    `/show modelfile` prints one JSON-quoted PARAMETER line per value, which the Modelfile parser reads back."""
    from ollapy.store.modelfile import parse_modelfile

    c = _start_repl(smollm2_path, "-o", "repeat_penalty=1")  # the greedy answer below
    _say(c, "/set parameter stop Berlin")
    _say(c, "/set parameter stop Paris France", "Set parameter 'stop' to 'Paris, France'")
    _say(c, "/show modelfile")
    shown = c.before.replace("\r\n", "\n").split("\n", 1)[1]  # the echoed command line first
    assert shown.splitlines()[1:] == ["PARAMETER temperature 0", "PARAMETER repeat_penalty 1",
                                      'PARAMETER stop "Paris"', 'PARAMETER stop "France"']
    assert parse_modelfile(shown).parameters == {"temperature": 0.0, "repeat_penalty": 1.0, "stop": ["Paris", "France"]}
    _say(c, "What is the capital of France? Answer in one word.")  # unstopped: "The capital of France is Paris."
    assert c.before.replace("\r\n", "\n").split("\n")[1] == "The capital of "
    _bye(c)


def test_each_line_in_order_as_json_and_sharing_the_prefix(smollm2_path):
    words = ["apple", "river", "candle", "violin", "tiger", "mirror", "garden", "rocket"]
    lines = "\n".join(f"Repeat this word exactly once: {w}" for w in words) + "\n"
    par = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=40", "--each-line", "--json",
                  "--parallel", "4", input=lines)
    assert par.returncode == 0, par.stderr
    recs = [json.loads(x) for x in par.stdout.decode().splitlines()]
    assert [r["index"] for r in recs] == list(range(8))
    assert [r["prompt"].split()[-1] for r in recs] == words
    assert all(r["eval_count"] >= 1 and "response" in r for r in recs)
    hits = sum(w in r["response"].lower() for w, r in zip(words, recs))
    assert hits >= 6, recs
    ser = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=40", "--each-line", "--json",
                  "--parallel", "1", input=lines)
    assert ser.returncode == 0
    serial = [json.loads(x)["response"] for x in ser.stdout.decode().splitlines()]
    assert len(serial) == 8
    # greedy text may differ slightly between batch shapes (llama.cpp's CPU kernels are not batch-invariant)
    assert sum(a == r["response"] for a, r in zip(serial, recs)) >= 6
    # the first line prefills the shared prefix (template, default system prompt, instruction) alone; the lines
    # that start while it generates copy it from its slot, later ones reuse their slot's own KV: none starts cold
    assert recs[0]["prompt_cache_source"] == "none"
    assert {r["prompt_cache_source"] for r in recs[1:4]} == {"copy"}, [r["prompt_cache_source"] for r in recs]
    assert all(r["prompt_cache_source"] in ("copy", "slot") and r["prompt_cache_tokens"] > 20 for r in recs[1:])


def test_session_continues_in_new_process(smollm2_path):
    a = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=20", "--session", "trip",
                "My favourite city is Zanzibar. Just say OK.")
    assert a.returncode == 0, a.stderr
    b = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=20", "--session", "trip",
                "What is my favourite city?", env={"OLLAPY_DEBUG": "1"})
    assert b.returncode == 0, b.stderr
    err = b.stderr.decode()
    prompt_lines = [ln for ln in err.splitlines() if "chat prompt" in ln]
    assert prompt_lines, err[-2000:]
    assert "Zanzibar" in prompt_lines[-1] and "What is my favourite city?" in prompt_lines[-1]
    saved = json.loads(open(os.path.join(os.environ["XDG_STATE_HOME"], "ollapy", "sessions", "trip.json")).read())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("sig", ["int"])
def test_ctrl_c_one_shot_exits_130(smollm2_path, sig):
    c = pexpect.spawn(sys.executable, ["-m", "ollapy.cli.main", "run", str(smollm2_path), "-o", "num_predict=2000",
                                       "Write a very long story about a dragon."],
                      env=dict(os.environ), encoding="utf-8", timeout=90, cwd=str(ROOT))
    c.expect(r"\w+ \w+ \w+")  # some text streamed
    c.sendintr()
    c.expect(pexpect.EOF)
    c.close()
    assert c.signalstatus is None and c.exitstatus == 130
    assert "llama_" not in c.before  # llama.cpp's own log stays silent unless OLLAPY_DEBUG is set


def test_ctrl_c_during_model_load_aborts_it(smollm2_path):
    # Python code runs only in ctypes callbacks while llama.cpp loads, where ctypes swallows KeyboardInterrupt:
    # the load must still stop (progress callback returns false) and the command exit 130
    env = dict(os.environ, OLLAPY_DEBUG="1")
    c = pexpect.spawn(sys.executable, ["-m", "ollapy.cli.main", "run", str(smollm2_path), "hi"],
                      env=env, encoding="utf-8", timeout=60, cwd=str(ROOT))
    c.expect_exact("llama_model_loader: - kv")  # llama.cpp is reading the file
    c.sendintr()
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 130, c.before[-2000:]
    assert "ollapy.engine: loaded" not in c.before  # aborted, not finished and then interrupted
    assert "Traceback" not in c.before and "Exception ignored" not in c.before


def test_ctrl_c_during_prompt_eval_exits_130_without_crashing(smollm2_path, tmp_path):
    # the interrupt lands while the engine thread is inside llama_decode: the process must not exit (and unload
    # llama.cpp) under it, which segfaulted before engines were stopped and joined at exit
    long_text = tmp_path / "long.txt"
    long_text.write_text(" ".join(f"word{i}" for i in range(3000)))
    env = dict(os.environ, OLLAPY_DEBUG="1")
    for _ in range(3):
        c = pexpect.spawn("/bin/bash", ["-c", f"exec {sys.executable} -m ollapy.cli.main run {smollm2_path} "
                                              f"-o num_ctx=8192 'Summarise' < {long_text}"],
                          env=env, encoding="utf-8", timeout=90, cwd=str(ROOT))
        c.expect_exact("prompt tokens")  # the engine has started the request: prefill is running
        c.sendintr()
        c.expect(pexpect.EOF)
        c.close()
        assert c.signalstatus is None and c.exitstatus == 130, c.before[-2000:]
        assert "Traceback" not in c.before and "Exception ignored" not in c.before


def test_repl_save_creates_a_model_that_list_show_run_and_load_use(smollm2_path):
    """`/save NAME` makes a store model, as Ollama's does: FROM the current model, its system prompt, the
    session's parameters and the conversation as MESSAGEs; `run NAME` and `/load NAME` pick all of it up."""
    from ollapy.store.modelfile import parse_modelfile

    c = _start_repl(smollm2_path)
    _say(c, "/set parameter num_predict 7")
    _say(c, "/set system You are a pirate named Captain Zorblax.")
    _say(c, "My favourite city is Zanzibar. Say OK.")
    _say(c, "/save pirate", "Created new model 'pirate'")
    _bye(c)

    assert b"pirate:latest" in run_cli("list").stdout
    show = run_cli("show", "pirate", "--modelfile")
    assert show.returncode == 0, show.stderr
    mf = parse_modelfile(show.stdout.decode())
    assert mf.system == "You are a pirate named Captain Zorblax."
    assert mf.parameters["num_predict"] == 7 and mf.parameters["temperature"] == 0
    assert [m["role"] for m in mf.messages] == ["user", "assistant"]
    assert mf.messages[0]["content"] == "My favourite city is Zanzibar. Say OK." and mf.messages[1]["content"]

    r = run_cli("run", "pirate", "--verbose", "What is my favourite city?", env={"OLLAPY_DEBUG": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    err = r.stderr.decode()
    prompt = [ln for ln in err.splitlines() if "chat prompt" in ln][-1]
    assert "chat prompt (4 messages" in prompt and "Captain Zorblax" in prompt and "Zanzibar" in prompt
    n = int(re.search(r"^\s*eval count:\s+(\d+) token", err, re.M).group(1))
    assert n == 7, err[-1500:]  # greedy: the answer runs into the saved num_predict
    j = run_cli("run", "pirate", "--each-line", "--json", input="What is my favourite city?\n")
    assert j.returncode == 0, j.stderr[-1500:]
    rec = json.loads(j.stdout)
    assert (rec["eval_count"], rec["done_reason"]) == (7, "length"), rec
    assert r.stdout.strip()

    d = _start_repl(smollm2_path, "--verbose")
    _say(d, "/load nosuchmodel", "Couldn't find model 'nosuchmodel'")
    _say(d, "/load pirate", "Loading model 'pirate'")
    _say(d, "/show system", "You are a pirate named Captain Zorblax.")
    d.sendline("What is my favourite city?")
    d.expect(r"prompt eval count: +(\d+) token")
    assert int(d.match.group(1)) > 45  # system + saved turns + question (60); the question alone is about 35
    d.expect(r"\beval count: +(\d+) token")
    assert int(d.match.group(1)) == 7  # the saved num_predict again (the REPL does not print the done reason)
    d.expect_exact(">>> ")
    _bye(d)


def test_session_restores_options_and_explicit_option_wins(smollm2_path):
    def eval_count(p) -> int:
        assert p.returncode == 0, p.stderr
        return int(re.search(rb"^\s*eval count:\s+(\d+) token", p.stderr, re.M).group(1))

    story = "Write a very long story about a dragon."
    a = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=5", "--session", "opts",
                "--verbose", story)
    assert eval_count(a) == 5
    b = run_cli("run", str(smollm2_path), "--session", "opts", "--verbose", "Write another, longer one.")
    assert eval_count(b) == 5  # num_predict came back with the session
    c = run_cli("run", str(smollm2_path), "-o", "num_predict=9", "--session", "opts", "--verbose",
                "Write one more very long story.")
    assert eval_count(c) == 9  # -o wins over the saved value (greedy: the story runs into num_predict)
