"""The live_server fixture helper fails a run whose server never starts answering instead of hanging it."""
from __future__ import annotations

import threading
import time

import pytest
from conftest import live_server


def test_a_server_that_never_answers_fails_within_the_deadline(tmp_path):
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "sitecustomize.py").write_text("import time\ntime.sleep(3600)\n")  # the interpreter never gets to serve
    outcome: list = []

    def start() -> None:
        try:
            with live_server(tmp_path, env={"PYTHONPATH": str(hang)}, start_timeout=3):
                outcome.append("answered")
        except RuntimeError as e:
            outcome.append(e)

    t0 = time.monotonic()
    t = threading.Thread(target=start, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "live_server still waits for a server that never answers"
    assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError), outcome
    assert "did not answer within 3 s" in str(outcome[0]) and time.monotonic() - t0 < 30


def test_a_server_that_exits_early_is_reported(tmp_path):
    with pytest.raises(RuntimeError, match="exited with"):
        with live_server(tmp_path, "--no-such-flag"):
            pass
