"""A slot: one sequence (``seq_id``) of the shared context and the request it serves.

State machine: IDLE -> PREFILL (reading prompt in chunks) -> GENERATE
(one decode token per step) -> IDLE. ``tokens`` always lists exactly the
tokens whose KV cells the sequence holds, in position order. ``exact`` counts
the leading tokens whose KV is bit for bit what a cold prefill of a longer
prompt computes for them: the cells evaluated in prompt chunks (the canonical
order of :mod:`ollapy.engine.prefix.evalorder`), never the last prompt token or the
generated ones (evaluated alone, as decode rows) except on an answer-reuse build
(evalorder rule 3: there a decode row computes what a chunk does), and after a context shift
at most the kept ``num_keep`` prefix (the shifted rest was computed while the
discarded tokens were still visible). Only ``tokens[:exact]`` is ever reused
for another request or saved in the prompt cache.

Invariants are cheap asserts (vLLM's ``block_pool.py`` style): :meth:`Slot.check`
(``exact <= len(tokens)``, and ``seq_pos_max + 1 == len(tokens)`` when the
caller passes what llama.cpp holds), in :meth:`Slot.begin` and :meth:`Slot.release`.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from ollapy.engine.request import Request
from ollapy.engine.text import Detokenizer, StopMatcher


class SlotState(enum.Enum):
    """What a slot is doing this step."""

    IDLE = "idle"
    PREFILL = "prefill"
    GENERATE = "generate"
    FINISH = "finish"  # the answer's last token (cut by num_predict) is decoded for the saved state, then it ends


@dataclass
class Slot:
    """One parallel slot; ``id`` is also its llama.cpp ``seq_id``."""

    id: int
    state: SlotState = SlotState.IDLE
    tokens: list[int] = field(default_factory=list)
    request: Request | None = None
    prompt: list[int] = field(default_factory=list)
    n_past: int = 0
    pending: int = -1
    keep: int = 0
    sampler: object | None = None
    detok: Detokenizer | None = None
    stops: StopMatcher | None = None
    last_used: float = 0.0
    t_start: int = 0
    t_first: int = 0
    batch_row: int = -1
    draft: list[int] = field(default_factory=list)  # drafted tokens verified in this step (engine/speculation.py)
    exact: int = 0
    t_done: int = 0  # when the request's last token was handed over (a FINISH step follows)

    @property
    def usable(self) -> list[int]:
        """The tokens whose KV another request may reuse (``tokens[:exact]``)."""
        return self.tokens if self.exact >= len(self.tokens) else self.tokens[:self.exact]

    @property
    def busy(self) -> bool:
        """True while serving a request."""
        return self.state is not SlotState.IDLE

    def check(self, held: int | None = None) -> None:
        """Assert the slot's invariants; ``held``: the positions llama.cpp holds (``seq_pos_max + 1``)."""
        assert 0 <= self.exact <= len(self.tokens), (self.id, self.exact, len(self.tokens))
        assert held is None or held == len(self.tokens), (self.id, held, len(self.tokens))

    def begin(self, req: Request, keep: int) -> None:
        """Attach a request whose prompt starts prefill at ``len(tokens)`` (the reused prefix the caller kept)."""
        self.check()
        # at least one prompt token is left to evaluate, for fresh logits
        assert self.state is SlotState.IDLE and len(self.tokens) < len(req.tokens), (self.id, len(self.tokens))
        self.request = req
        self.prompt = req.tokens
        self.keep = keep
        self.state = SlotState.PREFILL
        self.detok = Detokenizer()
        self.stops = StopMatcher(req.options.stop)
        self.t_start = time.perf_counter_ns()
        self.t_first = 0
        self.t_done = 0
        self.pending = -1

    def release(self) -> None:
        """Detach the request and free its sampler; the KV (``tokens``) stays for reuse."""
        self.check()
        if self.sampler is not None:
            self.sampler.close()
        self.sampler = None
        self.request = None
        self.prompt = []
        self.state = SlotState.IDLE
        self.pending = -1
        self.last_used = time.monotonic()
