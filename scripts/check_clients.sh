#!/usr/bin/env bash
# Try the programs people point at Ollama, unmodified from their registries, against `ollapy serve` (issue 39).
#
# Installs each client at a pinned version into a scratch folder (OLLAPY_CLIENTS_DIR, default
# ~/.cache/ollapy/clients; npm packages under npm/, each PyPI client in its own virtual environment), starts
# `ollapy serve` on a free loopback port with a scratch store holding the test models, and prints one line per
# check: `ok NAME` or `FAIL NAME: why`, then a summary. Heavy (about 5 GB of installs, most of it Open WebUI) and
# not part of CI: run it by hand, e.g. `nice -n 10 scripts/check_clients.sh`. ONLY="sdk llm" runs some groups
# (sdk, js, llm, aider, continue, fim, opencode, agents, more, openwebui; and task, not in the default: the agents
# doing a hello.py task with their tools, for an instruct MODEL); SKIP="openwebui" leaves some out.
#
# Models: `smol` (SmolLM2 135M, num_ctx 4096) for the SDKs, llm, aider, Open WebUI; `gemma3-agents` (Gemma 3 270M
# base at num_ctx 32768, greedy, ending its answer at a line end, num_predict MAX_OUT) for the agents, Continue
# and opencode, whose system prompts and tools run to thousands of tokens; `qwen2.5-coder:0.5b` (Qwen2.5-Coder 0.5B
# Instruct, the third test model) for code completion (group fim: the requests of Continue's Ollama provider, llama.vscode
# and llama.vim, replayed by scripts/fim_replays.py, which reads each answer as its client does). What a 135M/270M
# model cannot do (use tools sensibly, stop by itself, follow a JSON schema it was not trained on) is reported as a
# note, not a FAIL, where the server answered correctly. MODEL=NAME (a store name such as qwen2.5-coder:0.5b, or
# a GGUF path) runs the checks on that model instead: `smol` and `gemma3-agents` are made FROM it (the agents'
# without Gemma's stop strings), e.g. `MODEL=qwen2.5-coder:0.5b ONLY="sdk js llm fim" scripts/check_clients.sh`.
#
# Agents (AGENT_TURNS=3): Claude Code `claude -p` then `claude -p --continue` twice, Codex `codex exec` then
# `codex exec resume --last` twice, with their default tools on, through `ollapy launch`; per turn the prompt
# tokens, how many the prompt cache served and how many were prefilled (from the server's /metrics). Group more:
# pi, Qwen Code, Kilo and Cline through `ollapy launch` with Qwen2.5-Coder 0.5B Instruct at num_ctx 32768
# (`qwen2.5-coder:0.5b-32k`; a base model cannot answer them), one first prompt each (the section at the end).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
DIR=${OLLAPY_CLIENTS_DIR:-$HOME/.cache/ollapy/clients}
MAX_OUT=${MAX_OUT:-256}  # the agents' output cap: a tools-on answer is a JSON call, longer than a word
AGENT_TURNS=${AGENT_TURNS:-3}
INSTALL_TIMEOUT=${INSTALL_TIMEOUT:-2400}  # seconds an install may take (Open WebUI pulls torch & co.)
ONLY=${ONLY:-"sdk js llm aider continue fim opencode agents more openwebui"}
SKIP=${SKIP:-}
# pinned versions (the ones tried for docs/clients.md)
NPM_PKGS="@continuedev/cli@1.5.47 opencode-ai@1.18.33 @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 ollama@0.6.4"
LLM_PKGS="llm==0.36 llm-ollama==0.19.1 ollama==0.6.3 openai==3.60.0 anthropic==2.17.0 prometheus-client"
AIDER_PKG="aider-chat==0.86.2"
OWUI_PKG="open-webui==0.12.4"

want() { [[ " $ONLY " == *" $1 "* && " $SKIP " != *" $1 "* ]]; }
want_any() { local g; for g in "$@"; do want "$g" && return 0; done; return 1; }
OK=0 FAILED=0 NOTES=()
ok() { echo "ok   $1"; OK=$((OK + 1)); }
fail() { echo "FAIL $1: $2"; FAILED=$((FAILED + 1)); }
note() { echo "note $1"; NOTES+=("$1"); }
# check NAME TIMEOUT CMD...: ok when CMD exits 0 within TIMEOUT s, else FAIL with its last output line
check() {
  local name=$1 limit=$2; shift 2
  local out
  out=$(timeout "$limit" "$@" 2>&1)
  local rc=$?
  if [ $rc = 0 ]; then ok "$name"; else fail "$name" "exit $rc: $(echo "$out" | grep -v '^\s*$' | tail -n 3 | tr '\n' ' ' | cut -c1-300)"; fi
  echo "$out" > "$WORK/last-$name.log"
  return $rc
}

# ---- installs ----------------------------------------------------------------------------------------------
mkdir -p "$DIR"
install_npm() {
  [ -x "$DIR/npm/node_modules/.bin/cn" ] && [ -x "$DIR/npm/node_modules/.bin/opencode" ] && \
    [ -x "$DIR/npm/node_modules/.bin/claude" ] && [ -x "$DIR/npm/node_modules/.bin/codex" ] && return 0
  timeout "$INSTALL_TIMEOUT" npm install --prefix "$DIR/npm" --no-audit --no-fund --loglevel=error $NPM_PKGS >&2
}
install_venv() {  # name, packages...
  local name=$1; shift
  [ -f "$DIR/$name/.installed" ] && return 0
  python3.11 -m venv "$DIR/$name" && timeout "$INSTALL_TIMEOUT" "$DIR/$name/bin/pip" install -q "$@" >&2 \
    && touch "$DIR/$name/.installed"
}
T0=$(date +%s)
want_any js continue opencode agents task && { install_npm || echo "npm install failed" >&2; }
want_any sdk llm continue opencode openwebui && { install_venv llm $LLM_PKGS || echo "llm venv install failed" >&2; }
want aider && { install_venv aider $AIDER_PKG || echo "aider install failed" >&2; }
OWUI_OK=0
if want openwebui; then
  if install_venv open-webui $OWUI_PKG; then OWUI_OK=1; else echo "open-webui install failed or took over ${INSTALL_TIMEOUT}s" >&2; fi
fi
echo "installs: $(( $(date +%s) - T0 )) s"
export PATH="$DIR/npm/node_modules/.bin:$PATH"
CPY=$DIR/llm/bin/python  # the SDKs' interpreter

# ---- server ------------------------------------------------------------------------------------------------
WORK=$(mktemp -d)
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
export OLLAPY_HOST=127.0.0.1:$PORT OLLAPY_MODELS=$WORK/models OLLAPY_CACHE_DIR=$WORK/cache XDG_STATE_HOME=$WORK/state
export OLLAMA_HOST=$URL OLLAMA_API_BASE=$URL
"$PY" -m ollapy.cli.main serve > "$WORK/serve.log" 2>&1 &
SERVER=$!
OWUI_PID=
cleanup() {
  [ -n "$OWUI_PID" ] && kill "$OWUI_PID" 2>/dev/null
  kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 600); do curl -sf "$URL/" > /dev/null && break; sleep 0.2; done
read -r SMOL GEMMA QWEN < <("$PY" "$ROOT/scripts/fetch_test_models.py" | \
  awk '$1 == "smollm2" {s=$2} $1 == "gemma3" {g=$2} $1 == "qwen-coder" {q=$2} END {print s, g, q}')
printf 'FROM %s\n' "$QWEN" > "$WORK/Modelfile.qwen"
"$PY" -m ollapy.cli.main create qwen2.5-coder:0.5b -f "$WORK/Modelfile.qwen" > /dev/null 2>&1
if [ -n "${MODEL:-}" ]; then  # every check on MODEL (see the header)
  printf 'FROM %s\nPARAMETER num_ctx 4096\n' "$MODEL" > "$WORK/Modelfile.smol"
  printf 'FROM %s\nPARAMETER num_ctx 32768\nPARAMETER num_predict %s\nPARAMETER temperature 0\n' "$MODEL" "$MAX_OUT" \
    > "$WORK/Modelfile.gemma"
else
  printf 'FROM %s\nPARAMETER num_ctx 4096\n' "$SMOL" > "$WORK/Modelfile.smol"
  printf 'FROM %s\nPARAMETER num_ctx 32768\nPARAMETER num_predict %s\nPARAMETER temperature 0\nPARAMETER stop "\\n"\nPARAMETER stop "<end_of_turn>"\nPARAMETER stop "<start_of_turn>"\n' \
    "$GEMMA" "$MAX_OUT" > "$WORK/Modelfile.gemma"
fi
"$PY" -m ollapy.cli.main create smol -f "$WORK/Modelfile.smol" > /dev/null 2>&1 || echo "create smol failed" >&2
"$PY" -m ollapy.cli.main create gemma3-agents -f "$WORK/Modelfile.gemma" > /dev/null 2>&1 || echo "create gemma3-agents failed" >&2
# an embedding model (SmolLM2 declaring a pooling type: /api/show lists "embedding"), for the clients that embed
# only with such models (llm-ollama)
"$PY" "$ROOT/scripts/make_embedding_gguf.py" "$SMOL" "$WORK/smol-embed.gguf" > /dev/null
printf 'FROM %s\n' "$WORK/smol-embed.gguf" > "$WORK/Modelfile.embed"
"$PY" -m ollapy.cli.main create smol-embed -f "$WORK/Modelfile.embed" > /dev/null 2>&1
echo "ollapy serve at $URL; clients in $DIR; models: smol and gemma3-agents from ${MODEL:-SmolLM2 and Gemma 3}"

metrics() {  # requests, prompt tokens (evaluated), cached tokens, from /metrics (ollapy's own interpreter: it has
  # httpx and prometheus_client)
  "$PY" - "$URL" <<'EOF'
import sys, httpx
from prometheus_client.parser import text_string_to_metric_families
v = {"n": 0.0, "prompt": 0.0, "cached": 0.0}
for fam in text_string_to_metric_families(httpx.get(sys.argv[1] + "/metrics", timeout=30).text):
    for s in fam.samples:
        if s.name == "ollapy_time_to_first_token_seconds_count":
            v["n"] += s.value
        elif s.name == "ollapy_tokens_total" and s.labels.get("kind") in ("prompt", "cached"):
            v[s.labels["kind"]] += s.value
print(int(v["n"]), int(v["prompt"]), int(v["cached"]))
EOF
}
reloads() { grep -c "reloading" "$WORK/serve.log"; }

# ---- official SDKs -----------------------------------------------------------------------------------------
if want sdk; then
  cat > "$WORK/sdk.py" <<'EOF'
import sys, ollama, openai, anthropic
url, what = sys.argv[1], sys.argv[2]
Q = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
if what == "ollama":
    c = ollama.Client(host=url)
    assert any(m.model.startswith("smol") for m in c.list().models)
    r = c.chat(model="smol", messages=Q, options={"temperature": 0, "num_predict": 16})
    assert r.message.content and r.done
    parts = list(c.chat(model="smol", messages=Q, stream=True, options={"num_predict": 8}))
    assert parts[-1].done and len(parts) > 1
    assert c.generate(model="smol", prompt="Hello", options={"num_predict": 4}).response
    e = c.embed(model="smol", input=["a", "b"])
    assert len(e.embeddings) == 2 and len(e.embeddings[0]) > 10
    assert c.show("smol").modelfile and any(m.model.startswith("smol") for m in c.ps().models)
elif what == "openai":
    c = openai.OpenAI(base_url=url + "/v1", api_key="ollapy")
    assert any(m.id.startswith("smol") for m in c.models.list().data)
    r = c.chat.completions.create(model="smol", messages=Q, max_tokens=16, temperature=0)
    assert r.choices[0].message.content and r.usage.prompt_tokens > 0
    chunks = list(c.chat.completions.create(model="smol", messages=Q, max_tokens=8, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert len(c.embeddings.create(model="smol", input="hello").data[0].embedding) > 10
    r = c.responses.create(model="smol", input="Say hi.", max_output_tokens=16)
    assert r.output_text is not None
elif what == "anthropic":
    c = anthropic.Anthropic(base_url=url, api_key="ollapy")
    r = c.messages.create(model="smol", max_tokens=16, messages=Q)
    assert r.content[0].text and r.usage.input_tokens > 0
    with c.messages.stream(model="smol", max_tokens=8, messages=Q) as s:
        assert s.get_final_message().stop_reason in ("end_turn", "max_tokens")
    assert c.messages.count_tokens(model="smol", messages=Q).input_tokens > 5
EOF
  for sdk in ollama openai anthropic; do check "sdk-$sdk" 300 "$CPY" "$WORK/sdk.py" "$URL" "$sdk"; done
  check "llama.cpp-utility-routes" 120 "$CPY" -c "
import httpx, sys
u = '$URL'
t = httpx.post(u + '/tokenize', json={'model': 'smol', 'content': 'Hello world', 'with_pieces': True}, timeout=60).json()['tokens']
assert ''.join(x['piece'] for x in t) == 'Hello world'
assert httpx.post(u + '/detokenize', json={'model': 'smol', 'tokens': [x['id'] for x in t]}).json()['content'] == 'Hello world'
p = httpx.post(u + '/apply-template', json={'model': 'smol', 'messages': [{'role': 'user', 'content': 'hi'}]}).json()['prompt']
assert p.rstrip().endswith('assistant'), p"
fi

# ---- ollama-js ---------------------------------------------------------------------------------------------
if want js; then
  cat > "$WORK/check.mjs" <<'EOF'
import { Ollama } from "ollama";
const o = new Ollama({ host: process.env.OLLAMA_HOST });
const list = await o.list();
if (!list.models.some((m) => m.name.startsWith("smol"))) throw new Error("no smol in list");
let text = "";
for await (const part of await o.chat({ model: "smol", messages: [{ role: "user", content: "Say hi." }], stream: true,
                                        options: { num_predict: 8 } })) text += part.message.content;
if (!text) throw new Error("empty answer");
const e = await o.embed({ model: "smol", input: "hello" });
if (e.embeddings[0].length < 10) throw new Error("no embedding");
console.log("ollama-js:", JSON.stringify(text));
EOF
  cp "$WORK/check.mjs" "$DIR/npm/check-ollapy.mjs"
  check "ollama-js" 300 node "$DIR/npm/check-ollapy.mjs"
fi

# ---- llm + llm-ollama --------------------------------------------------------------------------------------
if want llm; then
  export LLM_USER_PATH=$WORK/llm-home
  LLM=$DIR/llm/bin/llm
  check "llm-models" 120 bash -c "'$LLM' models | grep -q 'ollama/smol:latest'"  # llm-ollama names models ollama/NAME
  check "llm-prompt-streamed" 300 "$LLM" -m ollama/smol "What is the capital of France? Answer in one word."
  check "llm-prompt-not-streamed-options" 300 "$LLM" -m ollama/smol --no-stream -o temperature 0 -o num_predict 16 "Say hi."
  check "llm-continue-conversation" 300 "$LLM" -c -o num_predict 16 "And of Italy?"
  if check "llm-schema" 300 "$LLM" -m ollama/smol --schema 'city, country' -o num_predict 64 "Name a city."; then
    "$CPY" -c "import json; d = json.loads(open('$WORK/last-llm-schema.log').read()); assert set(d) >= {'city', 'country'}" \
      2>/dev/null || note "llm-schema: the answer is not the schema's object (a 135M model under a grammar)"
  fi
  check "llm-think-refused" 120 bash -c "'$LLM' -m ollama/smol -o think true 'Hi' 2>&1 | grep -q 'does not support thinking'"
  # llm-ollama registers an embedding model only where /api/show lists the "embedding" capability (Ollama's
  # embedding models): smol-embed, made above
  if "$LLM" embed-models | grep -q "ollama/smol-embed"; then
    check "llm-embed" 120 bash -c "'$LLM' embed -m ollama/smol-embed -c 'hello world' | grep -q '\['"
  else
    fail "llm-embed" "llm embed-models does not list ollama/smol-embed: $("$LLM" embed-models 2>&1 | tr '\n' ' ' | cut -c1-200)"
  fi
fi

# ---- aider (litellm ollama_chat/) ----------------------------------------------------------------------------
if want aider && [ -x "$DIR/aider/bin/aider" ]; then
  mkdir -p "$WORK/aider" && cd "$WORK/aider" && printf 'def add(a, b):\n    return a + b\n' > calc.py
  before=$(reloads)
  for i in 1 2 3; do
    check "aider-message-$i" 600 "$DIR/aider/bin/aider" --model ollama_chat/smol --no-git --yes-always \
      --no-show-model-warnings --no-check-update --no-analytics --no-pretty --restore-chat-history \
      --map-tokens 0 --message "Message $i: what does add return? One line." calc.py
  done
  n=$(( $(reloads) - before ))
  if [ "$n" -le 1 ]; then ok "aider-num_ctx-reloads-at-most-once ($n reloads)"; else fail "aider-num_ctx-reloads" "$n reloads"; fi
  cd "$ROOT"
fi

# ---- Continue CLI --------------------------------------------------------------------------------------------
if want continue; then
  cat > "$WORK/continue.yaml" <<EOF
name: ollapy
version: 1.0.0
schema: v1
models:
  - name: gemma3-agents
    provider: ollama
    model: gemma3-agents:latest
    apiBase: $URL
    roles: [chat, edit, apply, autocomplete]
EOF
  mkdir -p "$WORK/cn" && cd "$WORK/cn"
  check "continue-cli-chat" 900 env CONTINUE_GLOBAL_DIR="$WORK/cn-home" cn --config "$WORK/continue.yaml" -p "Reply with one word: ready"
  cd "$ROOT"
  # autocomplete: Continue's ollama provider sends /api/generate with the code before the cursor as `prompt` and
  # the code after it as `suffix`, raw; a model that cannot insert (SmolLM2) gets Ollama's 400, one that can (a
  # MODEL with FIM tokens, such as qwen2.5-coder) a completion
  check "continue-fim-suffix" 120 "$CPY" -c "
import httpx
caps = httpx.post('$URL/api/show', json={'model': 'smol'}, timeout=60).json().get('capabilities', [])
r = httpx.post('$URL/api/generate', json={'model': 'smol', 'prompt': 'def add(a, b):\n    return ', 'suffix': '\n\nprint(add(1, 2))',
               'raw': True, 'stream': False, 'options': {'num_predict': 16}}, timeout=120)
if 'insert' in caps:
    assert r.status_code == 200 and r.json()['response'].strip(), r.text
else:
    assert r.status_code == 400 and r.json()['error'].startswith('\"smol\" does not support insert'), r.text"
fi

# ---- code completion: Continue, llama.vscode, llama.vim (issue 52) ----------------------------------------
if want fim; then
  # each replay prints what its client would show; Continue's and llama.vscode's name the model, llama.vim's
  # names it as g:llama_config.model_fim does when set
  for c in continue llama.vscode llama.vim; do
    check "fim-$c" 900 "$PY" "$ROOT/scripts/fim_replays.py" "$URL" qwen2.5-coder:0.5b "$c" && \
      echo "     $(tail -n 1 "$WORK/last-fim-$c.log")"
  done
  # the clients' default configurations name no ollapy model: llama.vim sends "model": "", llama.vscode its
  # ai_model setting's default "google/gemini-2.5-flash" (llama-server serves one model and ignores the field)
  for c in "llama.vim|" "llama.vscode|google/gemini-2.5-flash"; do
    if out=$(timeout 900 "$PY" "$ROOT/scripts/fim_replays.py" "$URL" "${c#*|}" "${c%%|*}" 2>&1); then
      ok "fim-${c%%|*}-default-model (\"${c#*|}\")"
    else
      note "fim-${c%%|*}-default-model (\"${c#*|}\"): $(echo "$out" | tail -n 1 | cut -c1-250); set the model (docs/code-completion.md)"
    fi
  done
fi

# ---- opencode ----------------------------------------------------------------------------------------------
failed_requests() {  # generation requests the server answered with an error so far (ollapy_requests_total; not
  # "cancelled": a client killed by a check's time limit cancels the request it was streaming)
  "$CPY" - "$URL" <<'EOF2'
import sys, httpx
from prometheus_client.parser import text_string_to_metric_families
n = 0
for fam in text_string_to_metric_families(httpx.get(sys.argv[1] + "/metrics", timeout=30).text):
    n += sum(s.value for s in fam.samples if s.name == "ollapy_requests_total" and s.labels.get("status") not in ("ok", "cancelled"))
print(int(n))
EOF2
}
if want opencode; then
  mkdir -p "$WORK/oc" "$WORK/oc-config/opencode" && cd "$WORK/oc"
  # tools off through the user's own opencode.json (`launch` merges its provider over it): a model that cannot drive
  # tools still answers, so `opencode run` must complete
  echo '{"$schema": "https://opencode.ai/config.json", "tools": {"*": false}}' > "$WORK/oc-config/opencode/opencode.json"
  check "opencode-run-via-launch (tools off)" 900 env XDG_CONFIG_HOME="$WORK/oc-config" XDG_DATA_HOME="$WORK/oc-data" \
    "$PY" -m ollapy.cli.main launch opencode --model gemma3-agents -- run "Reply with one word: ready"
  # tools on (opencode's defaults): the 270M model writes tool calls and never ends its turn; opencode carrying
  # them out with every request answered is a note (the model), a server error a FAIL
  rm "$WORK/oc-config/opencode/opencode.json"
  e0=$(failed_requests)
  out=$(timeout 600 env XDG_CONFIG_HOME="$WORK/oc-config" XDG_DATA_HOME="$WORK/oc-data" \
    "$PY" -m ollapy.cli.main launch opencode --model gemma3-agents -- run "Reply with one word: ready" 2>&1)
  rc=$? e1=$(failed_requests)
  echo "$out" > "$WORK/last-opencode-tools-on.log"
  calls=$(printf '%s\n' "$out" | grep -c '←' || true)
  if [ $rc = 0 ]; then ok "opencode-run-via-launch (tools on)"
  elif [ "$e1" = "$e0" ] && [ "$calls" -gt 0 ]; then
    note "opencode-run-via-launch (tools on): the model kept calling tools ($calls carried out by opencode, every request answered) until the check's 600 s limit"
  else fail "opencode-run-via-launch (tools on)" "exit $rc, $((e1 - e0)) failed requests: $(printf '%s' "$out" | tail -c 300 | tr '\n' ' ')"
  fi
  cd "$ROOT"
fi

# ---- agents do a task with their tools, three turns (issue 55): ONLY=task, on MODEL (an instruct model) -------
# Each agent (TASK_AGENTS, default "claude codex opencode") in a fresh folder, through `ollapy launch`, tools on:
# turn 1 creates hello.py printing 2 + 3 and runs it, turn 2 makes it print 2 * 3, turn 3 2 ** 3, in the same
# session (claude -p --continue, codex exec resume --last, opencode run --continue). A turn is ok when the agent
# exits 0, `python3 hello.py` prints the number and the agent's answer says it; per turn the requests, prompt
# tokens, how many the cache served and how many were prefilled. Permissions: Claude Code may use Write, Edit,
# Read and Bash (--allowedTools; it refuses --dangerously-skip-permissions as root); Codex runs without its
# sandbox (--dangerously-bypass-approvals-and-sandbox); opencode's defaults allow edits and commands.
if want task; then
  export CODEX_HOME=$DIR/codex-home CLAUDE_CONFIG_DIR=$DIR/claude-config CLAUDE_CODE_MAX_OUTPUT_TOKENS=$MAX_OUT
  export CLAUDE_STREAM_IDLE_TIMEOUT_MS=3600000 API_TIMEOUT_MS=3600000
  rm -rf "$CODEX_HOME/sessions" "$CLAUDE_CONFIG_DIR/projects"
  mkdir -p "$CODEX_HOME" "$CLAUDE_CONFIG_DIR"
  TASK_TIMEOUT=${TASK_TIMEOUT:-2400}
  TASK_TURNS=("Create a file hello.py that prints the sum of 2 and 3. Run it with python3 and tell me the output."
              "Change hello.py so that it prints the product of 2 and 3 instead. Run it again and tell me the output."
              "Change hello.py so that it prints 2 to the power of 3. Run it again and tell me the output.")
  TASK_WANT=(5 6 8)
  task_turn() {  # agent, turn index (0-based), launch arguments after the model
    local agent=$1 t=$2; shift 2
    local proj=$WORK/task-$agent label="$agent task turn $((t + 1))" b a log
    log=$WORK/task-$agent-$((t + 1))
    b=$(metrics)
    (cd "$proj" && timeout "$TASK_TIMEOUT" "$PY" -m ollapy.cli.main launch "$agent" --model gemma3-agents -- "$@" \
      < /dev/null > "$log.out" 2> "$log.err")
    local rc=$?
    a=$(metrics)
    read -r n0 p0 c0 <<< "$b"; read -r n1 p1 c1 <<< "$a"
    local got; got=$(cd "$proj" && timeout 30 python3 hello.py 2>&1 | tr -d '\r' | tail -n 1)
    local said; said=$(grep -c -w "${TASK_WANT[$t]}" "$log.out")
    local line="$label: $((n1 - n0)) requests, prompt tokens $((p1 - p0 + c1 - c0)), reused from the cache $((c1 - c0)), prefilled $((p1 - p0)); hello.py prints '${got:0:40}', the answer names ${TASK_WANT[$t]}: $([ "$said" -gt 0 ] && echo yes || echo no)"
    if [ $rc = 0 ] && [ "$got" = "${TASK_WANT[$t]}" ] && [ "$said" -gt 0 ]; then ok "$line"
    else fail "$line" "exit $rc: $(cat "$log.out" "$log.err" | grep -v -e '^launching' | tail -c 400 | tr '\n' ' ')"; fi
  }
  for agent in ${TASK_AGENTS:-claude codex opencode}; do
    rm -rf "$WORK/task-$agent"; mkdir -p "$WORK/task-$agent"
    for t in 0 1 2; do
      case "$agent" in
        claude) cont=(); [ "$t" -gt 0 ] && cont=(--continue)
                task_turn claude "$t" -p "${cont[@]}" "${TASK_TURNS[$t]}" --max-turns 12 --allowedTools Write Edit Read Bash ;;
        codex) if [ "$t" = 0 ]; then
                 task_turn codex "$t" exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox "${TASK_TURNS[$t]}"
               else
                 task_turn codex "$t" exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox resume --last "${TASK_TURNS[$t]}"
               fi ;;
        opencode) cont=(); [ "$t" -gt 0 ] && cont=(--continue)
                  task_turn opencode "$t" run "${cont[@]}" "${TASK_TURNS[$t]}" ;;
      esac
    done
  done
fi

# ---- agents, tools on, three turns -------------------------------------------------------------------------
if want agents; then
  export CODEX_HOME=$DIR/codex-home CLAUDE_CONFIG_DIR=$DIR/claude-config CLAUDE_CODE_MAX_OUTPUT_TOKENS=$MAX_OUT
  export CLAUDE_STREAM_IDLE_TIMEOUT_MS=3600000 API_TIMEOUT_MS=3600000
  rm -rf "$CODEX_HOME/sessions" "$CLAUDE_CONFIG_DIR/projects"
  mkdir -p "$CODEX_HOME" "$CLAUDE_CONFIG_DIR" "$WORK/project"
  agent_turn() {  # label, then launch arguments
    local label=$1; shift
    local b a
    b=$(metrics)
    local log=$WORK/agent-${label// /-}
    (cd "$WORK/project" && timeout 1800 "$PY" -m ollapy.cli.main launch "$@" < /dev/null > "$log.out" 2> "$log.err")
    local rc=$?
    a=$(metrics)
    read -r n0 p0 c0 <<< "$b"; read -r n1 p1 c1 <<< "$a"
    local line="$label: $((n1 - n0)) requests, prompt tokens $((p1 - p0 + c1 - c0)), reused from the cache $((c1 - c0)), prefilled $((p1 - p0))"
    if [ $rc = 0 ]; then ok "$line"; else fail "$line" "exit $rc: $(cat "$log.out" "$log.err" | grep -v -e '^launching' -e 'AUTO_COMPACT' -e 'unrecognized_model' | tail -c 300 | tr '\n' ' ')"; fi
  }
  agent_turn "claude turn 1" claude --model gemma3-agents -- -p "Reply with one word: ready"
  for i in $(seq 2 "$AGENT_TURNS"); do
    agent_turn "claude turn $i" claude --model gemma3-agents -- -p --continue "Reply with one word: again ($i)"
  done
  agent_turn "codex turn 1" codex --model gemma3-agents -- exec --skip-git-repo-check "Reply with one word: ready"
  for i in $(seq 2 "$AGENT_TURNS"); do
    agent_turn "codex turn $i" codex --model gemma3-agents -- exec --skip-git-repo-check resume --last "Reply with one word: again ($i)"
  done
fi

# ---- Open WebUI --------------------------------------------------------------------------------------------
if want openwebui; then
  if [ "$OWUI_OK" != 1 ]; then
    fail "open-webui" "not installed (pip install $OWUI_PKG failed or took over ${INSTALL_TIMEOUT}s here)"
  else
    WPORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    (cd "$WORK" && exec env DATA_DIR="$WORK/owui" OLLAMA_BASE_URL="$URL" ENABLE_OPENAI_API=False WEBUI_AUTH=False \
      HF_HUB_OFFLINE=1 OFFLINE_MODE=True RAG_EMBEDDING_ENGINE=ollama RAG_EMBEDDING_MODEL=smol:latest \
      ENABLE_VERSION_UPDATE_CHECK=False ANONYMIZED_TELEMETRY=False \
      "$DIR/open-webui/bin/open-webui" serve --host 127.0.0.1 --port "$WPORT" > "$WORK/owui.log" 2>&1) &
    OWUI_PID=$!
    up=0
    for _ in $(seq 900); do curl -sf "http://127.0.0.1:$WPORT/health" > /dev/null && { up=1; break; }; sleep 1; done
    if [ $up = 0 ]; then
      fail "open-webui-start" "no answer in 900 s: $(tail -n 3 "$WORK/owui.log" | tr '\n' ' ' | cut -c1-300)"
    else
      cat > "$WORK/owui.py" <<'EOF'
import json, sys, httpx
w, what = sys.argv[1], sys.argv[2]
c = httpx.Client(base_url=w, timeout=600)
# WEBUI_AUTH=False: Open WebUI signs anyone in as its single admin (admin@localhost), and its API still wants the token
tok = c.post("/api/v1/auths/signin", json={"email": "admin@localhost", "password": "admin"}).json()["token"]
c.headers["Authorization"] = f"Bearer {tok}"
msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
if what == "models":
    ids = [m["id"] for m in c.get("/api/models").json()["data"]]
    assert any(i.startswith("smol") for i in ids), ids
elif what == "chat-streamed":
    text = ""
    with c.stream("POST", "/api/chat/completions", json={"model": "smol:latest", "messages": msgs, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                d = json.loads(line[6:])
                text += ((d.get("choices") or [{}])[0].get("delta") or {}).get("content") or ""
    assert text, "empty stream"
elif what == "title-and-follow-ups":
    body = {"model": "smol:latest", "messages": msgs + [{"role": "assistant", "content": "Paris."}]}
    for task in ("title", "follow_up"):
        r = c.post(f"/api/v1/tasks/{task}/completions", json=body)
        assert r.status_code == 200, (task, r.status_code, r.text[:200])
elif what == "ps-and-unload":
    ps = c.get("/ollama/api/ps").json()
    assert any(m["name"].startswith("smol") for m in ps["models"]), ps
    r = c.post("/ollama/api/generate", json={"model": "smol:latest", "keep_alive": 0})
    assert r.status_code == 200, r.text
    import time
    for _ in range(100):
        if not any(m["name"].startswith("smol") for m in c.get("/ollama/api/ps").json()["models"]):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("smol still loaded after keep_alive 0")
elif what == "embeddings":
    r = c.post("/ollama/api/embed", json={"model": "smol:latest", "input": ["a document about llamas"]})
    assert r.status_code == 200 and len(r.json()["embeddings"][0]) > 10, r.text[:200]
EOF
      for w in models chat-streamed title-and-follow-ups ps-and-unload embeddings; do
        check "open-webui-$w" 600 "$CPY" "$WORK/owui.py" "http://127.0.0.1:$WPORT" "$w"
      done
    fi
  fi
fi

# ---- more agents through `ollapy launch` (issue 56): a first prompt answered ---------------------------------
# pi, Qwen Code, Kilo and Cline from npm, unmodified, in their own folder (npm-more/), each with its home and
# configuration under the scratch folder, tools on (their defaults), on Qwen2.5-Coder 0.5B Instruct at num_ctx
# 32768 (`qwen2.5-coder:0.5b-32k`, greedy): the 270M base model cannot answer them (it never ends its turn). Per
# agent: requests, prompt tokens (from the cache / prefilled), seconds and the answer's last line. A cold agent
# prompt (Kilo's and Cline's run to 10-16k tokens) takes minutes to prefill on a CPU: the server's SSE keepalive
# keeps Bun-based agents (Kilo, Cline) from dropping the silent stream at 300 s. Crush is not run: its npm package
# downloads the binary from GitHub at install time (unreachable here). Kilo's npm package did not pull in its
# platform binary (an optional dependency) here: it is named apart, at the version npm gave then.
MORE_PKGS="@mariozechner/pi-coding-agent@0.73.1 @qwen-code/qwen-code@0.15.10 @kilocode/cli@7.8.1 @kilocode/cli-linux-x64@7.7.9 cline@3.0.65"
MORE_TIMEOUT=${MORE_TIMEOUT:-3600}  # seconds per agent (Kilo's cold 14k-token prompt took 1,903 s on two busy cores)
more_agents() {
  local bin=$DIR/npm-more/node_modules/.bin
  if [ ! -x "$bin/pi" ] || [ ! -x "$bin/qwen" ] || [ ! -x "$bin/kilo" ] || [ ! -x "$bin/cline" ]; then
    timeout "$INSTALL_TIMEOUT" npm install --prefix "$DIR/npm-more" --no-audit --no-fund --loglevel=error $MORE_PKGS >&2 \
      || echo "npm install of the more agents failed" >&2
  fi
  if [ -z "$QWEN" ] || [ ! -f "$QWEN" ]; then
    note "more: skipped (no Qwen2.5-Coder 0.5B Instruct GGUF from scripts/fetch_test_models.py; the 270M base model cannot answer an agent)"
    return
  fi
  printf 'FROM %s\nPARAMETER num_ctx 32768\nPARAMETER temperature 0\n' "$QWEN" > "$WORK/Modelfile.qwen-agents"
  "$PY" -m ollapy.cli.main create qwen2.5-coder:0.5b-32k -f "$WORK/Modelfile.qwen-agents" > /dev/null 2>&1
  mkdir -p "$WORK/more-project" "$WORK/more-home"
  more() {  # label, then launch arguments (run in the project folder with the scratch HOME)
    local label=$1; shift
    local log=$WORK/more-$label b a rc t0 answer
    b=$(metrics); t0=$(date +%s)
    (cd "$WORK/more-project" && PATH="$bin:$PATH" HOME="$WORK/more-home" XDG_CONFIG_HOME="$WORK/more-home/.config" \
      XDG_DATA_HOME="$WORK/more-home/.local/share" timeout "$MORE_TIMEOUT" "$PY" -m ollapy.cli.main launch "$@" \
      < /dev/null > "$log.out" 2> "$log.err")
    rc=$?
    a=$(metrics)
    read -r n0 p0 c0 <<< "$b"; read -r n1 p1 c1 <<< "$a"
    answer=$(grep -v '^[[:space:]]*$' "$log.out" | tail -n 1 | cut -c1-80)
    local line="$label: $((n1 - n0)) requests, prompt tokens $((p1 - p0 + c1 - c0)) (from the cache $((c1 - c0)), prefilled $((p1 - p0))), $(( $(date +%s) - t0 )) s, answer \"$answer\""
    if [ $rc = 0 ] && [ -n "$answer" ]; then ok "$line"
    elif [ $rc = 53 ] && grep -q "Reached max session turns" "$log.out" "$log.err"; then
      ok "$line (one turn answered; the model's tool calls cut by --max-session-turns 1)"
    else fail "$line" "exit $rc: $(cat "$log.out" "$log.err" | grep -v '^launching' | tail -c 300 | tr '\n' ' ')"; fi
    grep '^launching' "$log.err" | sed 's/^/     /'  # what launch set: the context and output bound
  }
  local M=qwen2.5-coder:0.5b-32k
  more pi pi --model $M -- -p "Reply with one word: ready"
  # Qwen Code has no switch for its tools: one turn (--max-session-turns 1, exit 53 when the turn was a tool call)
  more qwen qwen --model $M -- --max-session-turns 1 -p "Reply with one word: ready"
  more kilo kilo --model $M -- run "Reply with one word: ready"
  more cline cline --model $M -- "Reply with one word: ready"
  # Cline leaves its hub daemon running after the prompt: stop it (its pid is in the hub's discovery record)
  local hub=$WORK/more-home/.cline/data/locks/hub/production.json
  [ -f "$hub" ] && kill "$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["pid"])' "$hub")" 2>/dev/null
  # Droid is not run yet: 0.225.2 without a Factory account fails to reach api.factory.ai ("No authentication
  # credentials available", "Failed to load organization settings"), then goes on ("First turn proceeding with
  # degraded org policy") and sends its first request (9,068 prompt tokens) to ollapy; not yet run to its answer
  note "droid: not run (0.225.2 reaches ollapy without a Factory account, but was not yet run to an answer); ollapy launch droid --config prints its --settings file"
  note "crush: not run (its npm package downloads its binary from GitHub at install time); ollapy launch crush --config prints its crush.json entries"
  note "what each needed (docs/anthropic-and-agents.md): pi a provider in models.json; qwen OPENAI_* variables, --auth-type openai, and its context and auto-memory off in a defaults settings file; kilo KILO_CONFIG_CONTENT; cline its openai-compatible provider in providers.json, with updatedAt; droid a custom model in a --settings file; Kilo and Cline (Bun) the server's SSE keepalive through a cold prefill over 300 s"
}
want more && more_agents

if ! kill -0 "$SERVER" 2>/dev/null; then fail "ollapy-serve" "the server stopped: $(tail -n 5 "$WORK/serve.log" | tr '\n' ' ')"; fi
echo "--- $OK ok, $FAILED FAIL, ${#NOTES[@]} notes; server reloads: $(reloads)"
[ "$FAILED" = 0 ]
