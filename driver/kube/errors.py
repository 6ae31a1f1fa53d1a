"""The Kubernetes API's errors, typed once for every caller.

Every call through :class:`driver.kube.client.KubeClient` raises a :class:`KubeError` subclass
that says what happened (:class:`NotFound`, :class:`Conflict`, :class:`Forbidden`,
:class:`Unavailable`); callers branch on the type, never on a status number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass
class KubeError(Exception):
    """An API call failed: HTTP status (0 when no answer came), reason and the server's message."""

    status: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"


class NotFound(KubeError):
    """404: the object (or its namespace) does not exist."""


class Conflict(KubeError):
    """409: a resourceVersion or UID precondition failed, or the object exists already."""


class Forbidden(KubeError):
    """403: RBAC or an admission policy refused the call."""


class Unavailable(KubeError):
    """The API server did not answer, or answered that it cannot now (429, 5xx): retry later."""


class KubeConfigError(ValueError):
    """The kubeconfig or in-cluster environment cannot be used; names the field and reason."""


_BY_STATUS: dict[int, type[KubeError]] = {
    404: NotFound,
    409: Conflict,
    403: Forbidden,
    429: Unavailable,
    500: Unavailable,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
}


def error_for(status: int, reason: str, raw: bytes | str) -> KubeError:
    """The typed error of a non-2xx answer; the message is the Status object's, else the body."""
    message = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        message = json.loads(message).get("message", message)
    except (ValueError, AttributeError):
        pass
    return _BY_STATUS.get(status, KubeError)(status=status, reason=reason, message=message)
