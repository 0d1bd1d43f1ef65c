#!/usr/bin/env bash
# Try the real coding agents, unmodified from npm, against `ollapy serve` (issue 21, item 8).
#
# Installs @anthropic-ai/claude-code and @openai/codex into a cache directory (OLLAPY_AGENTS_DIR, default
# ~/.cache/ollapy/agents; never the repository), creates the Gemma 3 test model at num_ctx 32768 in a scratch
# store, starts `ollapy serve` on a free loopback port, and runs a non-interactive prompt with each agent twice
# through `ollapy launch`. Each run must exit 0. For each run it prints the agent's answer and, from the server's
# /metrics, the requests it made, their time to first token and how many prompt tokens the prompt cache served:
# the second run of an agent should reuse the first one's system prompt and tools.
#
# The test model is Gemma 3 270M *base*: it has no chat template (ollapy's Gemma fallback renders the turns) and
# does not end a turn by itself. With the agents' defaults it writes until the output cap, and both agents treat
# that as an error: Claude Code answers stop_reason "max_tokens" with up to 3 "Output token limit hit. Resume
# directly" retries and then exits 1 ("API Error: Claude's response exceeded the N output token maximum");
# Codex reports "Incomplete response returned, reason: max_output_tokens" (response.incomplete) and exits 1.
# With tools, the answer is a JSON call or response (llama.cpp's generic tool format, under a grammar), and the
# base model calls tools at random (Codex's create_goal/request_user_input, Claude Code's tools) and loops.
# So, as a user of such a model would, the Modelfile makes it greedy and end its answer at the first line end
# (PARAMETER stop "\n": stop_reason "end_turn" / status "completed", as an end-of-turn token), and the agents run
# without tools (AGENT_TOOLS=off, the default: Claude Code `--tools ""`; Codex `--disable` of the features that
# add function tools and `-c web_search=disabled`). AGENT_TOOLS=on keeps the agents' tools (for a model that can
# use them). The system prompt still is the agent's own, so the second run shows the prompt cache at work.
#
# Slow on 2 cores (Codex's prompt is ~4,500 tokens without tools, Claude Code's ~1,400; with tools many thousand
# more) and not part of the test run. Usage: scripts/check_agents.sh   (PYTHON=... to pick the interpreter)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
AGENTS=${OLLAPY_AGENTS_DIR:-$HOME/.cache/ollapy/agents}
PROMPT=${PROMPT:-"Reply with one word: ready"}
MAX_OUT=${MAX_OUT:-128}  # the agents ask for up to 32k output tokens; a base test model would use them all
AGENT_TOOLS=${AGENT_TOOLS:-off}
if [ "$AGENT_TOOLS" = off ]; then
  CLAUDE_TOOLS=(--tools "")
  CODEX_TOOLS=(--disable goals --disable multi_agent --disable shell_tool --disable unified_exec --disable view_image
               -c 'tools.experimental_request_user_input={enabled=false}' -c web_search=disabled)
else
  CLAUDE_TOOLS=() CODEX_TOOLS=()
fi

mkdir -p "$AGENTS"
if [ ! -x "$AGENTS/node_modules/.bin/claude" ] || [ ! -x "$AGENTS/node_modules/.bin/codex" ]; then
  echo "installing the agents into $AGENTS ..." >&2
  npm install --prefix "$AGENTS" --no-audit --no-fund --loglevel=error @anthropic-ai/claude-code @openai/codex >&2
fi
export PATH="$AGENTS/node_modules/.bin:$PATH"
echo "claude $(claude --version 2>/dev/null | head -1); codex $(codex --version 2>/dev/null | head -1)"

WORK=$(mktemp -d)
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export OLLAPY_HOST=127.0.0.1:$PORT OLLAPY_MODELS=$WORK/models OLLAPY_CACHE_DIR=$WORK/cache XDG_STATE_HOME=$WORK/state
export CODEX_HOME=$AGENTS/codex-home  # Codex refuses a home under /tmp
export CLAUDE_CONFIG_DIR=$AGENTS/claude-config CLAUDE_CODE_MAX_OUTPUT_TOKENS=$MAX_OUT
# Claude Code gives up on a stream after 5 minutes without content (and retries from scratch); a cold prefill of
# its ~20,000-token prompt can take longer than that on a busy 2-core machine
export CLAUDE_STREAM_IDLE_TIMEOUT_MS=3600000 API_TIMEOUT_MS=3600000
mkdir -p "$CODEX_HOME" "$CLAUDE_CONFIG_DIR" "$WORK/project"

GEMMA=$("$PY" "$ROOT/scripts/fetch_test_models.py" | awk '$1 == "gemma3" {print $2}')
printf 'FROM %s\nPARAMETER num_ctx 32768\nPARAMETER num_predict %s\nPARAMETER temperature 0\nPARAMETER stop "\\n"\nPARAMETER stop "<end_of_turn>"\nPARAMETER stop "<start_of_turn>"\n' \
  "$GEMMA" "$MAX_OUT" > "$WORK/Modelfile"
echo "--- Modelfile ---"; cat "$WORK/Modelfile"; echo "--- agent tools: $AGENT_TOOLS ---"
"$PY" -m ollapy.cli.main create gemma3-agents -f "$WORK/Modelfile" >&2

"$PY" -m ollapy.cli.main serve > "$WORK/serve.log" 2>&1 &
SERVER=$!
cleanup() { kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
"$PY" - <<EOF
import time, httpx
for _ in range(600):
    try:
        if httpx.get("http://$OLLAPY_HOST/", timeout=1).status_code == 200:
            break
    except httpx.HTTPError:
        time.sleep(0.2)
else:
    raise SystemExit("ollapy serve did not answer")
EOF

snapshot() {  # requests, TTFT sum (s), prompt tokens, cached tokens, from the server's /metrics
  "$PY" - <<EOF
import httpx
from prometheus_client.parser import text_string_to_metric_families
v = {"n": 0.0, "ttft": 0.0, "prompt": 0.0, "cached": 0.0}
try:
    text = httpx.get("http://$OLLAPY_HOST/metrics", timeout=30).text
except httpx.HTTPError:
    raise SystemExit("nan nan nan nan")  # the server is gone: the run's figures are unknown
for fam in text_string_to_metric_families(text):
    for s in fam.samples:
        if s.name == "ollapy_time_to_first_token_seconds_count":
            v["n"] += s.value
        elif s.name == "ollapy_time_to_first_token_seconds_sum":
            v["ttft"] += s.value
        elif s.name == "ollapy_tokens_total" and s.labels.get("kind") in ("prompt", "cached"):
            v[s.labels["kind"]] += s.value
print(v["n"], v["ttft"], v["prompt"], v["cached"])
EOF
}

FAILED=0
run_agent() {  # label, then `ollapy launch` arguments
  local label=$1; shift
  local before after t0 t1 rc
  before=$(snapshot 2>&1 || true)
  t0=$(date +%s.%N)
  set +e
  (cd "$WORK/project" && "$PY" -m ollapy.cli.main launch "$@" < /dev/null > "$WORK/out" 2> "$WORK/err")
  rc=$?
  set -e
  t1=$(date +%s.%N)
  after=$(snapshot 2>&1 || true)
  "$PY" - "$label" "$rc" "$t0" "$t1" "$before" "$after" "$WORK/out" "$WORK/err" <<'EOF'
import sys
label, rc, t0, t1, before, after, out, err = sys.argv[1:]
b, a = [list(map(float, x.split())) for x in (before, after)]
n, ttft, evaluated, cached = (a[i] - b[i] for i in range(4))  # ollapy_tokens: prompt = evaluated, cached = reused
prompt = evaluated + cached
answer = open(out, errors="replace").read().strip().replace("\n", " ")[:120]
print(f"{label}: exit {rc}, {float(t1) - float(t0):.1f} s wall, {n:.0f} requests, TTFT {ttft:.2f} s in all"
      f" ({ttft / max(n, 1):.2f} s each), prompt tokens {prompt:.0f}, served by the prompt cache {cached:.0f}"
      f" ({100 * cached / max(prompt, 1):.0f}%); answer: {answer!r}")
if rc != "0":
    print("  stderr: " + open(err, errors="replace").read().strip().replace("\n", "\n  ")[-2000:])
EOF
  [ "$rc" = 0 ] || FAILED=1
}

for i in 1 2; do
  run_agent "claude run $i" claude --model gemma3-agents -- -p "$PROMPT" "${CLAUDE_TOOLS[@]}"
done
for i in 1 2; do
  run_agent "codex run $i" codex --model gemma3-agents -- exec --skip-git-repo-check "${CODEX_TOOLS[@]}" "$PROMPT"
done
if [ "$FAILED" != 0 ] || ! kill -0 "$SERVER" 2>/dev/null; then
  echo "--- server log (tail) ---"
  tail -n 30 "$WORK/serve.log"
  FAILED=1
fi
exit $FAILED
