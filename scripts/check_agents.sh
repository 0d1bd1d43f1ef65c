#!/usr/bin/env bash
# Try the real coding agents, unmodified from npm, against `ollapy serve` (issues 21 and 39): one conversation of
# AGENT_TURNS turns (default 3) per agent, through `ollapy launch`: `claude -p PROMPT`, then
# `claude -p --continue PROMPT` for each further turn; `codex exec PROMPT`, then `codex exec resume --last PROMPT`.
#
# Installs @anthropic-ai/claude-code and @openai/codex at the versions tried (CLAUDE_VERSION, CODEX_VERSION) into a
# cache directory (OLLAPY_AGENTS_DIR, default ~/.cache/ollapy/agents; never the repository), creates the Gemma 3
# test model at num_ctx 32768 in a scratch store, starts `ollapy serve` (OLLAPY_DEBUG=1: one line per request with
# its prompt tokens and how many the prompt cache served) on a free loopback port, and runs the turns. It prints one
# row per turn, `ok` or `FAIL`, and exits non-zero on a FAIL. A turn is ok when the agent exits 0 within
# TURN_TIMEOUT seconds and every request of the turn got a 2xx. Per turn: the requests, the prompt tokens, how many
# the prompt cache served and how many were prefilled (summed over the turn, and for the turn's largest request),
# the tool calls the agent recorded in its own transcript (and how many of them got a result), and its answer.
#
# The test model is Gemma 3 270M *base*: it has no chat template (ollapy's Gemma fallback renders the turns) and
# does not end a turn by itself. With the agents' defaults it writes until the output cap, and both agents treat
# that as an error: Claude Code answers stop_reason "max_tokens" with up to 3 "Output token limit hit. Resume
# directly" retries and then exits 1 ("API Error: Claude's response exceeded the N output token maximum");
# Codex reports "Incomplete response returned, reason: max_output_tokens" (response.incomplete) and exits 1.
# So, as a user of such a model would, the Modelfile makes it greedy and end its answer at the first line end
# (PARAMETER stop "\n": stop_reason "end_turn" / status "completed", as an end-of-turn token) and caps its output
# at MAX_OUT tokens (num_predict; Claude Code also gets CLAUDE_CODE_MAX_OUTPUT_TOKENS=MAX_OUT, which `launch` keeps
# as the user's smaller value; Codex 0.171 has no output setting). With tools the answer is a JSON call or response
# (llama.cpp's generic tool format, under a grammar), longer than a word: MAX_OUT 64 cut Claude Code's call.
#
# AGENT_TOOLS=on (the default) keeps the agents' default tools. AGENT_TOOLS=off runs them without tools (Claude
# Code `--tools ""`; Codex `--disable` of the features that add function tools and `-c web_search=disabled`): the
# system prompt still is the agent's own, so the later turns still show the prompt cache at work.
#
# Slow on 2 cores (with tools Claude Code's prompt is ~11,000 tokens, Codex's ~5,000; without, ~1,400 and ~4,500),
# and not part of the test run. Usage: nice -n 10 scripts/check_agents.sh   (PYTHON=... picks the interpreter;
# ONLY_AGENTS="claude" runs one agent; KEEP_WORK=1 keeps the scratch folder with the server log and transcripts)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
AGENTS=${OLLAPY_AGENTS_DIR:-$HOME/.cache/ollapy/agents}
CLAUDE_VERSION=${CLAUDE_VERSION:-2.1.332} CODEX_VERSION=${CODEX_VERSION:-0.171.0}
PROMPT=${PROMPT:-"Reply with one word: ready"}
MAX_OUT=${MAX_OUT:-256}  # a tools-on answer is a JSON call (64 cut Claude Code's); the agents ask for up to 32k
AGENT_TOOLS=${AGENT_TOOLS:-on}
AGENT_TURNS=${AGENT_TURNS:-3}
TURN_TIMEOUT=${TURN_TIMEOUT:-1800}  # seconds a turn may take (a cold prefill of Claude Code's tools-on prompt)
CODEX_TURN_TIMEOUT=${CODEX_TURN_TIMEOUT:-$TURN_TIMEOUT}  # Codex has no turn limit of its own
CLAUDE_MAX_TURNS=${CLAUDE_MAX_TURNS:-2}  # claude -p --max-turns: model calls per turn (a looping model stops there)
ONLY_AGENTS=${ONLY_AGENTS:-"claude codex"}
case "$AGENT_TOOLS" in
  off) CLAUDE_TOOLS=(--tools "")
       CODEX_TOOLS=(--disable goals --disable multi_agent --disable shell_tool --disable unified_exec --disable view_image
                    -c 'tools.experimental_request_user_input={enabled=false}' -c web_search=disabled) ;;
  on) CLAUDE_TOOLS=() CODEX_TOOLS=() ;;
  *) echo "AGENT_TOOLS must be on or off, not $AGENT_TOOLS" >&2; exit 2 ;;
esac

mkdir -p "$AGENTS"
if [ ! -x "$AGENTS/node_modules/.bin/claude" ] || [ ! -x "$AGENTS/node_modules/.bin/codex" ]; then
  echo "installing the agents into $AGENTS ..." >&2
  npm install --prefix "$AGENTS" --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_VERSION" "@openai/codex@$CODEX_VERSION" >&2
fi
export PATH="$AGENTS/node_modules/.bin:$PATH"
echo "claude $(claude --version 2>/dev/null | head -1); codex $(codex --version 2>/dev/null | head -1); ollapy $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null); $(date -u '+%F %H:%M UTC')"

WORK=$(mktemp -d)
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export OLLAPY_HOST=127.0.0.1:$PORT OLLAPY_MODELS=$WORK/models OLLAPY_CACHE_DIR=$WORK/cache XDG_STATE_HOME=$WORK/state
# Codex refuses a home under /tmp; each run starts both agents from empty sessions (the turns continue these)
export CODEX_HOME=$AGENTS/codex-home CLAUDE_CONFIG_DIR=$AGENTS/claude-config CLAUDE_CODE_MAX_OUTPUT_TOKENS=$MAX_OUT
rm -rf "$CODEX_HOME/sessions" "$CLAUDE_CONFIG_DIR/projects"
# Claude Code gives up on a stream after 5 minutes without content (and retries from scratch); a cold prefill of
# its tools-on prompt can take longer than that on a busy 2-core machine
export CLAUDE_STREAM_IDLE_TIMEOUT_MS=3600000 API_TIMEOUT_MS=3600000
mkdir -p "$CODEX_HOME" "$CLAUDE_CONFIG_DIR" "$WORK/project"

GEMMA=$("$PY" "$ROOT/scripts/fetch_test_models.py" | awk '$1 == "gemma3" {print $2}')
printf 'FROM %s\nPARAMETER num_ctx 32768\nPARAMETER num_predict %s\nPARAMETER temperature 0\nPARAMETER stop "\\n"\nPARAMETER stop "<end_of_turn>"\nPARAMETER stop "<start_of_turn>"\n' \
  "$GEMMA" "$MAX_OUT" > "$WORK/Modelfile"
echo "--- Modelfile ---"; cat "$WORK/Modelfile"; echo "--- agent tools: $AGENT_TOOLS, $AGENT_TURNS turns ---"
"$PY" -m ollapy.cli.main create gemma3-agents -f "$WORK/Modelfile" >&2

OLLAPY_DEBUG=1 "$PY" -m ollapy.cli.main serve > "$WORK/serve.log" 2>&1 &
SERVER=$!
cleanup() {
  kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
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

FAILED=0
ROWS=$WORK/rows.tsv
: > "$ROWS"
run_turn() {  # agent, turn, timeout (s), then `ollapy launch` arguments
  local agent=$1 turn=$2 limit=$3; shift 3
  local log0 t0 t1 rc
  log0=$(wc -c < "$WORK/serve.log")
  t0=$(date +%s.%N)
  set +e
  (cd "$WORK/project" && timeout "$limit" "$PY" -m ollapy.cli.main launch "$@" < /dev/null \
     > "$WORK/$agent-$turn.out" 2> "$WORK/$agent-$turn.err")
  rc=$?
  set -e
  t1=$(date +%s.%N)
  tail -c +"$((log0 + 1))" "$WORK/serve.log" > "$WORK/$agent-$turn.serve.log"
  "$PY" "$ROOT/scripts/agent_turn_report.py" row "$agent" "$turn" "$rc" "$t0" "$t1" "$WORK" >> "$ROWS.new" || FAILED=1
  cat "$ROWS.new" >> "$ROWS"; rm -f "$ROWS.new"
  "$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); print(r["result"], r["agent"], "turn", r["turn"], "exit", r["rc"], r["wall_s"], "s", r["per_request"], r["why"])' "$(tail -n 1 "$ROWS")"
}

for agent in $ONLY_AGENTS; do
  for turn in $(seq 1 "$AGENT_TURNS"); do
    [ "$turn" = 1 ] && p=$PROMPT || p="$PROMPT (turn $turn)"
    case "$agent" in
      claude) cont=(); [ "$turn" = 1 ] || cont=(--continue)
              run_turn claude "$turn" "$TURN_TIMEOUT" claude --model gemma3-agents -- -p "${cont[@]}" --max-turns "$CLAUDE_MAX_TURNS" \
                "$p" "${CLAUDE_TOOLS[@]}" ;;
      codex) res=(); [ "$turn" = 1 ] || res=(resume --last)
             run_turn codex "$turn" "$CODEX_TURN_TIMEOUT" codex --model gemma3-agents -- exec --skip-git-repo-check "${CODEX_TOOLS[@]}" "${res[@]}" "$p" ;;
      *) echo "unknown agent $agent" >&2; exit 2 ;;
    esac
  done
done
echo
"$PY" "$ROOT/scripts/agent_turn_report.py" table "$ROWS" || FAILED=1
if ! kill -0 "$SERVER" 2>/dev/null; then
  echo "--- the server is gone; its log (tail) ---"
  tail -n 30 "$WORK/serve.log"
  FAILED=1
fi
exit $FAILED
