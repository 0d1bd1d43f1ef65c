"""``run --each-line``: every input line is its own prompt, run concurrently over the slots, printed in order.

Output is exactly one line per input line, in input order, so a shell loop
(``while IFS= read -r line``) can pair answers with prompts:

* plain: the answer (leading/trailing blanks stripped) with a backslash written
  as ``\\\\``, a newline as ``\\n``, a carriage return as ``\\r`` and a tab as
  ``\\t`` (:func:`escape_answer`); a blank input line gives an empty output line
  and no model call; a failed line gives an empty line and a warning on stderr.
* ``--json``: one JSON object per input line (``index`` = 0-based input line,
  ``prompt``, ``response``, ``thinking`` (a thinking model's reasoning, when it reasoned and
  ``--hidethinking`` is off), ``done_reason`` and the stats under the API's names (``prompt_cache_tokens``,
  ``prompt_cache_source``...), or ``error``).
  Plain lines carry the answer only: a thinking model's reasoning is left out. A
  blank line's object has the same keys: ``done_reason`` ``"stop"`` and zero
  stats (nothing was generated).

With ``--verbose`` each answered line's stats go to stderr as one block headed
``line N:`` (1-based), the same fields ``run --verbose`` prints for one answer,
except that ``load duration`` (the model loads once, before the first answer)
is printed in the first block only, or in a later one that reports a load of
its own (a server may).
"""
from __future__ import annotations

import json
import sys

from ollapy.cli.output import OutputClosed, format_stats, info, warn, write_out
from ollapy.engine.request import Metrics
from ollapy.errors import describe

_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def escape_answer(text: str) -> str:
    """One answer as one output line: ``\\`` -> ``\\\\``, newline -> ``\\n``, CR -> ``\\r``, tab -> ``\\t``.

    Reversible (``printf '%b'`` or Python's ``codecs.decode(s, "unicode_escape")`` for ASCII text).
    """
    return text.translate(_ESCAPES)


def split_lines(text: str) -> list[str]:
    """Input lines as a shell's ``read`` sees them: split at ``\\n`` only (a final newline ends the last line,
    it does not start an empty one); a trailing ``\\r`` (CRLF files) is dropped."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


class _Peeked:
    """A stream whose first chunk has already been read (the prefill is done); replays it."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.it = iter(stream)
        self.head = []
        try:
            self.head.append(next(self.it))
        except StopIteration:
            pass
        except Exception as exc:  # noqa: BLE001 - re-raised when read
            self.head.append(exc)

    def __iter__(self):
        for c in self.head:
            if isinstance(c, BaseException):
                raise c
            yield c
        yield from self.it

    def cancel(self) -> None:
        self.stream.cancel()


def _metrics(final) -> dict:
    if final is None or final.metrics is None:
        return {}
    return final.metrics.as_dict() if hasattr(final.metrics, "as_dict") else dict(final.metrics)


def _json_stats(m: dict) -> dict:
    """A request's metrics under the API's names: where the reused prompt tokens came from is
    ``prompt_cache_source`` (``none`` when none were), as the server's final objects call it."""
    out = {k: v for k, v in m.items() if k != "prefix_source"}
    if m:
        out["prompt_cache_source"] = m.get("prefix_source") or "none"
    return out


def _blank_record(i: int, line: str) -> dict:
    """The ``--json`` object of a blank input line: the keys of an answered one, nothing generated."""
    return {"index": i, "prompt": line, "response": "", "done_reason": "stop",
            **_json_stats(Metrics(prefix_source="none").as_dict())}


def run_each_line(conv, lines: list[str], suffix: str, settings, as_json: bool) -> None:
    """Submit every non-blank line at once (the engine queues what exceeds the slots); print one line per input
    line in input order (see the module docstring for the format).

    ``conv`` may be None when every line is blank. A shared ``--system``
    prompt is the same prefix for every request, so the engine copies its KV
    between slots (or the prompt cache serves it) instead of prefilling it once
    per line. Raises OutputClosed (after cancelling every request) when stdout's
    reader goes away, SystemExit(1) after the last line when any line failed.
    """
    streams: list = []
    first = True
    n_prompts = sum(1 for ln in lines if ln.strip())
    for line in lines:
        if not line.strip():
            streams.append(None)
            continue
        text = f"{line}\n\n{suffix}" if suffix else line
        msgs = conv.chat_messages(text, settings.system)
        stream = conv.runner.chat(msgs, conv.options, fmt=settings.fmt, cache=settings.cache, think=settings.think)
        if first and n_prompts > 1:
            # let the first request prefill the shared prefix (system prompt, template header) alone, so the
            # others copy its KV in-context instead of all prefilling it at once
            stream = _Peeked(stream)
        first = False
        streams.append(stream)
    failed = 0
    load_shown = False
    try:
        for i, (line, stream) in enumerate(zip(lines, streams)):
            parts, thinking, final, error = [], [], None, None
            if stream is not None:
                try:
                    for c in stream:
                        parts.append(c.text)
                        thinking.append(getattr(c, "thinking", "") or "")
                        if c.done:
                            final = c
                except Exception as exc:  # noqa: BLE001 - report per line, keep going
                    error = describe(exc)
                    failed += 1
            answer = "".join(parts).strip()
            m = _metrics(final)
            if as_json:
                if stream is None:
                    rec = _blank_record(i, line)
                else:
                    rec = {"index": i, "prompt": line, "response": answer}
                    reasoning = "".join(thinking).strip()
                    if reasoning and not settings.hidethinking:
                        rec["thinking"] = reasoning
                    if final is not None:
                        rec.update(done_reason=final.done_reason, **_json_stats(m))
                if error:
                    rec["error"] = error
                write_out(sys.stdout, json.dumps(rec, ensure_ascii=False) + "\n")
            else:
                write_out(sys.stdout, (escape_answer(answer) if not error else "") + "\n")
            if error:
                warn(f"line {i + 1}: {error}")
            elif m and settings.verbose:
                info(f"line {i + 1}:\n" + format_stats(m, with_load=not load_shown or m.get("load_duration", 0) > 0))
                load_shown = True
    except (KeyboardInterrupt, OutputClosed):
        for s in streams:
            if s is not None:
                s.cancel()
        raise
    if failed:
        raise SystemExit(1)
