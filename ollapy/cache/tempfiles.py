"""Temporary file names of the prompt cache's writers, and when a temporary file left behind may be deleted.

A state file is written under a temporary name in its own directory and
renamed into place (:func:`ollapy.fsutil.write_atomically`). The name says who
writes it::

    .tmp-<pid>-<space>-<writer>-<random>.kv

* ``pid``: the writing process;
* ``space``: 8 hex digits naming the pid space the pid belongs to: a hash of
  the host name, the kernel's boot id and the inode of the process's pid
  namespace. Two containers on one host, or one host before and after a
  reboot, have different spaces; a pid is only meaningful inside its space;
* ``writer``: 6 hex digits unique to one :class:`~ollapy.cache.writer.CacheWriter`.
  Two models on one GGUF file share a directory; a writer that gives up
  (timeout, Ctrl-C) deletes only the files with its own prefix, never a
  sibling writer's.

Reaping (:func:`reapable`), decided without comparing clocks of different
machines (replicas on other hosts may share the directory over network
storage, and their clocks may disagree with ours by minutes):

1. a temporary file of this pid space is deleted as soon as its process is
   gone (``kill(pid, 0)`` fails);
2. any other temporary file (and one of this space whose pid was reused) (another host, another container, an older
   ollapy's ``.tmp-<pid>-<random>`` name) is deleted only when the directory's
   own mtime is more than :data:`ORPHAN_S` later than the file's mtime. Both
   times are stamped by the same file system (the file server, for network
   storage), and the directory's mtime moves whenever any process creates,
   renames or deletes a file in it, so "the directory has seen an hour of
   activity since this file last grew" holds whatever the local clock says.
   A live writer finishes a file in seconds.
"""
from __future__ import annotations

import functools
import hashlib
import os
import socket

TMP_PREFIX = ".tmp-"
ORPHAN_S = 3600.0


@functools.lru_cache(maxsize=1)
def pid_space() -> str:
    """8 hex digits naming this process's pid namespace on this boot of this host."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            parts.append(f.read().strip())
    except OSError:
        pass
    try:
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        pass
    return hashlib.blake2b("\0".join(parts).encode("utf-8", "surrogateescape"), digest_size=4).hexdigest()


def writer_prefix() -> str:
    """A new writer's temporary-name prefix: ``.tmp-<pid>-<space>-<writer>-`` (see the module docstring)."""
    return f"{TMP_PREFIX}{os.getpid()}-{pid_space()}-{os.urandom(3).hex()}-"


def owner(name: str) -> tuple[int, str] | None:
    """``(pid, space)`` of a temporary file name in the current format; None for any other name."""
    if not name.startswith(TMP_PREFIX):
        return None
    parts = name[len(TMP_PREFIX):].split("-")
    if len(parts) < 4 or not parts[0].isdigit() or len(parts[1]) != 8:
        return None
    return int(parts[0]), parts[1]


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` exists in this pid space."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def reapable(name: str, mtime: float, dir_mtime: float) -> bool:
    """True when the temporary file ``name`` (modified at ``mtime``) in a directory modified at ``dir_mtime``
    was left by a writer that is gone (rules in the module docstring)."""
    who = owner(name)
    if who is not None and who[1] == pid_space() and who[0] != os.getpid() and not pid_alive(who[0]):
        return True
    return dir_mtime - mtime > ORPHAN_S  # also a file of this space whose pid was reused
