"""The draft policy's step times, remembered across processes (ollapy.engine.spec.step_costs)."""
from __future__ import annotations

import json
import os
import re
import statistics
from dataclasses import replace

from conftest import run_cli

from ollapy import config
from ollapy.engine.model import LoadedModel
from ollapy.engine.spec.speculator import STALE_STEPS
from ollapy.engine.spec.step_costs import KEEP, StepCostStore, step_cost_key
from ollapy.options import Options

COPY = ("Repeat this paragraph exactly: The lighthouse at Skerry Point was built in 1851 from granite quarried on the "
        "island itself. Its lamp burned colza oil until 1904, when a paraffin vapour burner replaced it.")


def test_the_store_keeps_the_last_steps_per_batch_size_and_ignores_foreign_files(tmp_path):
    store = StepCostStore(tmp_path / "step-costs")
    assert store.load("abc123") == []  # nothing stored yet
    steps = [(1, 0.010 + i * 1e-4) for i in range(20)] + [(4, 0.025)] * 3
    store.save("abc123", steps)
    back = store.load("abc123")
    assert [s for r, s in back if r == 1] == [s for _, s in steps[20 - KEEP:20]]  # the newest KEEP
    assert [(r, s) for r, s in back if r == 4] == [(4, 0.025)] * 3
    (tmp_path / "step-costs" / "abc123.json").write_text("{not json")
    assert store.load("abc123") == []
    (tmp_path / "step-costs" / "abc123.json").write_text(json.dumps({"format": 99, "steps": [[1, 0.01]]}))
    assert store.load("abc123") == []


def test_the_key_changes_with_what_a_step_costs(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    k = step_cost_key(model, {"threads": 2, "slots": 1})
    assert k.isalnum() and k == step_cost_key(model, {"slots": 1, "threads": 2})
    assert k != step_cost_key(model, {"threads": 4, "slots": 1})
    os.utime(model, ns=(1, 1))  # another file at the same path
    assert k != step_cost_key(model, {"threads": 2, "slots": 1})


def _drafted(m: LoadedModel) -> int:
    req = m.submit(m.chat_prompt([{"role": "user", "content": COPY}]),
                   Options(num_ctx=512, temperature=0, num_predict=48, draft="ngram"), cache=False)
    list(req)
    return len(req.output_tokens)


def test_a_new_load_starts_from_the_steps_the_last_one_measured(smollm2_path):
    opts = Options(num_ctx=512, temperature=0, draft="ngram")
    with LoadedModel(smollm2_path, opts) as m:
        assert m.engine.spec.cost().measured == {}  # nothing remembered yet: the prior
        assert _drafted(m) > 0
        steps = m.engine.spec.measured_steps()
    assert steps and {r for r, _ in steps} >= {1}
    files = list(config.step_costs_dir().glob("*.json"))
    assert len(files) == 1
    with LoadedModel(smollm2_path, opts) as m2:  # before any request: the saved steps price the policy
        cost = m2.engine.spec.cost()
        for rows in {r for r, _ in steps}:
            mine = [s for r, s in steps if r == rows]
            if len(mine) >= 3:
                assert cost.measured[rows] == statistics.median(mine)
    with LoadedModel(smollm2_path, Options(num_ctx=1024, temperature=0, draft="ngram")) as m3:
        assert m3.engine.spec.cost().measured == {}  # another context length: another key


def test_ollapy_run_remembers_step_times_for_the_next_process(smollm2_path, tmp_path):
    env = {"OLLAPY_CACHE_DIR": str(tmp_path / "cache")}
    args = ["run", str(smollm2_path), "--verbose", "-o", "temperature=0", "-o", "num_predict=48", "-o", "draft=ngram",
            COPY]
    first = run_cli(*args, env=env)
    assert first.returncode == 0, first.stderr.decode()
    files = list((tmp_path / "step-costs").glob("*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())["steps"]
    second = run_cli(*args, env=env)
    assert second.returncode == 0 and second.stdout == first.stdout
    again = json.loads(files[0].read_text())["steps"]
    assert again != saved  # the second process saved its own steps on top of the first's
    pinned_dir = tmp_path / "pinned"
    pinned = run_cli(*args, env={"OLLAPY_CACHE_DIR": str(pinned_dir / "cache"), "OLLAPY_DRAFT_ROW_COST": "0.5"})
    assert pinned.returncode == 0 and pinned.stdout == first.stdout
    assert not (pinned_dir / "step-costs").exists()  # a pinned cost is neither read nor written


LOG = "".join(f"Line {i}: the keeper logged wind speed {3 + (i * 7) % 37} knots and wave height {1 + i % 8}.{i % 10} "
              f"metres at the north light.\n" for i in range(1, 21))


def test_steps_timed_on_a_busy_machine_stop_drafting_only_until_they_go_stale(gemma_path):
    """A remembered table that prices extra rows at 25-200 one-row steps (timed while a compile ran) keeps the
    next process from drafting, but only for STALE_STEPS steps: then the extra rows are priced as unmeasured,
    the slot drafts on the repeating log, and what the process saves holds none of the old prices."""
    opts = Options(num_ctx=2048, temperature=0, repeat_penalty=1.0, draft="ngram")
    with LoadedModel(gemma_path, opts) as m:
        store, key = m._step_costs
    store.save(key, [(1, 0.02)] * KEEP + [(r, 0.5 * r) for r in range(2, 9) for _ in range(KEEP)])
    with LoadedModel(gemma_path, opts) as m:
        prompt = m.raw_prompt(LOG)
        first = m.submit(prompt, replace(opts, num_predict=STALE_STEPS - 28), cache=False)
        list(first)
        assert first.metrics.eval_count == STALE_STEPS - 28 and first.metrics.draft_tokens == 0
        second = m.submit(prompt, replace(opts, num_predict=STALE_STEPS), cache=False)
        list(second)
        assert second.metrics.draft_tokens > 0 and second.metrics.draft_accepted > 0
        assert list(second.output_tokens[:STALE_STEPS - 28]) == list(first.output_tokens)
    saved = store.load(key)
    assert {r for r, _ in saved} > {1} and all(s < 0.5 for _, s in saved)


def test_a_short_run_does_not_pass_on_prices_it_did_not_measure(smollm2_path, tmp_path):
    """`ollapy run` is shorter than STALE_STEPS: a process that priced extra rows by a poisoned table (timed while
    the machine was busy) drafts nothing, but saves only the one-row steps it measured, so the next process
    prices extra rows afresh and drafts again, with the same text."""
    env = {"OLLAPY_CACHE_DIR": str(tmp_path / "cache")}
    args = ["run", str(smollm2_path), "--verbose", "-o", "temperature=0", "-o", "num_predict=48", "-o", "draft=ngram",
            COPY]
    first = run_cli(*args, env=env)
    assert first.returncode == 0, first.stderr.decode()
    assert int(re.search(rb"draft:\s+(\d+) proposed", first.stderr).group(1)) > 0
    (store_file,) = (tmp_path / "step-costs").glob("*.json")
    store_file.write_text(json.dumps({"format": 1, "steps": [[1, 0.01]] * KEEP + [[r, 0.5] for r in range(2, 9)
                                                                                  for _ in range(KEEP)]}))
    poisoned = run_cli(*args, env=env)
    assert poisoned.returncode == 0 and poisoned.stdout == first.stdout
    assert re.search(rb"draft:\s+0 proposed", poisoned.stderr)
    assert {r for r, _ in json.loads(store_file.read_text())["steps"]} == {1}
    healed = run_cli(*args, env=env)
    assert healed.returncode == 0 and healed.stdout == first.stdout
    assert int(re.search(rb"draft:\s+(\d+) proposed", healed.stderr).group(1)) > 0
