"""What each model option does, in words: the table behind docs/options.md.

:data:`OPTION_HELP` is read by :func:`ollapy.options.option_help` and ``scripts/gen_docs.py``; ``tests/test_docs.py``
checks that every field of :class:`ollapy.options.Options` has a line here and no line names a missing one.
"""
from __future__ import annotations

#: What each option does, for the generated table in docs/options.md (``scripts/gen_docs.py``; tests/test_docs.py
#: checks that every field of :class:`Options` has a line here). Units and ranges are the checks above.
OPTION_HELP: dict[str, str] = {
    "num_ctx": "Context length of each slot, in tokens (the prompt plus the answer). Default: OLLAPY_CONTEXT_LENGTH.",
    "num_batch": "Most prompt tokens one decode step evaluates (llama.cpp's n_batch): a long prompt is prefilled in "
                 "chunks of this size, between other slots' decode tokens.",
    "num_gpu": "Layers offloaded to GPU devices: -1 every layer when a GPU (or RPC server) is there, 0 none (CPU "
               "only), N the first N.",
    "num_thread": "CPU threads for decoding; 0 lets ollapy choose (OLLAPY_NUM_THREAD).",
    "num_parallel": "Slots of the loaded model: requests decoded together, each with num_ctx tokens of KV cache. "
                    "Default: OLLAPY_NUM_PARALLEL. A client's value does not reload a running server's model: the "
                    "server's slots serve it.",
    "kv_cache_type": "Element type of the KV cache: f16, or q8_0/q4_0 (smaller; turns CPU flash attention on).",
    "flash_attn": "Flash attention: auto (llama.cpp decides), on, off.",
    "extra_bufts": "CPU extra buffer types (weight repacking, AMX): auto, on, off. Default: OLLAPY_EXTRA_BUFTS.",
    "rpc": "llama.cpp RPC servers whose devices take model layers (host:port,host:port), as llama.cpp's --rpc. "
           "Set by the server's operator or a CLI run, never by an HTTP request.",
    "tensor_split": "Proportions of the offloaded layers per device (\"3,1\"); empty splits by free memory, as "
                    "llama.cpp's --tensor-split.",
    "draft": "Speculative decoding: empty (off), ngram (prompt lookup), or a draft model's name or .gguf path "
             "(loaded beside the model; Modelfile DRAFT). Never changes a greedy answer.",
    "draft_num_predict": "Most drafted tokens one step verifies; -1 by mode (16 for ngram, 4 for a draft model), "
                         "0 drafts nothing.",
    "draft_min": "Fewest drafted tokens worth verifying: a step with fewer proposals drafts none.",
    "num_keep": "Tokens kept from the start when the context is shifted or a prompt truncated; -1 keeps BOS and "
                "the system prompt (at least 4).",
    "num_predict": "Most tokens to generate; -1 until a stop or the model's training context length.",
    "temperature": "Sampling temperature; 0 is greedy (the same answer every time).",
    "top_k": "Sample from the k most likely tokens only; 0 turns it off.",
    "top_p": "Nucleus sampling: the smallest set of tokens whose probabilities add up to p; 1 turns it off.",
    "min_p": "Drop tokens less likely than min_p times the most likely one; 0 turns it off.",
    "typical_p": "Locally typical sampling (llama.cpp's typical_p); 1 turns it off.",
    "repeat_penalty": "Penalty on tokens seen in the last repeat_last_n tokens (prompt included); 1 turns it off.",
    "repeat_last_n": "How many recent tokens the penalties look at; 0 none, -1 the whole context.",
    "presence_penalty": "Subtracted from the logit of every token already seen (OpenAI's presence penalty).",
    "frequency_penalty": "Subtracted per occurrence of a token already seen (OpenAI's frequency penalty).",
    "seed": "Random seed of the sampler; -1 picks one per request. The same seed and inputs give the same answer.",
    "mirostat": "Mirostat sampling: 0 off, 1 or 2 llama.cpp's Mirostat v1/v2 instead of top_k/top_p/min_p/"
                "typical_p.",
    "mirostat_tau": "Mirostat's target surprise (lower: more focused text).",
    "mirostat_eta": "Mirostat's learning rate.",
    "stop": "Stop strings: generation ends before the first one (repeat -o stop=... or PARAMETER stop for more "
            "than one).",
    "shift": "When a slot's context fills during generation, drop half of what follows num_keep and go on; false "
             "ends the answer with done_reason \"length\".",
    "truncate": "A prompt longer than num_ctx is cut after num_keep (the answer says truncated); false makes it an "
                "error (HTTP 400 with the token counts).",
    "tool_parser": "How tool calls are read from the output: auto (from the chat template), hermes, llama3, "
                   "mistral, generic.",
    "dry_multiplier": "DRY (don't repeat yourself) sampling: penalty for extending a repeated sequence; 0 turns it "
                      "off.",
    "dry_base": "DRY's base: the penalty grows as base^(repeat length - dry_allowed_length).",
    "dry_allowed_length": "Longest repeated sequence DRY leaves unpenalized.",
    "dry_penalty_last_n": "How many recent tokens DRY scans; -1 the whole context, 0 none.",
    "dry_sequence_breakers": "Strings that end a repeated sequence for DRY.",
    "top_n_sigma": "Keep tokens within n standard deviations of the top logit; negative turns it off.",
    "xtc_probability": "XTC (exclude top choices): chance per step of removing the likeliest tokens above "
                       "xtc_threshold; 0 turns it off.",
    "xtc_threshold": "XTC removes all but the least likely of the tokens above this probability; above 0.5 turns XTC "
                     "off.",
    "logit_bias": "Per-token logit offsets (token id or text -> bias); -100 bans a token. Requests only.",
    "fim_layout": "Code completion: where the text typed on the current line goes: plain (at the end of the prefix, "
                  "before the suffix), moved-line (after the middle token: a keystroke extends a cached prefix, but "
                  "answers are worse), auto (= plain; docs/code-completion.md).",
}
