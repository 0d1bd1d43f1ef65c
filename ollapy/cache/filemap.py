"""Copy-on-write views of cache files that hold no file descriptor (:func:`map_view`), and the restore buffer's
anonymous mapping, faulted in at once (:func:`populated`).

CPython's :class:`mmap.mmap` keeps a duplicate of the file descriptor it maps until the map is closed (for
``size()`` and ``resize()``); a RAM tier full of mapped blocks then holds one descriptor per block, past the usual
soft limit of 1,024, and ``accept()``, restores and writes fail with EMFILE (issue 53). Here a file is mapped with
libc's ``mmap(2)`` (``MAP_PRIVATE``: writable, copy-on-write, as ``mmap.ACCESS_COPY``) and its descriptor closed
at once: a mapping stays valid after its descriptor is closed and after the file is unlinked (POSIX).

Owner and bound of each native resource:

- the descriptor: this module's, closed before :func:`map_view` returns;
- the mapping: a ctypes array over its pages (:func:`_owner_type`) is the buffer every returned view and slice
  refers to; the array unmaps on garbage collection, when the last view of it is gone. Files smaller than
  :data:`MAP_MIN_BYTES` are read into a ``bytearray`` instead, so the mappings a process holds are bounded by the
  bytes it holds (the RAM tier's cap) over :data:`MAP_MIN_BYTES`, far under ``vm.max_map_count`` (65,530).

Where libc's ``mmap`` is not reachable (not Linux/glibc-like), :class:`mmap.mmap` is used as before.

:func:`populated` makes an anonymous mapping (an :class:`mmap.mmap`, its owner: unmapped when collected) and
faults its pages in with ``madvise(MADV_POPULATE_WRITE)`` through ctypes, which releases the GIL for the call;
``mmap``'s own ``MAP_POPULATE`` holds it (about 0.3 ms a MiB), stalling the remote tier's reader thread
(:mod:`ollapy.cache.remote_reader`) that receives the values a restore places into that buffer.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import os

#: files smaller than this are read into memory, not mapped (bounds the mappings by the bytes held)
MAP_MIN_BYTES = 256 * 1024

_MAP_FAILED = ctypes.c_void_p(-1).value


@functools.cache
def _libc():
    """libc's ``mmap`` and ``munmap`` through ctypes, or None where they cannot be found."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn_map, fn_unmap = libc.mmap, libc.munmap
    except (OSError, AttributeError):  # pragma: no cover - not a POSIX libc
        return None
    fn_map.restype = ctypes.c_void_p
    fn_map.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fn_unmap.restype = ctypes.c_int
    fn_unmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return fn_map, fn_unmap


MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault in (and zero) a range's pages for writing, in one call


@functools.cache
def _libc_madvise():
    """libc's ``madvise`` through ctypes, or None where it cannot be found."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):  # pragma: no cover - not a POSIX libc
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


def populated(size: int):
    """A writable anonymous mapping of ``size`` bytes (> 0) whose pages are faulted in at once: made lazily,
    then ``madvise(MADV_POPULATE_WRITE)`` (the GIL released); where that fails (a kernel before 5.14, not
    Linux) a ``MAP_POPULATE`` mapping, else a ``bytearray``."""
    anon = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20)
    try:
        buf = mmap.mmap(-1, size, flags=anon)
    except (OSError, ValueError):
        return bytearray(size)
    advise = _libc_madvise()
    if advise is not None and advise(ctypes.addressof(ctypes.c_char.from_buffer(buf)), size, MADV_POPULATE_WRITE) == 0:
        return buf
    buf.close()
    try:
        return mmap.mmap(-1, size, flags=anon | getattr(mmap, "MAP_POPULATE", 0))
    except (OSError, ValueError):
        return bytearray(size)


@functools.lru_cache(maxsize=256)
def _owner_type(size: int) -> type:
    """A ctypes byte-array type of ``size`` bytes whose instances unmap their pages when collected (one type per
    size, cached: a prompt cache's blocks come in few sizes)."""
    unmap = _libc()[1]

    class Mapping(ctypes.c_ubyte * size):
        __slots__ = ()

        def __del__(self) -> None:
            unmap(ctypes.addressof(self), size)

    return Mapping


def map_view(fd: int, size: int) -> memoryview:
    """A writable copy-on-write view of the first ``size`` bytes of open file ``fd`` (format ``B``).

    ``fd`` stays the caller's (close it after the call: the view does not need it). Files under
    :data:`MAP_MIN_BYTES` are read (``os.pread``) into a ``bytearray``. Raises OSError when the file cannot be
    mapped or read whole; ValueError for ``size`` 0 (nothing to map).
    """
    if size <= 0:
        raise ValueError("cannot map an empty file")
    fns = _libc()
    if size < MAP_MIN_BYTES or fns is None:
        if fns is None and size >= MAP_MIN_BYTES:  # pragma: no cover - no libc mmap: CPython's (keeps a dup'd fd)
            return memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_COPY))
        buf = bytearray(size)
        n = os.preadv(fd, [buf], 0)
        if n != size:
            raise OSError(f"short read: {n} of {size} bytes")
        return memoryview(buf)
    addr = fns[0](None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap failed: {os.strerror(err)}")
    return memoryview(_owner_type(size).from_address(addr)).cast("B")
