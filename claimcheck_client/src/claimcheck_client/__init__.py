"""Claimcheck's Python client: submit work and get one ticket, wait for it,
answer turns as an ``http`` agent, verify signed webhook deliveries."""

from __future__ import annotations

__version__ = "0.1.0"

from ._sse import Step  # noqa: E402
from .aio import AsyncClient  # noqa: E402
from .client import Client  # noqa: E402
from .errors import (  # noqa: E402
    CircuitOpen,
    ClaimcheckError,
    DedupeConflict,
    EndpointBusy,
    EndpointPaused,
    EndpointQuarantined,
    Forbidden,
    Invalid,
    InvalidTransition,
    NotFound,
    RateLimited,
    StaleTurn,
    TooLarge,
    TraceBudgetExhausted,
    TransportError,
    Unauthenticated,
    Unavailable,
    WebhookVerificationError,
)
from .models import (  # noqa: E402
    TERMINAL_STATES,
    Artifact,
    CallbackInfo,
    DeliveryInfo,
    ErrorBody,
    Event,
    Lineage,
    LineageNode,
    ReturnTo,
    Ticket,
    Turn,
    TurnRef,
)
from .turns import TurnAgent  # noqa: E402
from .webhooks import verify_webhook  # noqa: E402

__all__ = [
    "TERMINAL_STATES",
    "Artifact",
    "AsyncClient",
    "CallbackInfo",
    "CircuitOpen",
    "ClaimcheckError",
    "Client",
    "DedupeConflict",
    "DeliveryInfo",
    "EndpointBusy",
    "EndpointPaused",
    "EndpointQuarantined",
    "ErrorBody",
    "Event",
    "Forbidden",
    "Invalid",
    "InvalidTransition",
    "Lineage",
    "LineageNode",
    "NotFound",
    "RateLimited",
    "ReturnTo",
    "StaleTurn",
    "Step",
    "Ticket",
    "TooLarge",
    "TraceBudgetExhausted",
    "TransportError",
    "Turn",
    "TurnAgent",
    "TurnRef",
    "Unauthenticated",
    "Unavailable",
    "WebhookVerificationError",
    "verify_webhook",
]
