"""The interactive chat REPL of ``ollapy run`` (Ollama's ``>>>`` prompt and slash commands).

Line editing and persistent history come from the standard ``readline``
module (history file under the platformdirs state dir; ``OLLAPY_NOHISTORY=1``
or ``/set nohistory`` turns it off). Ctrl-C while a reply streams cancels that
reply (no dangling user turn); Ctrl-C at the prompt clears the line; Ctrl-D
on an empty line exits.
"""
from __future__ import annotations

import json
import sys

from ollapy import config
from ollapy.cli.output import ReplyPrinter, format_stats
from ollapy.errors import Cancelled, ModelNotFound, OllapyError, describe
from ollapy.options import coerce_option

# the help texts of Ollama's REPL (cmd/interactive.go); ollapy adds "(reloads the model)" to load-time parameters
HELP = """Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /save <model>   Save your current session
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts

Use \"\"\" to begin a multi-line message.
"""

SET_HELP = """Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set history           Enable history
  /set nohistory         Disable history
  /set wordwrap          Enable wordwrap
  /set nowordwrap        Disable wordwrap
  /set format json       Enable JSON mode
  /set noformat          Disable formatting
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
  /set think             Enable thinking
  /set nothink           Disable thinking
"""

SHOW_HELP = """Available Commands:
  /show info         Show details for this model
  /show license      Show model license
  /show modelfile    Show Modelfile for this model
  /show parameters   Show parameters for this model
  /show system       Show system message
  /show template     Show prompt template
"""

SHORTCUTS_HELP = """Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line (Home)
  Ctrl + e            Move to the end of the line (End)
   Alt + b            Move back (left) one word
   Alt + f            Move forward (right) one word
  Ctrl + k            Delete the sentence after the cursor
  Ctrl + u            Delete the sentence before the cursor
  Ctrl + w            Delete the word before the cursor

  Ctrl + l            Clear the screen
  Ctrl + c            Stop the model from responding
  Ctrl + d            Exit ollapy (/bye)
"""

PARAMETERS_HELP = """Available Parameters:
  /set parameter seed <int>             Random number seed
  /set parameter num_predict <int>      Max number of tokens to predict
  /set parameter top_k <int>            Pick from top k num of tokens
  /set parameter top_p <float>          Pick token based on sum of probabilities
  /set parameter min_p <float>          Pick token based on top token probability * min_p
  /set parameter num_ctx <int>          Set the context size (reloads the model)
  /set parameter temperature <float>    Set creativity level
  /set parameter repeat_penalty <float> How strongly to penalize repetitions
  /set parameter repeat_last_n <int>    Set how far back to look for repetitions
  /set parameter num_gpu <int>          The number of layers to send to the GPU (reloads the model)
  /set parameter stop <string> <string> ...   Set the stop parameters
"""

HELP_TOPICS = {"set": SET_HELP, "/set": SET_HELP, "show": SHOW_HELP, "/show": SHOW_HELP,
               "shortcut": SHORTCUTS_HELP, "shortcuts": SHORTCUTS_HELP}
"""``/? TOPIC`` and ``/help TOPIC``: the sub-help Ollama prints for each topic."""


def _setup_history(enabled: bool):
    try:
        import readline
    except ImportError:  # pragma: no cover - Windows without pyreadline
        return None
    path = config.state_dir() / "history"
    if enabled:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.read_history_file(str(path))
        except (FileNotFoundError, OSError):
            pass
    readline.set_history_length(1000)
    return readline, path


def _save_history(hist, enabled: bool) -> None:
    if hist is None or not enabled:
        return
    readline, path = hist
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(str(path))
    except OSError:
        pass


def read_message(prompt: str = ">>> ") -> str | None:
    """Read one user message; supports \"\"\" multi-line blocks. None on Ctrl-D with an empty line."""
    line = input(prompt)
    if not line.lstrip().startswith('"""'):
        return line
    body = line.lstrip()[3:]
    if body.endswith('"""') and len(body) >= 3:
        return body[:-3]
    lines = [body] if body else []
    while True:
        nxt = input("... ")
        if nxt.rstrip().endswith('"""'):
            lines.append(nxt.rstrip()[:-3])
            return "\n".join(lines)
        lines.append(nxt)


def run_repl(conv, settings) -> None:
    """Chat until /bye or Ctrl-D."""
    history_on = settings.history and not config._bool(config.NOHISTORY)
    hist = _setup_history(history_on)
    while True:
        try:
            msg = read_message()
        except KeyboardInterrupt:
            print("\nUse Ctrl + d or /bye to exit.", file=sys.stderr)
            continue
        except EOFError:
            print(file=sys.stderr)
            break
        if msg is None:
            break
        if not msg.strip():
            continue
        if msg.startswith("/"):
            try:
                if handle_command(conv, settings, msg.strip()) == "exit":
                    break
            except OllapyError as exc:
                print(f"Error: {describe(exc)}", file=sys.stderr)
            history_on = settings.history and not config._bool(config.NOHISTORY)
            continue
        _reply(conv, settings, msg)
        _save_history(hist, history_on)
    _save_history(hist, history_on)


class _MarkdownSink:
    """Renders the streamed reply as Markdown with rich (terminal only), redrawn as text arrives."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.text = ""
        self.live = Live(console=Console(), refresh_per_second=8, vertical_overflow="visible")
        self.live.start()

    def write(self, text: str) -> None:
        from rich.markdown import Markdown

        self.text += text
        self.live.update(Markdown(self.text))

    def finish(self) -> None:
        self.live.stop()


def _reply(conv, settings, msg: str) -> None:
    from ollapy.cli.output import is_tty

    markdown = _MarkdownSink if settings.markdown and is_tty(sys.stdout) else None
    sink = ReplyPrinter(sys.stdout, wrap=settings.wrap, show_thinking=not settings.hidethinking, content_sink=markdown)
    final = None
    stream = None
    try:
        from ollapy.cli.images import extract_image_paths, read_image

        msg, paths = extract_image_paths(msg)  # image files named in the line, as `ollama run` finds them
        for p in paths:
            print(f"Added image '{p}'", file=sys.stderr)
        stream = conv.ask(msg, settings, [read_image(p) for p in paths] or None)
        for chunk in stream:
            sink.write(getattr(chunk, "thinking", ""), chunk.text)
            if chunk.done:
                final = chunk
    except (KeyboardInterrupt, Cancelled):
        if stream is not None:
            stream.cancel()
        sink.finish()
        print("(reply cancelled)", file=sys.stderr)  # the terminal has echoed the ^C itself
        return
    except OllapyError as exc:
        sink.finish()
        print(f"Error: {describe(exc)}", file=sys.stderr)
        return
    sink.finish()
    print()
    conv.after_answer(final, settings)
    if settings.verbose and final is not None and final.metrics is not None:
        m = final.metrics.as_dict() if hasattr(final.metrics, "as_dict") else dict(final.metrics)
        print(format_stats(m), file=sys.stderr)


def handle_command(conv, settings, line: str) -> str | None:
    """Run one slash command; returns "exit" for /bye. Raises OllapyError for bad arguments."""
    parts = line.split(None, 3)
    cmd = parts[0].lower()
    if cmd in ("/bye", "/exit"):
        return "exit"
    if cmd in ("/?", "/help"):
        topic = parts[1].lower() if len(parts) > 1 else ""
        print(HELP_TOPICS.get(topic, HELP))
        return None
    if cmd == "/clear":
        conv.clear()
        print("Cleared session context")
        return None
    if cmd in ("/save", "/load"):
        if len(parts) < 2:
            print(f"Usage:\n  {cmd} <name>")
            return None
        if cmd == "/save":  # as Ollama: a new model FROM this one, with its system, parameters and messages
            conv.save_model(parts[1], settings)
            print(f"Created new model '{parts[1]}'")
            return None
        print(f"Loading model '{parts[1]}'")
        try:
            conv.switch_model(parts[1], settings)
        except ModelNotFound:
            print(f"Couldn't find model '{parts[1]}'")
        return None
    if cmd == "/set":
        return _set(conv, settings, line)
    if cmd == "/show":
        return _show(conv, settings, parts[1] if len(parts) > 1 else "")
    print(f"Unknown command '{cmd}'. Type /? for help")
    return None


def _set(conv, settings, line: str) -> None:
    parts = line.split(None, 2)
    if len(parts) < 2:
        print(SET_HELP)
        return None
    what = parts[1].lower()
    rest = parts[2] if len(parts) > 2 else ""
    flags = {
        "verbose": ("verbose", True), "quiet": ("verbose", False),
        "history": ("history", True), "nohistory": ("history", False),
        "wordwrap": ("wrap", True), "nowordwrap": ("wrap", False),
        "noformat": ("fmt", None),
    }
    if what in flags:
        attr, val = flags[what]
        setattr(settings, attr, val)
        print(f"Set '{what}' mode.")
    elif what == "think":
        from ollapy.chat.thinking import parse_think

        value = parse_think(rest.strip() or "true")
        conv.check_think(value)  # a model without thinking: Ollama's error, the setting stays
        settings.think = value
        print("Set 'think' mode." if value is True else
              "Set 'nothink' mode." if value is False else f"Set 'think' mode to '{value}'.")
    elif what == "nothink":
        settings.think = False
        print("Set 'nothink' mode.")
    elif what == "format":
        settings.fmt = "json" if rest.strip() == "json" else None
        print(f"Set format to '{rest.strip() or 'none'}' mode.")
    elif what == "system":
        conv.system = rest.strip().strip('"') or None
        settings.system = conv.system
        print("Set system message.")
    elif what == "parameter":
        kv = rest.split(None, 1)
        if len(kv) < 2:
            print(PARAMETERS_HELP)
            return None
        _set_parameter(conv, settings, kv[0], kv[1])
    else:
        print(f"Unknown /set option '{what}'. Type /? /set for help")
    return None


def _set_parameter(conv, settings, name: str, value: str) -> None:
    """``/set parameter NAME VALUE``, honestly: a request-time option applies to the next answer; a load-time
    option (:data:`ollapy.options.LOAD_OPTIONS`: ``num_ctx``, ``num_thread``, ``rpc``...) reloads the model
    with it (:meth:`~ollapy.cli.session.Conversation.reload`), or says why it cannot; "Set" is printed only
    for what took effect. Raises OptionError for an unknown name or a bad value (nothing changes)."""
    from ollapy.options import LOAD_OPTIONS, SERVER_DECIDED_OPTIONS, Options, draft_model

    if name == "stop":  # as Ollama's REPL: each word is one stop string, and they replace the earlier ones
        words = [_unquote(w) for w in value.split()]
        typed = coerce_option(name, words)
        value = ", ".join(words)
    else:
        typed = coerce_option(name, value)
        if name == "draft":  # ./draft.gguf means the user's working directory, whoever loads it
            from ollapy.cli.embedded import absolute_draft_option

            typed = absolute_draft_option({name: typed})[name]
    runner_opts = getattr(conv.runner, "options", None)
    # checked with the options in force (draft_min against draft_num_predict...): OptionError leaves all as it was
    checked = (runner_opts if runner_opts is not None else Options().merged(conv.options)).merged({name: typed})
    # a draft model is loaded with the model (n-gram drafting is not): it is load-time too
    current_draft = getattr(runner_opts, "draft", "")
    load_time = name in LOAD_OPTIONS or (name == "draft" and draft_model(typed) != draft_model(current_draft or ""))
    if not load_time:
        conv.options[name] = typed
        if runner_opts is not None:
            conv.runner.options = checked
        print(f"Set parameter '{name}' to '{value}'")
        return
    if name in SERVER_DECIDED_OPTIONS and conv.on_server:
        print(f"'{name}' is the server's to set (ollapy serve with OLLAPY_NUM_PARALLEL); unchanged. "
              f"Use `ollapy run --local` to run the model in this process.")
        return
    current = getattr(getattr(conv.runner, "options", None), name, None)
    if current == typed:
        conv.options[name] = typed
        print(f"Set parameter '{name}' to '{value}'")
        return
    print(f"'{name}' takes effect when the model loads: reloading {conv.name}...")
    try:
        conv.reload({name: typed}, settings)
    except OllapyError as exc:
        print(f"Error: {describe(exc)}")
        print(f"Parameter '{name}' not set: {conv.name} runs as before")
        return
    print(f"Set parameter '{name}' to '{value}' (model reloaded)")


def _unquote(word: str) -> str:
    """A ``/set parameter stop`` word: a JSON-quoted one (as ``/show modelfile`` prints them) is decoded."""
    if len(word) >= 2 and word[0] == word[-1] == '"':
        try:
            return json.loads(word)
        except ValueError:
            pass
    return word


def _show(conv, settings, what: str) -> None:
    what = what.lower()
    info = conv.runner.info() if hasattr(conv.runner, "info") else {}
    if what == "info":
        for k in ("name", "architecture", "description", "context_length", "num_ctx", "num_parallel", "template",
                  "kv_bytes_per_token", "extra_bufts", "threads", "server"):
            if k in info:
                print(f"  {k:<20} {info[k]}")
        print("  Capabilities")
        for cap in conv.capabilities:
            print(f"    {cap}")
        think = {None: "on (default)", True: "on", False: "off"}.get(settings.think, settings.think)
        if "thinking" in conv.capabilities:
            print(f"  {'think':<20} {think}")
    elif what == "parameters":
        opts = getattr(conv.runner, "options", None)
        shown = dict(conv.options)
        if opts is not None and hasattr(opts, "__dict__"):
            shown = {k: getattr(opts, k) for k in ("temperature", "top_k", "top_p", "min_p", "num_ctx", "num_predict",
                                                   "repeat_penalty", "seed", "stop")}
            shown.update(conv.options)  # what /set parameter changed in this session (draft, ...)
        width = max([16, *(len(k) + 1 for k in shown)])  # draft_num_predict is 17 characters
        for k, v in shown.items():
            print(f"{k:<{width}} {json.dumps(list(v) if isinstance(v, tuple) else v)}")
    elif what == "system":
        print(conv.system or "No system message was specified for this model.")
    elif what == "template":
        model = getattr(conv.runner, "model", None)
        print(model.template.text if model is not None else info.get("template_text", ""))
    elif what == "license":  # the text `ollapy show --license` prints
        print(conv.license.strip() if conv.license else "No license was specified for this model.")
    elif what == "modelfile":
        from ollapy.store.modelfile import format_modelfile

        print(format_modelfile(info.get("path", conv.name), conv.options, conv.system, None, None, []), end="")
    else:
        print(SHOW_HELP)
    return None
