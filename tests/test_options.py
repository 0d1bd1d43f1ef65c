"""Option parsing: the HTTP API reads ``options`` leniently as Ollama does; the CLI and Modelfiles stay strict."""
from __future__ import annotations

import logging

import pytest

from ollapy.errors import OptionError
from ollapy.options import COMPAT_OPTIONS, Options, api_options, parse_option, parse_options


def test_api_options_skip_unknown_and_null_and_type_check_the_rest(caplog):
    with caplog.at_level(logging.INFO, logger="ollapy.options"):
        got = api_options({"temperature": None, "stop": None, "bogus": 1, "top_k": 20.0, "stop ": "x",
                           "mirostat": "2", "tfs_z": 0.9, "use_mmap": False, "seed": 3})
    assert got == {"top_k": 20, "mirostat": 2, "seed": 3}
    warned = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert warned == ["invalid option provided: 'bogus' (ignored)", "invalid option provided: 'stop ' (ignored)"]
    assert Options().merged(got).mirostat == 2 and Options().merged(got).temperature == 0.8
    assert api_options(None) == {} and api_options({}) == {}


@pytest.mark.parametrize(("values", "name"), [
    ({"temperature": "hot"}, "temperature"), ({"num_ctx": 1.5}, "num_ctx"), ({"stop": [1]}, "stop"),
    ({"use_mmap": "maybe"}, "use_mmap"), ({"tfs_z": "x"}, "tfs_z"), ({"mirostat": 3}, "mirostat"),
    ({"mirostat_tau": -1}, "mirostat_tau"),
])
def test_api_options_refuse_a_wrong_type_for_a_known_name(values, name):
    with pytest.raises(OptionError, match=name):
        api_options(values)


def test_api_options_must_be_an_object():
    with pytest.raises(OptionError, match="options must be an object"):
        api_options(["temperature", 0])


def test_cli_stays_strict_about_names():
    assert parse_options(["mirostat=2", "mirostat_tau=4", "mirostat_eta=0.2"]) == \
        {"mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2}
    for name in ("bogus", *COMPAT_OPTIONS):
        with pytest.raises(OptionError, match=f"unknown option '{name}'"):
            parse_option(f"{name}=1")
