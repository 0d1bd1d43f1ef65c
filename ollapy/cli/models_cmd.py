"""Model commands: ``pull``, ``list``/``ls``, ``show``, ``rm``, ``cp``, ``create``.

Everything here reads the store through :mod:`ollapy.store`; nothing imports
llama_cpp, and huggingface_hub/httpx load only when a pull needs them.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ollapy.errors import UsageError


def _age(ts: float) -> str:
    d = max(0.0, time.time() - ts)
    for unit, sec in (("year", 31536000), ("month", 2592000), ("week", 604800), ("day", 86400), ("hour", 3600),
                      ("minute", 60)):
        if d >= sec:
            n = int(d // sec)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "Less than a minute ago" if d >= 1 else "Just now"


def _print_if_set(text: str | None) -> None:
    """Print ``text`` (one trailing newline), or nothing at all when it is unset or empty."""
    if text:
        print(text, end="" if text.endswith("\n") else "\n")


def pull_cmd(
    name: str = typer.Argument(..., help="Model name: smollm2:135m, hf.co/org/repo:Q4_K_M, [host/][ns/]model[:tag]."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    insecure: bool = typer.Option(False, "--insecure", help="Use plain HTTP for a registry host."),
) -> None:
    """Pull a model from Hugging Face, the catalogue's mirrors or an Ollama registry."""
    from ollapy.store import pull_model
    from ollapy.store.names import looks_like_path

    if looks_like_path(name):  # ./x.gguf, /abs/path, ~/x, x.gguf (hf.co/org/repo:file.gguf is a name)
        raise UsageError(f"{name!r} is a file path, not a model name to pull",
                         hint=f"run it as it is: `ollapy run {name}`; or store it under a name: `ollapy create "
                              f"NAME` with a Modelfile saying `FROM {name}`")
    stored = pull_model(name, quiet=quiet, insecure=insecure)  # the name the manifest was written under
    if not quiet:
        print(f"success: {stored.display()}", file=sys.stderr)


def list_cmd() -> None:
    """List local models (NAME ID SIZE MODIFIED SOURCE); broken entries show their reason."""
    from ollapy.store import list_models
    from ollapy.store.progress import human_size

    rows = [("NAME", "ID", "SIZE", "MODIFIED", "SOURCE")]
    for m in list_models():
        src = f"BROKEN: {m.broken}" if m.broken else m.source
        rows.append((m.name, m.id, human_size(m.size) if not m.broken else "-", _age(m.modified), src))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    room = None
    if sys.stdout.isatty():  # on a terminal SOURCE (last, and the only long column) is cut to fit; piped: whole
        import shutil

        room = shutil.get_terminal_size().columns - 1 - sum(widths) - 4 * 4
    for r in rows:
        line = "    ".join(c.ljust(w) for c, w in zip(r[:4], widths))
        if room is None or len(r[4]) <= room:
            print(line + "    " + r[4])
        elif room >= 12:
            print(line + "    " + r[4][:room - 1] + "…")
        else:  # no useful room for SOURCE on this terminal: leave the column out (piped output keeps it)
            print(line.rstrip())


def show_cmd(
    name: str = typer.Argument(..., help="Model name or path to a .gguf file."),
    modelfile: bool = typer.Option(False, "--modelfile", help="Show the Modelfile."),
    template: bool = typer.Option(False, "--template", help="Show the template."),
    parameters: bool = typer.Option(False, "--parameters", help="Show the parameters."),
    license_: bool = typer.Option(False, "--license", help="Show the license."),
    system: bool = typer.Option(False, "--system", help="Show the system prompt."),
) -> None:
    """Show a model's architecture, size, context length, template, parameters and license (GGUF metadata)."""
    from ollapy.store import resolve_model
    from ollapy.store.info import parameter_rows, read_gguf_info
    from ollapy.store.modelfile import format_modelfile
    from ollapy.store.resolve import model_file_note

    ref = resolve_model(name, pull=False)
    if modelfile:
        text = format_modelfile(str(ref.path), ref.parameters, ref.system, ref.template, ref.license, ref.messages,
                                [str(a) for a in getattr(ref, "adapters", None) or ()])
        if getattr(ref, "projector", None):  # a vision model: the projector is its second FROM, as in Ollama
            first, _, rest = text.partition("\n")
            text = f"{first}\nFROM {ref.projector}\n{rest}"
        print(text, end="")
        return
    info = read_gguf_info(ref.path)
    # like Ollama: each value on its own line, strings JSON-quoted; an unset template, license or system prints nothing
    if template:  # the template `run` uses: the Modelfile's, else the GGUF's, else the architecture's built-in one
        from ollapy.chat.templates import select_template

        _print_if_set(select_template(info["chat_template"], info["architecture"], ref.template).text)
        return
    if parameters:
        for k, text in parameter_rows(ref.parameters):
            print(f"{k:<30} {text}")
        return
    if license_:
        _print_if_set(ref.license)
        return
    if system:
        _print_if_set(ref.system)
        return
    print("  Model")
    for label, key in (("architecture", "architecture"), ("parameters", "parameters"), ("context length", "context_length"),
                       ("embedding length", "embedding_length"), ("quantization", "quantization")):
        print(f"    {label:<20}{info.get(key)}")
    print(f"    {'file':<20}{ref.path} ({model_file_note(ref)})")
    if ref.source:
        print(f"    {'source':<20}{ref.source}")
    from ollapy.chat.reply import model_capabilities
    from ollapy.chat.templates import select_template

    template = select_template(info["chat_template"], info["architecture"], ref.template)
    if not info.get("embedding_only"):
        print(f"    {'chat template':<20}{template.source}")
        if "fallback" in template.source:
            print(f"    {'':<20}(the GGUF has none: often a base model, not instruction-tuned, which may not end its "
                  "answers; bound them with -o num_predict=N)")
    caps = model_capabilities(template.text, embedding_only=bool(info.get("embedding_only")))
    from ollapy.server.ollama.details import supports_insert
    from ollapy.server.ollama.models import with_insert

    caps = with_insert(caps, supports_insert(ref.path, template.text))  # as /api/show (FIM tokens or .Suffix)
    projector = getattr(ref, "projector", None)
    if projector:
        caps = [*caps, "vision"]
    print("\n  Capabilities")  # as `ollama show`
    for cap in caps:
        print(f"    {cap}")
    if projector:
        from ollapy.store.info import read_gguf_header

        meta = read_gguf_header(projector)[0]
        print("\n  Projector")  # as `ollama show`: the vision projector's type and size
        print(f"    {'type':<20}{meta.get('clip.projector_type')}")
        print(f"    {'embedding length':<20}{meta.get('clip.vision.projection_dim')}")
        print(f"    {'file':<20}{projector} ({projector.stat().st_size:,} bytes)")
    adapters = getattr(ref, "adapters", None) or []
    if adapters:
        from ollapy.store.info import read_gguf_header

        print("\n  Adapters")  # LoRA adapters (Modelfile ADAPTER), applied in this order at scale 1.0
        for a in adapters:
            meta = read_gguf_header(a)[0]
            print(f"    {'lora':<20}{meta.get('general.name') or a.name} (alpha {meta.get('adapter.lora.alpha')})")
            print(f"    {'file':<20}{a} ({a.stat().st_size:,} bytes)")
    if ref.parameters:
        print("\n  Parameters")
        for k, text in parameter_rows(ref.parameters):
            print(f"    {k:<20}{text}")
    if ref.system:
        print("\n  System\n    " + ref.system.strip().replace("\n", "\n    "))
    if ref.license:
        print("\n  License\n    " + "\n    ".join(ref.license.strip().splitlines()[:2]))


def rm_cmd(names: Annotated[list[str], typer.Argument(help="Models to remove.")]) -> None:
    """Remove models (and the blobs no other model uses); works on broken entries too."""
    from ollapy.store import remove_model

    for n in names:
        remove_model(n)
        print(f"deleted '{n}'")


def cp_cmd(
    source: str = typer.Argument(..., help="Existing model."),
    destination: str = typer.Argument(..., help="New name."),
) -> None:
    """Copy a model to a new name (no bytes copied)."""
    from ollapy.store import copy_model

    dst = copy_model(source, destination)
    print(f"copied '{source}' to '{dst.display()}'")


def create_cmd(
    name: Annotated[str, typer.Argument(help="Name for the new model.")],
    file: Annotated[Path | None, typer.Option("--file", "-f", help="Modelfile path, - for stdin (default: ./Modelfile).")] = None,
    quantize: Annotated[str | None, typer.Option(
        "--quantize", "-q", metavar="TYPE",
        help="Quantize the model (an F16 or F32 GGUF) to TYPE, e.g. q4_K_M, q4_K_S, q8_0.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress output.")] = False,
) -> None:
    """Create a model from a Modelfile (FROM path-or-name, PARAMETER, SYSTEM, TEMPLATE, LICENSE, MESSAGE, ADAPTER,
    DRAFT); with --quantize, a quantized copy of its F16/F32 weights as a new blob."""
    from ollapy.store import create_model
    from ollapy.store.adapters import quant_type

    qtype = quant_type(quantize) if quantize else None  # a bad type is a usage error before anything is read

    path = file or Path("Modelfile")
    if str(path) == "-":  # standard input; a relative FROM is taken from the current directory
        text, base = sys.stdin.read(), Path.cwd()
    else:  # any readable file: also a pipe such as `-f <(...)` or /dev/stdin
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise UsageError(f"{path}: no such Modelfile", hint="pass -f PATH, or -f - to read it from stdin") from None
        except UnicodeDecodeError:
            raise UsageError(f"{path}: not a UTF-8 text Modelfile", hint="pass -f PATH of a Modelfile") from None
        base = path.resolve().parent if path.is_file() else Path.cwd()
    if qtype is None:
        ref = create_model(name, text, base, quiet=quiet)
    else:
        from ollapy.cli.quantize_progress import tensor_progress
        from ollapy.engine.system import quantize_model

        with tensor_progress(f"quantizing to {qtype}", quiet) as progress:
            ref = create_model(name, text, base, quiet=quiet, quantize=(qtype, quantize_model, progress))
    print(f"success: created {ref.name}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    """Add the model commands to the ``ollapy`` app."""
    app.command("pull")(pull_cmd)
    app.command("list")(list_cmd)
    app.command("ls", hidden=True)(list_cmd)
    app.command("show")(show_cmd)
    app.command("rm")(rm_cmd)
    app.command("cp")(cp_cmd)
    app.command("create")(create_cmd)
