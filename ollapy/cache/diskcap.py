"""The disk tier's files as a whole: listing, usage, the byte cap, and collecting blocks nothing references.

Entries (``<root>/v2/<model>-<salt>/<name>.kv``) reference blocks
(:mod:`ollapy.cache.blocks`) by name; a block file lives while an entry file
names it. :func:`enforce_disk_cap` evicts entries least valuable first (leaf
entries before the prefixes other entries extend, never-hit before hit,
oldest last use first; pinned entries never, so their blocks stay), deleting
each block its last entry let go, and first the blocks nothing references.
Files of a format or version this code does not know are counted but never
deleted.
"""
from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path

from ollapy.cache.blocks import BLOCK_SUFFIX, BLOCK_TOKENS, GRACE_S, collect_blocks, delete_block, iter_block_files
from ollapy.cache.fileformat import SUFFIX, TMP_PREFIX, CacheFileError, UnknownFormat, read_header
from ollapy.cache.tempfiles import reapable

log = logging.getLogger("ollapy.cache")

LAYOUT = "v2"
PIN = ".pin"
HIT = ".hit"


def unlink_quietly(p: Path) -> None:
    """Delete ``p``; a missing file is fine, other errors are logged at debug level."""
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.debug("could not delete %s: %s", p, exc)


def delete_entry_files(path: Path, keep_pin: bool = False) -> None:
    """Delete a state file and its sidecars (missing files are fine)."""
    unlink_quietly(path)
    unlink_quietly(path.with_suffix(HIT))
    if not keep_pin:
        unlink_quietly(path.with_suffix(PIN))


def _reap_temp(f: os.DirEntry, dir_mtime: float) -> None:
    try:
        mtime = f.stat().st_mtime
    except OSError:
        return
    if reapable(f.name, mtime, dir_mtime):  # a writer killed mid-write
        unlink_quietly(Path(f.path))


def model_dirs(root: Path) -> list[Path]:
    """The per-(model, salt) directories under ``root``'s layout."""
    try:
        return [Path(d.path) for d in os.scandir(root / LAYOUT) if d.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def iter_state_files(root: Path):
    """Yield ``(path, stat, pinned, hit)`` for every entry file under ``root`` (all models); reaps orphaned temp files."""
    for d in model_dirs(root):
        yield from iter_state_files_in(d, reap=True)


def entry_blocks(path: Path) -> tuple[str, ...] | None:
    """The block names entry file ``path`` references; None for a file of an unknown format (never ours to delete).

    A file that vanished or fails a check references nothing.
    """
    try:
        return read_header(path).blocks
    except UnknownFormat:
        return None
    except (OSError, CacheFileError):
        return ()


def _leaf(chain: tuple[str, ...], inner: set[str]) -> bool:
    return not chain or chain[-1] not in inner


def enforce_disk_cap(root: Path, cap: int, protect: set[str] = frozenset(), now: float | None = None) -> list[Path]:
    """Delete unpinned entry files and the blocks they alone referenced until all files total ≤ ``cap``.

    Order (module docstring): blocks nothing references, then entries:
    ``protect`` (just written) last, never-hit before hit, leaf before inner,
    oldest mtime first. Every block goes by the one rule of
    :func:`~ollapy.cache.blocks.delete_block` (still the listed file, untouched since, older than its grace):
    the reference counts come from a listing another process may have outdated, so a block an evicted entry
    alone named may be one a writer elsewhere has just touched for its new entry. Such blocks stay (the cap is
    then exceeded by at most the blocks touched within the grace). ``now``: the clock the grace is measured
    against (tests). Returns the deleted entry paths.
    """
    files = list(iter_state_files(root))
    blocks = {d: {p.name[: -len(BLOCK_SUFFIX)]: (p, st) for p, st in iter_block_files(d)}
              for d in {p.parent for p, *_ in files} | set(model_dirs(root))}
    total = sum(st.st_size for _, st, _, _ in files) + sum(s.st_size for bd in blocks.values() for _, s in bd.values())
    if total <= cap:
        return []
    chains = {p: entry_blocks(p) for p, *_ in files}
    refs: dict[Path, Counter] = {d: Counter() for d in blocks}
    for p, chain in chains.items():
        refs.setdefault(p.parent, Counter()).update(chain or ())
    for d in blocks:  # blocks nothing references first
        total -= collect_blocks(d, set(refs[d]), grace=GRACE_S, now=now)
    inner = {n for c in chains.values() if c for n in c[:-1]}
    victims = sorted((f for f in files if not f[2] and chains[f[0]] is not None),
                     key=lambda f: (f[0].name in protect, f[3], not _leaf(chains[f[0]], inner), f[1].st_mtime))
    deleted = []
    for path, st, _, _ in victims:
        if total <= cap:
            break
        delete_entry_files(path)
        total -= st.st_size
        deleted.append(path)
        d = path.parent
        for name in chains[path]:
            refs[d][name] -= 1
            if refs[d][name] <= 0 and name in blocks.get(d, {}):
                bpath, listed = blocks[d].pop(name)
                total -= delete_block(bpath, listed, GRACE_S, now)
    if deleted:
        log.debug("disk cap %d: evicted %d file(s)", cap, len(deleted))
    return deleted


def collect_unreferenced(root: Path, grace: float = GRACE_S) -> int:
    """Delete, in every model directory under ``root``, the block files no entry file references (older than
    ``grace`` s; files of another format stay); returns the bytes freed."""
    freed = 0
    for d in model_dirs(root):
        referenced: set[str] = set()
        for p, *_ in iter_state_files_in(d):
            referenced.update(entry_blocks(p) or ())
        freed += collect_blocks(d, referenced, grace=grace)
    return freed


def disk_usage(root: Path) -> dict:
    """Bytes and file counts on disk: entry files, block files, pinned entries; ``disk_bytes`` is their total.

    ``pinned_bytes``: what no eviction can free, the pinned entries' files and the block files they reference
    (each once); ``pinned_files``: the pinned entries.
    """
    total = pinned = n = n_pinned = 0
    pinned_chains: dict[Path, set[str]] = {}
    for path, st, pin, _ in iter_state_files(root):
        total += st.st_size
        n += 1
        if pin:
            pinned += st.st_size
            n_pinned += 1
            pinned_chains.setdefault(path.parent, set()).update(entry_blocks(path) or ())
    nb = block_bytes = 0
    for d in model_dirs(root):
        held = pinned_chains.get(d, set())
        for p, st in iter_block_files(d):
            nb += 1
            block_bytes += st.st_size
            if p.name[: -len(BLOCK_SUFFIX)] in held:
                pinned += st.st_size
    return {"disk_bytes": total + block_bytes, "disk_files": n, "pinned_bytes": pinned, "pinned_files": n_pinned,
            "block_files": nb, "block_bytes": block_bytes}


def block_usage(root: Path) -> dict:
    """What the blocks save (``ollapy cache``): entries, blocks, shared bytes, the dedupe ratio.

    ``logical_bytes``: the entries as whole states; ``held_bytes``: entry and
    block files; ``shared_bytes``: blocks two or more entries reference;
    ``whole_entries``: entries kept whole, of which ``short_entries`` are shorter than one block
    (:data:`~ollapy.cache.blocks.BLOCK_TOKENS`) and the others hold a state the splitter did not recognise;
    ``unknown_files``: files of another format or version (left alone).
    """
    out = {"entries": 0, "whole_entries": 0, "short_entries": 0, "unknown_files": 0, "blocks": 0,
           "logical_bytes": 0, "held_bytes": 0, "shared_bytes": 0, "unreferenced_blocks": 0}
    for d in model_dirs(root):
        refs: Counter = Counter()
        for p, st, _, _ in iter_state_files_in(d):
            try:
                hdr = read_header(p)
            except UnknownFormat:
                out["unknown_files"] += 1
                continue
            except (OSError, CacheFileError):
                continue
            out["entries"] += 1
            out["whole_entries"] += not hdr.blocks
            out["short_entries"] += not hdr.blocks and len(hdr.tokens) < BLOCK_TOKENS
            out["logical_bytes"] += hdr.state_len or hdr.payload_len
            out["held_bytes"] += st.st_size
            refs.update(hdr.blocks)
        for p, st in iter_block_files(d):
            name = p.name[: -len(BLOCK_SUFFIX)]
            out["blocks"] += 1
            out["held_bytes"] += st.st_size
            out["shared_bytes"] += st.st_size if refs[name] > 1 else 0
            out["unreferenced_blocks"] += refs[name] == 0
    out["dedupe_ratio"] = round(out["logical_bytes"] / out["held_bytes"], 2) if out["held_bytes"] else 1.0
    return out


def iter_state_files_in(d: Path, reap: bool = False):
    """Yield ``(path, stat, pinned, hit)`` for every entry file of one model directory; with ``reap``, temporary
    files that no live writer owns are deleted on the way (:func:`_reap_temp`)."""
    try:
        names = list(os.scandir(d))
        dir_mtime = d.stat().st_mtime
    except OSError:
        return
    present = {n.name for n in names}
    for f in names:
        if f.name.startswith(TMP_PREFIX):
            if reap:
                _reap_temp(f, dir_mtime)
            continue
        if not f.name.endswith(SUFFIX):
            continue
        try:
            st = f.stat()
        except OSError:
            continue
        stem = f.name[: -len(SUFFIX)]
        yield Path(f.path), st, (stem + PIN) in present, (stem + HIT) in present
