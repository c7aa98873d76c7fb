"""Whether a token just appended to a request ends it, and how. Pure Python, no torch.

In turn: the model's EOS (unless ``ignore_eos``) and the request's stop tokens end it as
stopped, the token hidden from the text; the grammar's end (only at the step's last token: a
drafted token before it is checked by the next one) ends it as stopped; ``max_tokens`` or the
context's end as cut by the length. A reply whose constraint was ``shortened`` by its budget
guard (``XGrammarConstraint``) finishes as cut by the length whatever ended it.
"""

from __future__ import annotations

from langchain_ascend.engine.core.request import Request, RequestStatus


def stop_status(request: Request, token_id: int, max_model_len: int, *,
                grammar: bool = True) -> RequestStatus | None:
    """The finished status the newly appended ``token_id`` causes, if any; the grammar's end
    only with ``grammar`` (the step's last token)."""
    status = _end_status(request, token_id, max_model_len, grammar=grammar)
    shortened = getattr(request.sampling.constraint, "shortened", False)
    return RequestStatus.FINISHED_LENGTH if status and shortened else status


def _end_status(request: Request, token_id: int, max_model_len: int, *,
                grammar: bool) -> RequestStatus | None:
    params = request.sampling
    if not params.ignore_eos and token_id in request.eos_token_ids:
        request.last_token_hidden = True
        return RequestStatus.FINISHED_STOPPED
    if token_id in request.stop_token_ids:
        request.last_token_hidden = True
        request.stop_reason = token_id
        return RequestStatus.FINISHED_STOPPED
    if grammar and params.constraint is not None and params.constraint.is_terminated():
        return RequestStatus.FINISHED_STOPPED
    if request.num_output_tokens >= params.max_tokens or request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None
