"""Subprocess tests of ``ollapy run`` on real models: one-shot, pipes, no escape codes, bad input."""
from __future__ import annotations

import json
import re

import pytest
from conftest import run_cli

Q = "What is the capital of France? Answer in one word."


def test_one_shot_prints_answer_and_exits_0(smollm2_path):
    p = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "repeat_penalty=1", Q)
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"The capital of France is Paris.\n"
    assert b"\x1b" not in p.stdout + p.stderr and b"\r" not in p.stdout + p.stderr


def test_piped_stdin_without_newline(smollm2_path):
    p = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "repeat_penalty=1", input=Q)
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"The capital of France is Paris.\n"


def test_stdin_goes_before_prompt_args(smollm2_path):
    p = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=30", "--verbose",
                "Answer in one word.", input="What is the capital of France?\n", env={"OLLAPY_DEBUG": "1"})
    assert p.returncode == 0, p.stderr
    err = p.stderr.decode()
    prompt = next(ln for ln in err.splitlines() if "chat prompt" in ln)
    assert prompt.index("What is the capital of France?") < prompt.index("Answer in one word.")
    assert "prompt eval count:" in err and "eval rate:" in err
    assert p.stdout.strip()


def test_empty_stdin_with_prompt_and_invalid_utf8(smollm2_path):
    p = run_cli("run", str(smollm2_path), "-o", "temperature=0", Q, input=b"")
    assert p.returncode == 0 and b"Paris" in p.stdout
    p = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=8", input=b"caf\xe9 \xff\xfe hello")
    assert p.returncode == 0, p.stderr
    assert b"not valid UTF-8" in p.stderr
    assert b"Traceback" not in p.stderr
    # the same bytes as an argument (argv holds them as lone surrogates, PEP 383): once a UnicodeEncodeError
    p = run_cli("run", str(smollm2_path), "-o", "num_predict=4", "caf\udce9 \udcff hello")  # b"caf\xe9 \xff hello"
    assert p.returncode == 0 and b"prompt arguments are not valid UTF-8" in p.stderr, p.stderr


def test_gemma_runs_with_fallback_template(gemma_path):
    greedy = ("run", str(gemma_path), "-o", "temperature=0", "-o", "num_predict=12")
    p = run_cli(*greedy, "--verbose", "The capital of France is")
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.strip()) > 0
    n = int(re.search(rb"^\s*eval count:\s+(\d+) token", p.stderr, re.M).group(1))  # not "prompt eval count"
    assert n == 12, p.stderr  # greedy: the base model's continuation has no EOS before num_predict
    # the same request as a JSON line also says why it stopped
    j = run_cli(*greedy, "--each-line", "--json", input="The capital of France is\n")
    assert j.returncode == 0, j.stderr
    rec = json.loads(j.stdout)
    assert (rec["eval_count"], rec["done_reason"]) == (12, "length"), rec


@pytest.mark.parametrize("kind", ["missing", "truncated", "not_gguf", "directory"])
def test_bad_model_files_give_one_line_error(tmp_path, smollm2_path, kind):
    if kind == "missing":
        target = tmp_path / "nope.gguf"
    elif kind == "truncated":
        target = tmp_path / "trunc.gguf"
        with open(smollm2_path, "rb") as f:
            target.write_bytes(f.read(1_000_000))
    elif kind == "not_gguf":
        target = tmp_path / "text.gguf"
        target.write_text("hello, not a model\n")
    else:
        target = tmp_path / "dir.gguf"
        target.mkdir()
    p = run_cli("run", str(target), "hi")
    assert p.returncode == 1, (p.returncode, p.stderr)
    err = p.stderr.decode()
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), err


def test_unknown_option_is_usage_error(smollm2_path):
    p = run_cli("run", str(smollm2_path), "-o", "temprature=0", "hi")
    assert p.returncode == 2
    assert b"unknown option 'temprature'" in p.stderr and b"temperature" in p.stderr
    p = run_cli("run", str(smollm2_path), "-o", "num_ctx=abc", "hi")
    assert p.returncode == 2 and b"num_ctx" in p.stderr


def test_format_json_schema_output_parses(smollm2_path, tmp_path):
    import json

    schema = tmp_path / "person.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"name": {"type": "string"},
                                  "age": {"type": "integer"}}, "required": ["name", "age"]}))
    p = run_cli("run", str(smollm2_path), "--format", str(schema), "-o", "temperature=0", "-o", "num_predict=200",
                "Give the name and age of a person as JSON.")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout.decode())
    assert isinstance(data["name"], str) and isinstance(data["age"], int)


def test_format_json_starts_an_object(smollm2_path):
    p = run_cli("run", str(smollm2_path), "--format", "json", "-o", "temperature=0", "-o", "num_predict=10", "Hi")
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().lstrip().startswith(("{", "["))


def _pipe_env() -> dict:
    import os

    env = dict(os.environ)
    env.pop("OLLAPY_DEBUG", None)
    return env


def test_stdout_closed_by_head_exits_141_quietly(smollm2_path, tmp_path):
    """`run ... | head -1`: generation stops, nothing on stderr, exit 141 (as `yes | head -1`), one-shot and batch."""
    import shlex
    import subprocess
    import sys

    from conftest import ROOT

    py, model = shlex.quote(sys.executable), shlex.quote(str(smollm2_path))
    err = tmp_path / "err"
    ask = "'List twenty fruits, one per line.'"  # a greedy answer of many lines: the 2nd write finds the pipe closed
    cmd = (f"{py} -m ollapy.cli.main run {model} -o temperature=0 -o num_predict=200 {ask} 2>{err} "
           f"| head -1; exit ${{PIPESTATUS[0]}}")
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, env=_pipe_env(), cwd=str(ROOT), timeout=300)
    assert err.read_bytes() == b""
    assert p.returncode == 141, p
    assert len(p.stdout.splitlines()) == 1 and p.stdout.strip()
    cmd = (f"printf 'List twenty fruits, one per line.\\nList twenty animals, one per line.\\n' "
           f"| {py} -m ollapy.cli.main run {model} --each-line --parallel 1 -o temperature=0 -o num_predict=100 2>{err} "
           f"| head -1; exit ${{PIPESTATUS[1]}}")
    # (one slot: the 2nd answer is generated after the 1st is written, so `head` has gone by then)
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, env=_pipe_env(), cwd=str(ROOT), timeout=300)
    assert err.read_bytes() == b""
    assert p.returncode == 141, p
    assert len(p.stdout.splitlines()) == 1


def test_json_without_each_line_is_usage_error(smollm2_path):
    p = run_cli("run", str(smollm2_path), "--json", "hi")
    assert p.returncode == 2
    lines = p.stderr.decode().splitlines()
    assert len(lines) == 1 and "--each-line" in lines[0] and lines[0].startswith("Error: "), lines
    assert p.stdout == b""


def test_each_line_one_output_line_per_input_line_escaped(smollm2_path):
    from ollapy.cli.batch import escape_answer

    prompts = ["Write a poem about the sea in four short lines.", "", "List three colours, one per line.",
               "What is the capital of France? Answer in one word.", "   "]
    p = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=60", "--each-line",
                input="\n".join(prompts) + "\n")
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    assert out.endswith("\n") and "\r" not in out and "\t" not in out
    lines = out[:-1].split("\n")
    assert len(lines) == len(prompts), lines
    assert lines[1] == "" and lines[4] == ""  # blank input line: empty output line
    assert "\\n" in lines[0] and "\\n" in lines[2]  # multi-line answers stay on their line
    assert "Paris" in lines[3]
    assert escape_answer("a\\b\nc\r\td") == "a\\\\b\\nc\\r\\td"
    # --json: one record per input line too, indexed by input line; the plain line is its escaped response
    j = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=60", "--each-line", "--json",
                input="\n".join(prompts) + "\n")
    recs = [json.loads(x) for x in j.stdout.decode().splitlines()]
    assert [r["index"] for r in recs] == list(range(len(prompts)))
    assert recs[1] == {"index": 1, "prompt": "", "response": "", **BLANK_STATS}
    assert recs[4] == {"index": 4, "prompt": "   ", "response": "", **BLANK_STATS}
    assert set(recs[1]) == set(recs[0])  # a blank line's object has the keys of an answered one
    assert escape_answer(recs[3]["response"]) == lines[3]


BLANK_STATS = {"done_reason": "stop", "load_duration": 0, "prompt_eval_count": 0, "prompt_eval_duration": 0,
               "prompt_cache_tokens": 0, "eval_count": 0, "eval_duration": 0, "total_duration": 0, "truncated": False,
               "shifts": 0, "prompt_cache_source": "none"}


def test_each_line_json_of_blank_lines_only_needs_no_model():
    p = run_cli("run", "no-such-model", "--each-line", "--json", input="\n \t\n")
    assert p.returncode == 0, p.stderr
    recs = [json.loads(x) for x in p.stdout.decode().splitlines()]
    assert recs == [{"index": 0, "prompt": "", "response": "", **BLANK_STATS},
                    {"index": 1, "prompt": " \t", "response": "", **BLANK_STATS}]


def test_each_line_verbose_prints_stats_per_line(smollm2_path):
    p = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=8", "--each-line", "--verbose",
                "--json", input="Say hi.\n\nSay bye.\n")
    assert p.returncode == 0, p.stderr
    err = p.stderr.decode()
    assert re.findall(r"^line (\d+):$", err, re.M) == ["1", "3"], err
    assert err.count("prompt eval count:") == 2 and err.count("eval rate:") == 4  # "prompt eval rate" + "eval rate"
    counts = [int(re.search(r"^eval count:\s+(\d+) token", block, re.M).group(1)) for block in err.split("line ")[1:]]
    assert counts == [8, 8], err  # greedy: both answers run into num_predict
    recs = [json.loads(x) for x in p.stdout.decode().splitlines()]
    assert [(recs[i]["eval_count"], recs[i]["done_reason"]) for i in (0, 2)] == [(8, "length")] * 2, recs
    # the model loaded once, before line 1: its load duration is in line 1's block only (not 0.000µs in line 3's)
    blocks = err.split("line ")[1:]
    assert re.search(r"^load duration:\s+(\S+)$", blocks[0], re.M).group(1) != "0.000µs", err
    assert "load duration" not in blocks[1] and err.count("load duration:") == 1, err
    assert recs[0]["load_duration"] > 0 and recs[2]["load_duration"] == 0


def test_verbose_prompt_eval_rate_counts_only_the_tokens_evaluated():
    """A cache hit reuses most of the prompt: the rate is the evaluated tokens over the prefill time."""
    from ollapy.cli.output import format_stats

    m = {"total_duration": 2 * 10**9, "load_duration": 0, "prompt_eval_count": 2661, "prompt_cache_tokens": 2560,
         "prefix_source": "cache disk", "prompt_eval_duration": 50 * 10**6, "eval_count": 4,
         "eval_duration": 10**8}
    text = format_stats(m)
    assert "prompt eval rate:     2020.00 tokens/s" in text  # 101 tokens in 50 ms, not 2661 tokens
    assert "prompt cache:         2560 token(s) reused (cache disk)" in text


def test_verbose_prompt_eval_says_new_and_cached_tokens_and_rates_no_handful():
    """After a cache hit ``--verbose`` splits the prompt into evaluated and reused tokens; a rate over fewer than
    MIN_RATED_TOKENS evaluated tokens is ``n/a``, not a number."""
    from ollapy.cli.output import MIN_RATED_TOKENS, format_stats

    hit = {"total_duration": 2 * 10**9, "load_duration": 0, "prompt_eval_count": 3043, "prompt_cache_tokens": 3042,
           "prefix_source": "slot", "prompt_eval_duration": 19 * 10**6, "eval_count": 4, "eval_duration": 10**8}
    lines = format_stats(hit).splitlines()
    assert "prompt eval count:    3043 token(s) (1 new, 3042 from the cache)" in lines, lines
    assert "prompt eval rate:     n/a (1 new token: too few to rate)" in lines, lines
    assert "tokens/s" not in "".join(x for x in lines if x.startswith("prompt eval rate"))
    assert re.search(r"^prompt eval count: +(\d+) token", "\n".join(lines), re.M).group(1) == "3043"  # parsers
    few = {**hit, "prompt_cache_tokens": 3043 - (MIN_RATED_TOKENS - 1)}
    assert f"n/a ({MIN_RATED_TOKENS - 1} new tokens: too few to rate)" in format_stats(few)
    enough = {**hit, "prompt_cache_tokens": 3043 - MIN_RATED_TOKENS, "prompt_eval_duration": 10**9}
    assert f"prompt eval rate:     {MIN_RATED_TOKENS:.2f} tokens/s" in format_stats(enough)
    cold = {**hit, "prompt_cache_tokens": 0, "prompt_eval_duration": 10**9}
    text = format_stats(cold)
    assert "prompt eval count:    3043 token(s)\n" in text and "prompt eval rate:     3043.00 tokens/s" in text


def test_run_help_names_its_arguments_in_capitals():
    """``run --help`` reads as Ollama's ``ollama run MODEL [PROMPT]``: no ``{model}`` placeholder."""
    p = run_cli("run", "--help")
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    usage = out.splitlines()[0]
    assert usage.endswith(" run [OPTIONS] MODEL [PROMPT...]"), usage
    assert "{" not in out and re.search(r"^  MODEL +Model name", out, re.M), out
    assert re.search(r"^  PROMPT\.\.\. +Prompt", out, re.M), out


def test_every_usage_line_names_its_arguments_as_click_does():
    """No command's usage line carries typer's ``{name}`` braces: ``pull [OPTIONS] NAME``, ``rm ... NAMES...``,
    ``cache ls [OPTIONS] [MODEL]``."""
    import click
    import typer

    from ollapy.cli.main import app

    root = typer.main.get_command(app)
    seen = {}

    def walk(cmd, path):
        ctx = click.Context(cmd, info_name=path)
        seen[path] = cmd.get_usage(ctx)
        for name in getattr(cmd, "list_commands", lambda _c: [])(ctx):
            walk(cmd.get_command(ctx, name), f"{path} {name}")

    walk(root, "ollapy")
    assert len(seen) > 15, seen
    assert not [u for u in seen.values() if "{" in u or "}" in u], seen
    assert seen["ollapy pull"].endswith("pull [OPTIONS] NAME"), seen["ollapy pull"]
    assert seen["ollapy rm"].endswith("rm [OPTIONS] NAMES..."), seen["ollapy rm"]
    assert seen["ollapy cache ls"].endswith("ls [OPTIONS] [MODEL]"), seen["ollapy cache ls"]
