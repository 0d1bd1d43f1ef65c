"""``ollapy cache``: list, count, prune, clear, warm (compute and pin a prefix) and unpin prompt-cache entries.

An entry is a chain of KV blocks (stored once however many entries share
them) plus a tail; ``ls`` shows each entry's blocks (``whole`` for a state
kept whole because the block splitter did not recognise its layout), ``stats``
the blocks, the bytes they share and the dedupe ratio.

Everything but ``warm`` works from the file headers alone and never loads
llama.cpp.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import typer

from ollapy import config
from ollapy.errors import OllapyError, UsageError

cache_app = typer.Typer(help="Inspect and manage the prompt cache (saved KV states of prompt prefixes). "
                        "Without a command: stats.", add_completion=False)


@cache_app.callback(invoke_without_command=True)
def _default(ctx: typer.Context) -> None:
    """``ollapy cache`` alone prints :func:`stats` (as ``git stash`` lists): the figures a user looks for first."""
    if ctx.invoked_subcommand is None:
        stats(as_json=False)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _ago(t: float) -> str:
    d = max(0.0, time.time() - t)
    if d < 60:
        return f"{d:.0f}s ago"
    if d < 3600:
        return f"{d / 60:.0f}m ago"
    if d < 86400:
        return f"{d / 3600:.0f}h ago"
    return f"{d / 86400:.0f}d ago"


def _entries(model: str | None = None) -> list[dict]:
    from ollapy.cache.fileformat import quick_info
    from ollapy.cache.tiers import iter_state_files

    shas = _model_shas(model) if model else None
    out = []
    for path, st, pinned, hit in iter_state_files(config.cache_dir()):
        info = quick_info(path)
        if info is None:
            continue
        if model and not (info["model_name"] == model or info["model_sha256"] in shas
                          or info["model_sha256"].startswith(model.lower())):
            continue
        info.update(path=path, bytes=st.st_size, last_used=st.st_mtime, pinned=pinned, hit=hit)
        out.append(info)
    out.sort(key=lambda i: -i["last_used"])
    return out


def _model_shas(model: str) -> set[str]:
    """sha256 of MODEL when it resolves to a file (memoized hash), else an empty set."""
    from ollapy.cache.salt import file_sha256, normalize_digest

    try:
        from ollapy.cli.embedded import resolve_for_cli

        ref = resolve_for_cli(model, pull=False)
    except Exception:  # noqa: BLE001 - an unknown name still matches by header name
        return set()
    d = normalize_digest(getattr(ref, "digest", None))
    if d:
        return {d}
    try:
        return {file_sha256(ref.path, config.cache_dir())}
    except OSError:
        return set()


@cache_app.command("ls")
def ls(model: str | None = typer.Argument(None, help="Only entries of this model (name, path or sha256 prefix)."),
       as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List saved prefixes: model, tokens, blocks, the state's bytes (blocks and tail joined: what a restore loads;
    blocks shared with other entries are counted in each) and the entry file's own, last used, pinned, first words."""
    rows = _entries(model)
    if as_json:
        typer.echo(json.dumps([{k: (str(v) if isinstance(v, Path) else v) for k, v in r.items()} for r in rows], indent=1))
        return
    if not rows:
        typer.echo(f"no prompt-cache entries for {model!r} (a model name, path or sha256 prefix; `ollapy cache ls` "
                   "lists every model's)" if model else "no prompt-cache entries", err=True)
        return
    typer.echo(f"{'MODEL':<28} {'KV':<5} {'TOKENS':>7} {'BLOCKS':>6} {'STATE':>9} {'FILE':>9} {'LAST USED':>10} "
               f"{'PIN':<3}  PREFIX")
    for r in rows:
        name = (r["model_name"] or r["model_sha256"][:12])[:28]
        pin = "yes" if r["pinned"] else ""
        blocks = str(len(r["blocks"])) if r.get("blocks") else "whole"
        state = r.get("state_len") or r["bytes"]
        typer.echo(f"{name:<28} {r['salt'].get('type_k', '?'):<5} {r['n_tokens']:>7} {blocks:>6} {_human(state):>9} "
                   f"{_human(r['bytes']):>9} "
                   f"{_ago(r['last_used']):>10} {pin:<3}  {r['preview'][:60]}")


@cache_app.command("stats")
def stats(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Hits and misses by tier, tokens reused, bytes held (disk, pinned), blocks and dedupe, over every process."""
    from ollapy.cache.diskcap import block_usage
    from ollapy.cache.remote import redact
    from ollapy.cache.stats import aggregate
    from ollapy.cache.tiers import disk_usage

    root = config.cache_dir()
    data = aggregate(root)
    data.update(disk_usage(root))
    data.update({f"disk_{k}": v for k, v in block_usage(root).items()})
    data["disk_cap"] = config.cache_disk_bytes()
    data["ram_cap"] = config.cache_ram_bytes()
    data["directory"] = str(root)
    if as_json:
        typer.echo(json.dumps(data, indent=1))
        return
    remote = config.cache_remote()
    data["remote"] = redact(remote) if remote else None
    if as_json:
        typer.echo(json.dumps(data, indent=1))
        return
    hits = data["hits_ram"] + data["hits_disk"] + data["hits_remote"]
    lookups = hits + data["misses"]
    rate = hits / lookups * 100 if lookups else 0.0
    typer.echo(f"directory:      {data['directory']}")
    typer.echo(f"hits:           {data['hits_ram']} ram, {data['hits_disk']} disk, {data['hits_remote']} remote "
               f"({rate:.0f}% of {lookups} lookups)")
    if remote or data["hits_remote"] or data["remote_misses"]:
        typer.echo(f"remote:         {data['remote'] or 'none now'}: {data['remote_misses']} miss(es) "
                   f"({data['remote_corrupt']} bad value(s), {data['remote_gated']} left as cheaper to prefill), "
                   f"{data['remote_partial']} partial restore(s), {_human(data['remote_bytes_read'])} read, "
                   f"{data['remote_offered']} entr(ies) offered")
    typer.echo(f"misses:         {data['misses']} (of which {data['refused']} refused by llama.cpp)")
    typer.echo(f"tokens reused:  {data['tokens_reused']}")
    typer.echo(f"stores:         {data['stores']} ({data['skipped_stores']} skipped as already covered), "
               f"{data['corrupt']} bad file(s) dropped")
    typer.echo(f"disk held:      {_human(data['disk_bytes'])} in {data['disk_files']} entry file(s) and "
               f"{data['block_files']} block file(s) (cap {_human(data['disk_cap'])})")
    one = data["pinned_files"] == 1
    typer.echo(f"pinned:         {_human(data['pinned_bytes'])}: {data['pinned_files']} entr{'y' if one else 'ies'} "
               f"and {'its' if one else 'their'} blocks (never evicted)")
    short, whole = data["disk_short_entries"], data["disk_whole_entries"]
    typer.echo(f"entries:        {data['disk_entries']} ({whole} kept whole: {short} shorter than one block, "
               f"{whole - short} of a state layout the block splitter does not know), "
               f"{data['disk_unknown_files']} file(s) of another version left alone")
    typer.echo(f"blocks:         {data['disk_blocks']} ({_human(data['block_bytes'])}), {_human(data['disk_shared_bytes'])} "
               f"shared by two or more entries; written {data['blocks_written']}, reused {data['blocks_reused']}")
    typer.echo(f"dedupe:         {data['disk_dedupe_ratio']:.2f}x ({_human(data['disk_logical_bytes'])} of whole states "
               f"held in {_human(data['disk_held_bytes'])})")
    typer.echo(f"ram cap:        {_human(data['ram_cap'])} per process")


@cache_app.command("prune")
def prune(max_bytes: str | None = typer.Option(None, "--max-bytes", help="Shrink the disk tier to this size "
                                                  "(e.g. 2GiB; default OLLAPY_CACHE_DISK). Pinned entries stay.")) -> None:
    """Evict least recently used (never-hit first) entries until the disk tier fits."""
    from ollapy.cache.tiers import disk_usage, enforce_disk_cap

    if max_bytes is None:
        cap = config.cache_disk_bytes()
    else:
        try:
            cap = config.parse_size(max_bytes)
        except ValueError:
            raise UsageError(f"--max-bytes {max_bytes!r} is not a byte size", hint="e.g. --max-bytes 2GiB") from None
    root = config.cache_dir()
    deleted = enforce_disk_cap(root, cap)
    u = disk_usage(root)
    typer.echo(f"removed {len(deleted)} entr{'y' if len(deleted) == 1 else 'ies'}; "
               f"{_human(u['disk_bytes'])} held ({_human(u['pinned_bytes'])} pinned)", err=True)
    if u["disk_bytes"] > cap:
        typer.echo(f"still above {_human(cap)}: what is left is pinned (`ollapy cache unpin` frees it)"
                   if u["disk_bytes"] - u["pinned_bytes"] <= cap else
                   f"still above {_human(cap)}: the rest is pinned, files of another ollapy version (left alone), "
                   "or blocks used in the last 10 minutes (another process may be about to reference them: try "
                   "again then)", err=True)


@cache_app.command("clear")
def clear(model: str | None = typer.Argument(None, help="Only this model's entries (name, path or sha256 prefix)."),
          keep_pinned: bool = typer.Option(False, "--keep-pinned", help="Keep pinned entries.")) -> None:
    """Delete prompt-cache entries (all of them, or one model's)."""
    from ollapy.cache.stats import reset
    from ollapy.cache.tiers import delete_entry_files

    n = 0
    if model is None:
        from ollapy.cache.tiers import iter_state_files

        for path, _st, pinned, _hit in list(iter_state_files(config.cache_dir())):
            if keep_pinned and pinned:
                continue
            delete_entry_files(path)
            n += 1
        if not keep_pinned:
            reset(config.cache_dir())
    else:
        for r in _entries(model):
            if keep_pinned and r["pinned"]:
                continue
            delete_entry_files(r["path"])
            n += 1
    from ollapy.cache.diskcap import collect_unreferenced

    collect_unreferenced(config.cache_dir(), grace=0.0)  # the blocks only the removed entries referenced
    typer.echo(f"removed {n} entr{'y' if n == 1 else 'ies'}", err=True)


@cache_app.command("warm")
def warm(model: str = typer.Argument(..., help="Model name or path to a .gguf file."),
         system: str | None = typer.Option(None, "--system", help="System prompt to compute and pin."),
         file: Path | None = typer.Option(None, "--file", help="Read the system prompt from this file."),  # noqa: B008
         option: list[str] | None = typer.Option(None, "--option", "-o",  # noqa: B008
                                                 help="Load option key=value (num_ctx, kv_cache_type...: match later runs).",
                                                 ),
         ) -> None:
    """Compute the KV state of a system prompt now and pin it (never evicted, survives restarts)."""
    from ollapy.cli.embedded import resolve_for_cli
    from ollapy.options import parse_options
    from ollapy.runner import loader

    if (system is None) == (file is None):
        raise UsageError("give exactly one of --system TEXT or --file PATH")
    if file is not None:
        try:
            system = file.read_text()
        except OSError as exc:
            raise UsageError(f"{file}: {exc.strerror or exc}") from None
    if not system or not system.strip():
        raise UsageError("the system prompt is empty")
    if not config.cache_enabled():
        raise UsageError("the prompt cache is off (OLLAPY_CACHE=0)")
    ref = resolve_for_cli(model)
    options = loader.base_options(ref, parse_options(option or []))
    t0 = time.perf_counter()
    with loader.open_model(ref, options) as loaded:
        block = loaded.cache_block
        if block is None:
            raise UsageError("the prompt cache could not be opened", hint="set OLLAPY_DEBUG=1 to see why")
        prompt = loaded.chat_prompt([{"role": "system", "content": system}, {"role": "user", "content": ""}])
        # only the system prompt (``keep``: where conversations that share it part): the empty user turn after it
        # is in no real prompt, and a state of it would be a second pinned entry
        prompt = dataclasses.replace(prompt, tokens=prompt.tokens[:prompt.keep], save_points=())
        if len(prompt.tokens) < block:
            raise UsageError(f"the prompt is only {len(prompt.tokens)} tokens; the cache saves prefixes of at least "
                             f"{block} tokens", hint="a prompt this short is prefilled in milliseconds: no need to warm it")
        req = loaded.submit(prompt, options.merged({"num_predict": 0}), pin=True)
        _, final = req.result()
        n = len(final.tokens or prompt.tokens)
        try:
            unsaved = loaded.close(timeout=300)
        except KeyboardInterrupt:
            typer.echo(f"warning: prompt cache: {loaded.unsaved_states} state(s) not saved", err=True)
            raise
    if unsaved:
        raise OllapyError(f"the state of {ref.name} could not be written to the prompt cache",
                          hint=f"check free space in {config.cache_dir()}")
    typer.echo(f"pinned {n} tokens of {ref.name} in {time.perf_counter() - t0:.2f}s", err=True)


@cache_app.command("unpin")
def unpin(model: str | None = typer.Argument(None, help="Only this model's entries (default: all)."),
          ) -> None:
    """Unpin entries: they become ordinary LRU entries again."""
    from ollapy.cache.tiers import PIN

    n = 0
    for r in _entries(model):
        if r["pinned"]:
            try:
                Path(r["path"]).with_suffix(PIN).unlink()
                n += 1
            except OSError:
                pass
    typer.echo(f"unpinned {n} entr{'y' if n == 1 else 'ies'}", err=True)


def register(app: typer.Typer) -> None:
    """Add the ``cache`` sub-app."""
    app.add_typer(cache_app, name="cache")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cache_app())
