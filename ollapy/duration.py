"""The one parser of Go-style durations (``OLLAPY_KEEP_ALIVE``, a request's ``keep_alive``).

Accepted forms:

* a bare number, in seconds: ``300``, ``1.5``, ``0``, ``-1`` (anything Python's
  ``float`` reads, except ``nan`` and ``inf``);
* a Go duration: an optional sign and one or more ``<number><unit>`` parts,
  e.g. ``5m``, ``1h30m``, ``300ms``, ``.5s``, ``-1m``. Units: ``ns``, ``us``
  (or ``µs``), ``ms``, ``s``, ``m``, ``h``.

A negative value means "forever" where the caller allows it, as in Ollama.
Nothing here knows which setting or request field the text came from; the
callers turn :class:`ValueError` into their own one-line error.
"""
from __future__ import annotations

import math
import re

_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _go_duration_seconds(text: str) -> float:
    """Seconds for a signed Go duration such as ``-1h30m``; raises ValueError."""
    sign = -1.0 if text[:1] == "-" else 1.0
    body = text[1:] if text[:1] in ("-", "+") else text
    pos, secs = 0, 0.0
    for m in _PART.finditer(body):
        if m.start() != pos:
            break
        secs += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not body or pos != len(body):
        raise ValueError(f"{text!r} is not a duration")
    return sign * secs


def parse_duration(value: str | int | float, *, allow_negative: bool = False) -> float:
    """Seconds (a float >= 0, or ``math.inf``) for a duration given as text or as a number of seconds.

    ``value``: text such as ``"5m"``, ``"1h30m"``, ``"300ms"``, ``"90"``, ``"-1"``
    (surrounding white space is ignored) or an int/float of seconds.
    ``allow_negative``: when true, a negative value means "forever" and the
    result is ``math.inf``; when false, a negative value is an error.

    Raises ValueError for empty text, an unknown unit or form (``"5x"``,
    ``"m5"``, ``"1h-3m"``), ``nan``/``inf``, a bool, or a negative value
    when ``allow_negative`` is false.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        try:
            secs = float(value)
        except OverflowError:  # an int too large for a float
            raise ValueError(f"{value!r} is too large for a duration") from None
    else:
        text = str(value).strip()
        try:
            secs = float(text)
        except ValueError:
            secs = _go_duration_seconds(text)
    if not math.isfinite(secs):
        raise ValueError(f"{value!r} is not a finite duration")
    if secs < 0:
        if not allow_negative:
            raise ValueError(f"{value!r} is negative")
        return math.inf
    return secs
