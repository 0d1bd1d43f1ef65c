"""One row per agent turn for scripts/check_agents.sh, and the table of them.

``row AGENT TURN RC T0 T1 WORK`` reads the turn's slice of the server log (``WORK/AGENT-TURN.serve.log``, written
by ``ollapy serve`` under ``OLLAPY_DEBUG=1``), the agent's output (``WORK/AGENT-TURN.out``/``.err``) and the agent's
own transcript (Claude Code's ``CLAUDE_CONFIG_DIR/projects/*/*.jsonl``, Codex's ``CODEX_HOME/sessions/**/*.jsonl``),
prints one JSON row (appended by the caller to ``WORK/rows.tsv``) with its result (:func:`verdict`): ``ok``,
``note`` or ``FAIL``, and exits 1 on a FAIL. ``table ROWS`` prints the rows as a table and exits 1 on a FAIL.

Per request the server's debug line ``request N -> slot S: P prompt tokens, R reused (SOURCE)`` gives the prompt
tokens and how many the prompt cache served; uvicorn's access lines give the status codes.
"""
from __future__ import annotations

import glob
import json
import os
import re
import sys

REQUEST = re.compile(r"request \d+ -> slot \d+: (\d+) prompt tokens, (\d+) reused \(([^)]*)\)")
ACCESS = re.compile(r'"(GET|POST|PUT|DELETE|HEAD) (\S+) HTTP/[\d.]+" (\d{3})')


def transcript_tools(agent: str) -> tuple[int, int]:
    """(tool calls, tool results) recorded so far in the agent's own transcript files."""
    calls = results = 0
    if agent == "claude":
        files = glob.glob(os.path.join(os.environ["CLAUDE_CONFIG_DIR"], "projects", "*", "*.jsonl"))
    else:
        files = glob.glob(os.path.join(os.environ["CODEX_HOME"], "sessions", "**", "*.jsonl"), recursive=True)
    for f in files:
        for line in open(f, errors="replace"):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if agent == "claude" and d.get("type") in ("assistant", "user"):
                content = (d.get("message") or {}).get("content")
                for c in content if isinstance(content, list) else ():
                    calls += c.get("type") == "tool_use"
                    results += c.get("type") == "tool_result"
            elif agent == "codex" and d.get("type") == "response_item":
                t = (d.get("payload") or {}).get("type", "")
                calls += t in ("function_call", "custom_tool_call", "local_shell_call")
                results += t in ("function_call_output", "custom_tool_call_output")
    return calls, results


def previous_row(work: str, agent: str) -> dict | None:
    """The last row of ``agent`` in ``WORK/rows.tsv``, if any."""
    rows = [json.loads(line) for line in open(os.path.join(work, "rows.tsv")) if line.strip()]
    return next((r for r in reversed(rows) if r["agent"] == agent), None)


def verdict(row: dict) -> tuple[str, str]:
    """``(ok|note|FAIL, why)``. ``note``: every request got a 2xx and the agent carried out the model's tool calls,
    but the model kept calling tools until the agent's own turn limit (Claude Code's ``--max-turns``) or
    TURN_TIMEOUT stopped it, or wrote calls until the Modelfile's output cap (``num_predict`` MAX_OUT) cut it:
    the completed calls reached the agent and were carried out, and the agent then exits 1 on the cut answer
    (Codex: ``Incomplete response returned, reason: max_output_tokens``, as it does against any server). A small
    model that cannot drive tools, not the server."""
    if row["http_errors"]:
        return "FAIL", "server errors: " + "; ".join(row["http_errors"])[:300]
    if row["rc"] == 0:
        return "ok", ""
    new_calls = row["tool_calls"] - row["prev_tool_calls"]
    new_results = row["tool_results"] - row["prev_tool_results"]
    limit = re.search(r"max(imum number of)? turns", row["error"], re.IGNORECASE) or row["rc"] == 124
    capped = "reason: max_output_tokens" in row["error"]
    if (limit or capped) and new_calls and new_results:
        until = ("TURN_TIMEOUT" if row["rc"] == 124 else "the agent's --max-turns" if limit
                 else "the output cap (MAX_OUT) cut its answer and the agent exited on the cut")
        return "note", f"the model kept calling tools ({new_calls} calls, {new_results} results carried back) until {until}"
    return "FAIL", f"exit {row['rc']}: {row['error']}"


def make_row(agent: str, turn: str, rc: str, t0: str, t1: str, work: str) -> dict:
    """The turn's figures (see the module docstring)."""
    log = open(os.path.join(work, f"{agent}-{turn}.serve.log"), errors="replace").read()
    reqs = [(int(p), int(r), s) for p, r, s in REQUEST.findall(log)]
    statuses = [(path, int(code)) for _, path, code in ACCESS.findall(log)]
    bad = [f"{code} {path}" for path, code in statuses if code >= 400]
    bad += [line.strip()[:200] for line in log.splitlines() if " ERROR " in line]  # a failure after the stream began
    out = open(os.path.join(work, f"{agent}-{turn}.out"), errors="replace").read().strip()
    err = open(os.path.join(work, f"{agent}-{turn}.err"), errors="replace").read().strip()
    calls, results = transcript_tools(agent)
    prev = previous_row(work, agent) or {"tool_calls": 0, "tool_results": 0}
    # the conversation's requests (not an agent's small side requests, such as a title): the turn's first one
    # carries the previous turn's last prompt, its answer, the agent's additions and the new message
    top = max((p for p, _, _ in reqs), default=0)
    conv = [(p, r) for p, r, _ in reqs if p >= top // 2] or [(0, 0)]
    row = {"agent": agent, "turn": int(turn), "rc": int(rc), "wall_s": round(float(t1) - float(t0), 1),
           "requests": len(reqs), "http_errors": bad, "prompt": sum(p for p, _, _ in reqs),
           "reused": sum(r for _, r, _ in reqs), "first_prompt": conv[0][0], "first_reused": conv[0][1],
           "last_prompt": conv[-1][0],
           "per_request": [f"{p}/{r}" for p, r, _ in reqs], "tool_calls": calls, "tool_results": results,
           "prev_tool_calls": prev["tool_calls"], "prev_tool_results": prev["tool_results"],
           "answer": out.replace("\n", " ")[-100:],
           "error": "" if rc == "0" else (out + "\n" + err).strip().replace("\n", " ")[-300:]}
    row["result"], row["why"] = verdict(row)
    return row


def print_table(rows: list[dict]) -> bool:
    """Print the table; True when every turn is ok."""
    print("agent  turn result  exit  wall_s  req   prompt   reused  prefilled | first request: prompt reused prefilled"
          " | vs the previous turn's last request | tool calls/results  answer")
    ok_all = True
    prev: dict[str, dict] = {}
    for r in rows:
        ok_all &= r["result"] != "FAIL"
        p = prev.get(r["agent"])
        vs = ""
        if p is not None and r["first_prompt"]:
            last = p["last_prompt"]
            vs = (f"it had {last}; grew {r['first_prompt'] - last}; "
                  + (f"reused all of it and {r['first_reused'] - last} tokens past it (the answer)"
                     if r["first_reused"] >= last else f"reused {r['first_reused']} of it"))
        print(f"{r['agent']:<6} {r['turn']:>4} {r['result']:<6} {r['rc']:>4} {r['wall_s']:>7} {r['requests']:>4}"
              f" {r['prompt']:>8} {r['reused']:>8} {r['prompt'] - r['reused']:>10} | {r['first_prompt']:>20}"
              f" {r['first_reused']:>6} {r['first_prompt'] - r['first_reused']:>9} | {vs or '-'} |"
              f" {r['tool_calls'] - r['prev_tool_calls']}/{r['tool_results'] - r['prev_tool_results']}"
              f"  {r['answer'][-60:]!r}")
        if r["why"]:
            print(f"       {r['result']}: {r['why']}")
        print(f"       per request (prompt/reused): {' '.join(r['per_request'])}")
        prev[r["agent"]] = r
    return ok_all


def main(argv: list[str]) -> int:
    if argv[0] == "row":
        row = make_row(*argv[1:7])
        print(json.dumps(row))
        return 0 if row["result"] != "FAIL" else 1
    rows = [json.loads(line) for line in open(argv[1]) if line.strip()]
    return 0 if print_table(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
