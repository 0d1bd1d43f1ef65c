"""``run --each-line``: every input line is its own prompt, run concurrently over the slots, printed in order."""
from __future__ import annotations

import json
import sys

from ..errors import describe
from .output import warn


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


def run_each_line(conv, lines: list[str], suffix: str, settings, as_json: bool) -> None:
    """Submit every line at once (the engine queues what exceeds the slots) and print answers in input order.

    A shared ``--system`` prompt is the same prefix for every request, so the
    engine copies its KV between slots (or the prompt cache serves it) instead
    of prefilling it once per line.
    """
    streams = []
    for i, line in enumerate(lines):
        text = f"{line}\n\n{suffix}" if suffix else line
        msgs = conv.chat_messages(text, settings.system)
        stream = conv.runner.chat(msgs, conv.options, fmt=settings.fmt, cache=settings.cache)
        if i == 0 and len(lines) > 1:
            # let the first request prefill the shared prefix (system prompt, template header) alone, so the
            # others copy its KV in-context instead of all prefilling it at once
            stream = _Peeked(stream)
        streams.append(stream)
    failed = 0
    try:
        for i, (line, stream) in enumerate(zip(lines, streams)):
            parts, final, error = [], None, None
            try:
                for c in stream:
                    parts.append(c.text)
                    if c.done:
                        final = c
            except Exception as exc:  # noqa: BLE001 - report per line, keep going
                error = describe(exc)
                failed += 1
            answer = "".join(parts).strip()
            if as_json:
                rec = {"index": i, "prompt": line, "response": answer}
                if final is not None:
                    m = final.metrics.as_dict() if hasattr(final.metrics, "as_dict") else dict(final.metrics or {})
                    rec.update(done_reason=final.done_reason, **m)
                if error:
                    rec["error"] = error
                sys.stdout.write(json.dumps(rec, ensure_ascii=False) + "\n")
            else:
                sys.stdout.write((answer if not error else "") + "\n")
                if error:
                    warn(f"line {i + 1}: {error}")
            sys.stdout.flush()
    except KeyboardInterrupt:
        for s in streams:
            s.cancel()
        raise
    if failed:
        raise SystemExit(1)
