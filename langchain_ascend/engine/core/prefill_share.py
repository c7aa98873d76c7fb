"""How much prefill a step with decode rows may carry, and what a prefill chunk costs there.
Pure Python, no torch.

Policy, stated up front (Sarathi-Serve's stall-free batching): a step with decode rows carries
about ``limit`` worth of prefill, running chunks and admitted prompts together, so a stream's
next token waits for about that much prefill. On the CPU a 2,048-token step is over a second.
"About": a chunk is sized by the cost at its first token and charged at its mean position (it
may pass the share by ~count^2 / 2C: 12% for SmolLM2's first 256-token chunk), and a request is
admitted with at least one token while any share is left - so several hops run a chunk at
once, and the order of the running prefills decides who advances (``Scheduler.schedule``).

With a ``cost_context`` the share is charged by cost, not tokens: a token at position p weighs
``1 + p / cost_context``, since its attention over the p keys before it costs what its
products cost once p reaches that context (``engine.hf_config.attention_cost_context``). On
the CPU, 256 SmolLM2 tokens after 4k cached ones took 5x the time of the same 256 at the
start: an agent's hop after a tool call. Charged by tokens, such a chunk stretched every
decode step beside it to ~0.7 s, and the agents advanced a token per 0.7 s in lockstep
(``docs/performance.md``).
"""

from __future__ import annotations


class PrefillShare:
    """The prefill one step with decode rows has left.

    Args:
        limit: The step's share, in tokens at position 0.
        cost_context: The context whose attention costs what a token's products cost; None
            charges plain tokens.
    """

    def __init__(self, limit: float, cost_context: float | None = None) -> None:
        self.left = float(limit)
        self.cost_context = cost_context

    def tokens(self, start: int) -> int:
        """The prefill tokens from position ``start`` the share left pays for (about: a
        chunk's own growth is charged when it is taken); 0 when spent."""
        if self.left <= 0:
            return 0
        scale = 1.0 if self.cost_context is None else 1 + start / self.cost_context
        return int(self.left / scale)

    def take(self, count: int, start: int) -> None:
        """Charge ``count`` prefill tokens from position ``start`` (each at its mean
        position) to the share."""
        mean = 0.0 if self.cost_context is None else (start + count / 2) / self.cost_context
        self.left -= count * (1 + mean)
