"""A request's own failures inside a model step, kept its own.

A request's callbacks inside a step (its grammar constraint's ``mask_logits`` /
``accept_token`` / ``is_terminated`` / ``jump_forward`` / ``count_accepted``) run behind a :class:`GuardedConstraint`
that records an exception instead of letting it end the step; the driver then fails that
request alone with the error :func:`fault_error` makes (see ``engine.driver``).
"""

from __future__ import annotations

from typing import Any

from langchain_ascend.engine.core.request import Request
from langchain_ascend.errors import RequestFaultError


class GuardedConstraint:
    """One request's :class:`~langchain_ascend.engine.core.sampling_params.TokenConstraint`,
    with its exceptions recorded in :attr:`fault` instead of raised into the step.

    Once faulted the wrapper stops calling the constraint: ``mask_logits`` leaves a neutral
    row (all zeros, so sampling that row cannot fail on an all ``-inf`` row; its token is
    discarded anyway), ``accept_token`` does nothing and ``is_terminated`` says True. Other
    attributes are the wrapped constraint's.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.fault: tuple[str, Exception] | None = None

    def mask_logits(self, logits: Any) -> None:
        if self.fault is None:
            try:
                self.inner.mask_logits(logits)
                return
            except Exception as exc:  # noqa: BLE001 - the request's own failure
                self.fault = ("mask_logits", exc)
        logits.fill_(0.0)

    def accept_token(self, token_id: int) -> None:
        if self.fault is None:
            try:
                self.inner.accept_token(token_id)
            except Exception as exc:  # noqa: BLE001 - the request's own failure
                self.fault = ("accept_token", exc)

    def is_terminated(self) -> bool:
        if self.fault is None:
            try:
                return bool(self.inner.is_terminated())
            except Exception as exc:  # noqa: BLE001 - the request's own failure
                self.fault = ("is_terminated", exc)
        return True

    def jump_forward(self, limit: int) -> list[int]:
        """The wrapped constraint's forced tokens (none if it has no ``jump_forward``)."""
        jump = getattr(self.inner, "jump_forward", None)
        if self.fault is None and jump is not None:
            try:
                return [int(t) for t in jump(limit)]
            except Exception as exc:  # noqa: BLE001 - the request's own failure
                self.fault = ("jump_forward", exc)
        return []

    def count_accepted(self, tokens: list[int]) -> int:
        """How many leading ``tokens`` the wrapped constraint would accept (none once faulted;
        every one if it cannot tell)."""
        count = getattr(self.inner, "count_accepted", None)
        if count is None:
            return len(tokens)
        if self.fault is None:
            try:
                return int(count(tokens))
            except Exception as exc:  # noqa: BLE001 - the request's own failure
                self.fault = ("count_accepted", exc)
        return 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def fault_of(request: Request) -> tuple[str, Exception] | None:
    """``(callback, exception)`` when the request's own constraint failed, else None."""
    constraint = request.sampling.constraint
    return constraint.fault if isinstance(constraint, GuardedConstraint) else None


def fault_error(request: Request, fault: tuple[str, Exception]) -> RequestFaultError:
    """The error a request whose own callback failed ends with (the cause chained)."""
    where, exc = fault
    error = RequestFaultError(
        f"request {request.request_id!r} failed in its own part of the model step: its "
        f"constraint's {where}() raised {type(exc).__name__}: {exc}; the other requests "
        "of the step were not affected")
    error.__cause__ = exc
    return error
