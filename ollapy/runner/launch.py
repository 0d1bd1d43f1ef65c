"""How a runner child is started: an isolated interpreter that imports nothing from the user's working directory.

``python -m ollapy.runner.child`` would put the working directory first on
``sys.path``, so a ``queue.py`` or ``logging.py`` wherever the user started
ollapy (``/tmp``, a project checkout) would run inside the child. The child is
started instead as ``python -I -c BOOTSTRAP ollapy.runner.child FD NAME``:

* ``-I`` (isolated mode): no working directory or script directory on
  ``sys.path``, no ``PYTHON*`` variables, no user site-packages;
* :data:`BOOTSTRAP` then sets ``sys.path`` to :func:`import_path`, the
  parent's own import path (so the child imports this very ollapy and the
  parent's packages, user site included) without ``""`` or the working
  directory, and calls :func:`ollapy.runner.child.run`;
* the child's working directory is :data:`NEUTRAL_CWD` (``/``), so a relative
  path never reaches the user's directory either.

``ollapy.runner.child`` stays a separate argument so that ``ps`` shows which
model a child serves (``... ollapy.runner.child FD NAME``).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

NEUTRAL_CWD = os.path.abspath(os.sep)
PATH_VARIABLE = "OLLAPY_RUNNER_SYS_PATH"  # the import path handed to the child (read once by BOOTSTRAP)
BOOTSTRAP = ("import json,os,sys;sys.path[:]=json.loads(os.environ.pop('OLLAPY_RUNNER_SYS_PATH'));"
             "from ollapy.runner.child import run;run(sys.argv[2:])")
PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # the directory that holds this ollapy


def import_path(cwd: str | None = None) -> list[str]:
    """The child's ``sys.path``: the directory of this ollapy first, then the parent's ``sys.path`` in order,
    absolute, without ``""``, ``"."`` or the working directory ``cwd`` (default: the parent's)."""
    cwd = os.path.abspath(cwd or os.getcwd())
    out = [PACKAGE_ROOT]
    for entry in sys.path:
        if entry in ("", "."):
            continue
        full = os.path.abspath(entry)
        if full == cwd and full != PACKAGE_ROOT:
            continue
        if full not in out:
            out.append(full)
    return out


def child_command(name: str, fd: int) -> list[str]:
    """The child's argv: the isolated interpreter, :data:`BOOTSTRAP`, then ``ollapy.runner.child FD NAME``."""
    return [sys.executable, "-I", "-c", BOOTSTRAP, "ollapy.runner.child", str(fd), name]


# directory settings the child reads: a relative one is made absolute against the parent's working directory
PATH_SETTINGS = ("OLLAPY_MODELS", "OLLAPY_CACHE_DIR", "OLLAMA_MODELS", "XDG_DATA_HOME", "XDG_CACHE_HOME",
                 "XDG_STATE_HOME", "HF_HOME", "HF_HUB_CACHE")


def child_environment() -> dict[str, str]:
    """The child's environment: the parent's, with :data:`PATH_SETTINGS` made absolute (the child runs in
    :data:`NEUTRAL_CWD`), ``GGML_NO_BACKTRACE=1`` (ggml would run gdb on an abort) and :data:`PATH_VARIABLE`
    holding :func:`import_path` as JSON."""
    env = dict(os.environ, GGML_NO_BACKTRACE="1", **{PATH_VARIABLE: json.dumps(import_path())})
    for key in PATH_SETTINGS:
        value = env.get(key)
        if value and not os.path.isabs(os.path.expanduser(value)):
            env[key] = os.path.abspath(value)
    return env
