"""Model options with Ollama's names, types, defaults and validation.

Two kinds: *load* options change how the model and context are created
(``num_ctx``, ``num_batch``, ``num_gpu``, ``num_thread``, ``num_parallel``,
``kv_cache_type``, ``flash_attn``, ``extra_bufts``, and ``draft`` when it names a
draft model: :func:`draft_model`) and so force a reload; *request* options only
change one generation (sampling, ``num_predict``, ``stop``, ``draft=ngram``,
``draft_num_predict``, ``draft_min``...). ``parse_option`` turns ``key=value`` text (CLI ``-o``,
Modelfile ``PARAMETER``) into a typed value; ``Options.from_dict`` validates a
JSON ``options`` object. Errors are :class:`~ollapy.errors.OptionError` with
the list of valid names.

Two readings, on purpose: the CLI (``-o``, ``/set parameter``) and Modelfile
``PARAMETER`` are strict (:func:`coerce_option`: an unknown name is an error,
since there it is a user's typo), while the HTTP API is lenient as Ollama's
server is (:func:`api_options`: unknown names are logged and skipped, nulls
skipped, names Ollama's clients still send but ollapy has no use for
(:data:`COMPAT_OPTIONS`) accepted without effect; only a wrong type is an error, and
``rpc``, which only the server's operator sets: :data:`SERVER_ONLY_OPTIONS`).

:data:`OPTION_HELP` says what each option does and :func:`option_values` what it accepts: docs/options.md is
generated from them (``scripts/gen_docs.py``), so a new option needs its line there.
"""
from __future__ import annotations

import json
import logging
import math
import reprlib
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ollapy.errors import OptionError

log = logging.getLogger("ollapy.options")

LOAD_OPTIONS = ("num_ctx", "num_batch", "num_gpu", "num_thread", "num_parallel", "kv_cache_type", "flash_attn", "extra_bufts",
                "rpc", "tensor_split")


@dataclass(frozen=True)
class Options:
    """All options of one request, with Ollama's defaults.

    Units: counts are tokens; ``num_ctx`` is per slot; ``temperature`` 0 means
    greedy; ``seed`` -1 means random; ``num_predict`` -1 means until stop or
    context limit; ``num_keep`` -1 means "BOS plus the system prompt, at least 4".
    ``mirostat`` 1 or 2 samples with llama.cpp's Mirostat (v1 or v2) at target
    surprise ``mirostat_tau`` and learning rate ``mirostat_eta`` instead of
    top_k/top_p/min_p/typical_p (temperature still applies first).
    """

    # load-time
    num_ctx: int = 4096
    num_batch: int = 512
    num_gpu: int = -1
    num_thread: int = 0
    num_parallel: int = 1
    kv_cache_type: str = "f16"
    flash_attn: str = "auto"
    extra_bufts: str = "auto"
    # RPC servers whose devices take model layers ("host:port,host:port"; "" = none), as llama.cpp's --rpc
    rpc: str = ""
    # proportions of the offloaded layers per device ("3,1"; "" = by free memory), as llama.cpp's --tensor-split
    tensor_split: str = ""
    # speculative decoding: "" (off), "ngram" (prompt lookup, per request), or a draft model's name or path
    # (Modelfile DRAFT; load-time: see draft_model()); up to draft_num_predict drafted tokens per step (Ollama's
    # name; -1: by mode, see draft_limit()), none when fewer than draft_min can be proposed
    draft: str = ""
    draft_num_predict: int = -1
    draft_min: int = 1
    # request-time
    num_keep: int = -1
    num_predict: int = -1
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    typical_p: float = 1.0
    repeat_penalty: float = 1.1
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = -1
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    # llama.cpp's samplers beyond Ollama's, in llama-server's names and defaults (common/common.h): DRY (off at
    # multiplier 0), top-n-sigma (off below 0), XTC (off at probability 0); logit_bias: (token id or text, bias)
    # pairs (:func:`read_logit_bias`; a text is tokenized when the request starts), -inf bans
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    logit_bias: tuple[tuple[int | str, float], ...] = ()
    stop: tuple[str, ...] = field(default_factory=tuple)
    shift: bool = True
    truncate: bool = True
    # how tool calls are read from the output: auto (from the chat template), hermes, llama3, mistral, generic
    tool_parser: str = "auto"
    # code completion (fill-in-the-middle): where the text typed on the current line goes. plain: where it stands,
    # before the suffix (llama-server's /infill, Ollama's templates); moved-line: after the middle token, so a
    # keystroke prefills only the typed text; auto: moved-line for /infill's prompt, plain for a prefix and suffix
    # (ollapy.chat.fim)
    fim_layout: str = "auto"

    @classmethod
    def names(cls) -> list[str]:
        """All valid option names."""
        return [f.name for f in fields(cls)]

    def load_key(self) -> tuple:
        """The tuple of load-time options: a change here means reloading the model (a draft model is one)."""
        return (*(getattr(self, n) for n in LOAD_OPTIONS), draft_model(self.draft))

    def merged(self, values: dict[str, Any] | None) -> "Options":
        """Return a copy with ``values`` (name -> raw value) validated and applied.

        Raises OptionError for an unknown name or a bad value. ``stop`` accepts
        a string or a list of strings.
        """
        if not values:
            return self
        updates = {}
        for k, v in values.items():
            updates[k] = coerce_option(k, v)
        merged = replace(self, **updates)
        merged.check_draft()
        return merged

    def check_draft(self) -> None:
        """Raise OptionError when drafting is on but ``draft_min`` exceeds the drafted tokens a step may verify
        (no draft could ever be verified: most likely a typo)."""
        if not self.draft:
            return
        limit = draft_limit(self.draft, self.draft_num_predict)
        if limit and self.draft_min > limit:
            raise OptionError(f"draft_min ({self.draft_min}) is above draft_num_predict ({limit}): nothing could "
                              f"ever be drafted", hint="lower draft_min or raise draft_num_predict")


_TYPES = {f.name: f.type for f in fields(Options)}
_CHOICES = {
    "kv_cache_type": ("f16", "q8_0", "q4_0"),
    "flash_attn": ("auto", "on", "off"),
    "extra_bufts": ("auto", "on", "off"),
    "tool_parser": ("auto", "hermes", "llama3", "mistral", "generic"),
    "fim_layout": ("auto", "plain", "moved-line"),
}
_MIN = {"num_ctx": 16, "num_batch": 1, "num_parallel": 1, "num_thread": 0, "repeat_last_n": -1, "top_k": 0,
        "mirostat": 0, "draft_num_predict": -1, "draft_min": 1, "dry_allowed_length": 0, "dry_penalty_last_n": -1}
# ggml's GGML_MAX_N_THREADS, llama.cpp's LLAMA_MAX_SEQ; num_ctx * num_parallel and num_batch stay in a uint32
_MAX = {"mirostat": 2, "draft_num_predict": 64, "draft_min": 64, "num_thread": 512, "num_parallel": 256,
        "num_ctx": 2**23, "num_batch": 2**23}
_INT32 = 2**31  # every other integer option travels to llama.cpp as a C int (seed: masked to 32 bits)
#: ``draft`` values that mean "no drafting"
_DRAFT_OFF = ("", "none", "off", "false", "0")
#: the draftless n-gram drafter's name (llama.cpp's server calls its modes ngram-*)
DRAFT_NGRAM = "ngram"


#: ``draft_num_predict`` when unset (-1), by how a request drafts. The anchors differ and both are right for
#: their drafter: llama.cpp's n-gram modes draft up to 48-64 tokens (a proposal is free; a step verifies what the
#: lookup found), its draft model 3 and Ollama's 4 (each drafted token costs a draft-model decode first). Here
#: the policy prices every row (engine/spec/policy.py), so the cap only bounds what it may choose: a longer cap
#: lets it take the wider batches a CPU's tiled kernels verify cheaply (caps compared: docs/benchmarks.md).
DRAFT_N_MAX_NGRAM = 16
DRAFT_N_MAX_MODEL = 4


def draft_limit(draft: str, draft_num_predict: int) -> int:
    """The most drafted tokens one step verifies: ``draft_num_predict`` when set (>= 0; 0 drafts nothing), else
    :data:`DRAFT_N_MAX_NGRAM` for ``draft=ngram`` and :data:`DRAFT_N_MAX_MODEL` for a draft model."""
    if draft_num_predict >= 0:
        return draft_num_predict
    return DRAFT_N_MAX_NGRAM if draft == DRAFT_NGRAM else DRAFT_N_MAX_MODEL


def draft_model(draft: str) -> str:
    """The draft model a ``draft`` option value names (a store name or a GGUF path), or ``""`` for none or
    for ``ngram`` (which needs no model). Used in :meth:`Options.load_key`: only a draft model is load-time."""
    return "" if draft in ("", DRAFT_NGRAM) else draft


# OpenAI's presence/frequency penalties range over [-2, 2]; a negative one favours repeats (llama.cpp applies it so);
# DRY's base below 1 would reward repeats (llama-server quietly takes its default then); any negative top_n_sigma is off
_FLOAT_MIN = {"presence_penalty": -2.0, "frequency_penalty": -2.0, "dry_base": 1.0, "top_n_sigma": float("-inf")}
# probabilities (llama-server's limits for XTC's; a threshold above 0.5 turns XTC off)
_FLOAT_MAX = {"xtc_probability": 1.0, "xtc_threshold": 1.0}
#: options whose value is a list of strings: repeated Modelfile ``PARAMETER`` lines and ``-o`` items accumulate
LIST_OPTIONS = ("stop", "dry_sequence_breakers")
#: options a request sets but a Modelfile or ``/api/create`` does not (a model's token ids are no parameter of it)
REQUEST_ONLY_OPTIONS = ("logit_bias",)
#: OpenAI's ``logit_bias`` range; its own docs: "values like -100 or 100 should result in a ban or exclusive
#: selection", so -100 is a ban here (llama.cpp's sampler then never picks the token: -inf)
LOGIT_BIAS_MAX = 100.0
#: the most ``logit_bias`` entries one request may carry (each is a sampler entry, a text one a tokenization)
LOGIT_BIAS_ENTRIES = 4096

#: Option names the official Ollama client's ``Options`` type (and older Ollama servers) carry that ollapy has no
#: use for, with their types. The HTTP API accepts them (a wrong type is still an error) and ignores them.
COMPAT_OPTIONS = {
    "numa": "bool", "main_gpu": "int", "low_vram": "bool", "f16_kv": "bool", "logits_all": "bool",
    "vocab_only": "bool", "use_mmap": "bool", "use_mlock": "bool", "embedding_only": "bool", "num_gqa": "int",
    "rope_frequency_base": "float", "rope_frequency_scale": "float", "tfs_z": "float", "penalize_newline": "bool",
}
_noted_compat: set[str] = set()
#: Options an HTTP request may not set: ``rpc`` would make the server connect to any host a client names.
#: A CLI run given one of them loads the model in its own process, even with a server running.
SERVER_ONLY_OPTIONS = ("rpc",)
#: Load options the CLI never sends to a running server: the server's slots (``OLLAPY_NUM_PARALLEL``) serve every
#: client, so a client's ``--parallel`` uses them instead of reloading the server's model.
SERVER_DECIDED_OPTIONS = ("num_parallel",)


def predict_limit(num_predict: int, n_ctx_train: int) -> int:
    """The most tokens one request may generate: ``num_predict`` when set (>= 0).

    Unset (any negative, Ollama's default -1) is capped at ``n_ctx_train``,
    the model's training context length in tokens (GGUF metadata), as
    llama.cpp's server does: a base model that never emits an end token would
    otherwise generate forever, context shift after context shift. The
    request then ends with ``done_reason`` ``"length"``. Returns -1 (no
    limit) only when ``n_ctx_train`` is unknown (0 or less).
    """
    if num_predict >= 0 or n_ctx_train <= 0:
        return num_predict
    return n_ctx_train


def _unknown(name: str) -> OptionError:
    return OptionError(f"unknown option {name!r}", hint="valid options: " + ", ".join(Options.names()))


def coerce_option(name: str, value: Any) -> Any:
    """Validate one option value (text or JSON value) and return it typed.

    Strict, for the CLI's ``-o`` and ``/set parameter`` and Modelfile
    ``PARAMETER``: an unknown name is an error there (most likely a typo),
    unlike the HTTP API's lenient :func:`api_options`. Raises OptionError
    naming the option and the expected type.
    """
    if name not in _TYPES:
        raise _unknown(name)
    return _coerce(name, _TYPES[name], value)


def _coerce(name: str, typ: str, value: Any) -> Any:
    try:
        if name in LIST_OPTIONS:
            if isinstance(value, str):
                out_list: tuple[str, ...] = (value,)
            elif isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value):
                out_list = tuple(value)
            else:
                raise ValueError
            if name == "dry_sequence_breakers" and not any(out_list):
                raise OptionError("option dry_sequence_breakers must name at least one non-empty string",
                                  hint='e.g. ["\\n", ":"] (llama-server\'s default: "\\n", ":", "\\"", "*")')
            return out_list
        if name == "logit_bias":
            return read_logit_bias(value)
        if typ == "bool":
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in {"1", "true", "yes", "on"}:
                return True
            if s in {"0", "false", "no", "off"}:
                return False
            raise ValueError
        if typ == "int":
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            out = int(value) if not isinstance(value, str) else int(value.strip())
            if name in _MIN and out < _MIN[name]:
                raise OptionError(f"option {name} must be at least {_MIN[name]}, got {out}")
            if name in _MAX and out > _MAX[name]:
                raise OptionError(f"option {name} must be at most {_MAX[name]}, got {out}")
            if name != "seed" and not -_INT32 <= out < _INT32:
                raise OptionError(f"option {name} must be between {-_INT32} and {_INT32 - 1}, got {out}")
            if name == "seed" and not -(2**63) <= out < 2**64:
                raise OptionError(f"option seed must fit in 64 bits, got {out}")
            return out
        if typ == "float":
            if isinstance(value, bool):
                raise ValueError
            out = float(value)
            if out != out or out in (float("inf"), float("-inf")):
                raise ValueError
            low = _FLOAT_MIN.get(name, 0.0)
            if out < low:
                raise OptionError(f"option {name} must be at least {low:g}, got {out}" if low else
                                  f"option {name} must not be negative, got {out}")
            if name in _FLOAT_MAX and out > _FLOAT_MAX[name]:
                raise OptionError(f"option {name} must be at most {_FLOAT_MAX[name]:g}, got {out}")
            return out
        if name == "rpc":
            from ollapy.rpc_endpoint import parse_endpoints

            return ",".join(parse_endpoints(str(value)))
        if name == "tensor_split":
            return _tensor_split(str(value))
        if name == "draft":
            return _draft(value)
        s = str(value).strip().lower()
        if name in _CHOICES and s not in _CHOICES[name]:
            raise OptionError(f"option {name} must be one of {', '.join(_CHOICES[name])}, got {value!r}")
        return s
    except (ValueError, TypeError):
        expected = "a list of strings" if name in LIST_OPTIONS else typ
        raise OptionError(f"option {name} expects {expected}, got {value!r}") from None


def _tensor_split(text: str) -> str:
    parts = [p.strip() for p in text.replace("/", ",").split(",") if p.strip()]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        vals = [-1.0]
    if any(v < 0 or v != v or v == float("inf") for v in vals) or (vals and not any(vals)):
        raise OptionError(f"option tensor_split must be non-negative proportions with one above 0, got {text!r}",
                          hint="e.g. -o tensor_split=3,1")
    return ",".join(f"{v:g}" for v in vals)


def _draft(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError
    text = value.strip()
    if text.lower() in _DRAFT_OFF:
        return ""
    if text.lower() == DRAFT_NGRAM:
        return DRAFT_NGRAM
    if any(c in text for c in "\n\r\x00"):
        raise OptionError(f"option draft must be ngram, a model name or a .gguf path, got {value!r}",
                          hint="e.g. -o draft=ngram, or DRAFT smollm2:135m in a Modelfile")
    return text  # a draft model's name or path, case kept (resolved when the model loads)


def read_logit_bias(value: Any) -> tuple[tuple[int | str, float], ...]:
    """A ``logit_bias`` value as ``((token, bias), ...)``: ``token`` a token id (int >= 0) or a text (every
    token of it gets the bias once the model tokenizes it: :func:`ollapy.engine.sampler.resolve_logit_bias`).

    Accepts OpenAI's object (``{"15339": -100}``: token ids as strings) and llama-server's forms: an object
    whose keys are texts, a list of ``[id or text, bias]`` pairs, and ``false`` as a bias (a ban). A bias is a
    number from -100 to 100 (OpenAI's range); -100 and ``false`` are ``-inf`` (a ban). ``null`` or ``{}`` is
    none; at most :data:`LOGIT_BIAS_ENTRIES` entries. Already-read pairs pass unchanged. Raises OptionError naming
    the bad entry.
    """
    if value is None:
        return ()
    if isinstance(value, str):  # `-o logit_bias={"15339":-100}`: the CLI gives option values as text
        try:
            value = json.loads(value)
        except ValueError:
            raise OptionError(f"logit_bias must be JSON, got {reprlib.repr(value)}",
                              hint='e.g. -o \'logit_bias={"15339": -100}\'') from None
        if isinstance(value, str):
            raise OptionError(f"logit_bias must be an object of token id -> bias, got {reprlib.repr(value)}",
                              hint='e.g. {"15339": -100}')
        return read_logit_bias(value)
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = []
        for el in value:
            if not isinstance(el, (list, tuple)) or len(el) != 2:
                raise OptionError(f"logit_bias entries must be [token, bias] pairs, got {reprlib.repr(el)}",
                                  hint='e.g. [[15339, -100], ["Hello", false]] or {"15339": -100}')
            items.append((el[0], el[1]))
    else:
        raise OptionError(f"logit_bias must be an object of token id -> bias, got {reprlib.repr(value)}",
                          hint='e.g. {"15339": -100} (a request option: a Modelfile cannot set it)')
    if len(items) > LOGIT_BIAS_ENTRIES:
        raise OptionError(f"logit_bias has {len(items)} entries; at most {LOGIT_BIAS_ENTRIES} are allowed")
    out: list[tuple[int | str, float]] = []
    for key, bias in items:
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            key = int(key.strip())
        if isinstance(key, bool) or not isinstance(key, (int, str)) or (isinstance(key, int) and key < 0) or key == "":
            raise OptionError(f"logit_bias key {reprlib.repr(key)} is not a token id or a text",
                              hint="use token ids from /tokenize as keys")
        if bias is False:
            b = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) or bias != bias:
            raise OptionError(f"logit_bias value for {key!r} must be a number from -100 to 100 or false, "
                              f"got {reprlib.repr(bias)}")
        elif bias == -math.inf:
            b = bias
        elif not -LOGIT_BIAS_MAX <= bias <= LOGIT_BIAS_MAX:
            raise OptionError(f"logit_bias value for {key!r} must be from -100 to 100, got {bias}")
        else:
            b = -math.inf if bias <= -LOGIT_BIAS_MAX else float(bias)
        out.append((key, b))
    return tuple(out)


def tensor_split_values(text: str) -> list[float]:
    """``tensor_split`` text (``"3,1"``) -> floats, one per device in llama.cpp's device order; ``""`` -> []."""
    return [float(p) for p in text.split(",") if p.strip()]


def api_options(values: Any) -> dict[str, Any]:
    """Read an HTTP API request's ``options`` object leniently, as Ollama's server does.

    Returns the options ollapy knows, typed (ready for :meth:`Options.merged`).
    A ``null`` value is skipped; an unknown name is logged as a warning and
    skipped; a name from :data:`COMPAT_OPTIONS` is type-checked and ignored
    (noted once per process at INFO). Raises OptionError only when ``values``
    is not an object (nor null) or a known name has a value of the wrong type.
    The CLI and Modelfiles use the strict :func:`coerce_option` instead.
    """
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise OptionError("options must be an object")
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None:
            continue
        if name in SERVER_ONLY_OPTIONS:
            raise OptionError(f"option {name} cannot be set by a request",
                              hint="the server's operator sets it: `ollapy serve -o rpc=…`, OLLAPY_RPC, or "
                                   "PARAMETER rpc in a Modelfile")
        if name in _TYPES:
            out[name] = coerce_option(name, value)
        elif name in COMPAT_OPTIONS:
            _coerce(name, COMPAT_OPTIONS[name], value)
            if name not in _noted_compat:
                _noted_compat.add(name)
                log.info("option %s is accepted for compatibility and has no effect in ollapy", name)
        else:
            log.warning("invalid option provided: %r (ignored)", name)
    return out


def parse_option(text: str) -> tuple[str, Any]:
    """Parse ``key=value`` (CLI ``-o``) into ``(name, typed value)``; raises OptionError."""
    if "=" not in text:
        raise OptionError(f"option {text!r} is not key=value", hint="e.g. -o temperature=0")
    k, v = text.split("=", 1)
    k = k.strip()
    return k, coerce_option(k, v)


def parse_options(items: list[str]) -> dict[str, Any]:
    """Parse many ``key=value`` items; repeated ``stop`` values accumulate."""
    out: dict[str, Any] = {}
    for item in items:
        k, v = parse_option(item)
        if k in LIST_OPTIONS and k in out:
            out[k] = tuple(out[k]) + tuple(v)
        else:
            out[k] = v
    return out


def option_help(name: str) -> str:
    """The one-line description of option ``name`` (:data:`OPTION_HELP`); raises KeyError for an option without
    one, so that a new option cannot reach the generated docs undocumented."""
    return OPTION_HELP[name]


def option_values(name: str) -> str:
    """The values option ``name`` accepts, in words, from the checks :func:`coerce_option` applies (choices,
    integer bounds, the float floor); ``""`` for free text. Raises KeyError for an unknown option."""
    typ = _TYPES[name]
    if name in _CHOICES:
        return ", ".join(_CHOICES[name])
    if name == "seed":
        return "64-bit integer"
    if typ == "int":
        low, high = _MIN.get(name), _MAX.get(name)
        if low is not None and high is not None:
            return f"{low} to {high}"
        return f"{low} or more" if low is not None else "32-bit integer"
    if typ == "float":
        low, high = _FLOAT_MIN.get(name, 0.0), _FLOAT_MAX.get(name)
        if low == float("-inf"):
            return "any number"
        return f"{low:g} to {high:g}" if high is not None else f"{low:g} or more"
    if typ == "bool":
        return "true, false"
    return ""


from ollapy.option_help import OPTION_HELP  # noqa: E402 - the table lives apart (module size)
