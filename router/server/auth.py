"""Access control of the sidecar: client keys, run ownership, the admin key, the metrics key.

Algorithm (every check compares keys with ``hmac.compare_digest``; a key never leaves this module,
only its id ``"k-" + blake2b(key, 8 bytes)`` does, e.g. as a run's ``owner`` in the run-state store):

- Client endpoints (``/v1/*``): with client keys configured (``server.api_keys`` /
  ``api_keys_env``) a request needs ``Authorization: Bearer <client key>`` (or ``x-api-key`` / ``api-key``, as Anthropic and Azure clients send it; else 401
  ``invalid_api_key``); with none configured they are open and runs have no owner.
- Run ownership: run ids live in the namespace of the key that sends them
  (:func:`router.server.runs.identity.scoped_id`: the store key is ``<key id>/<run id>``), so another
  key's run, live or ended, is simply not there: reading, ending or signalling it answers 404
  ``run_not_found`` and a step with its id starts the caller's own run, exactly as for an unused id
  (no oracle of other keys' run ids, no squatting). :attr:`RunState.owner` is kept as a second
  check; a pin stored without a scope (before keys were configured) answers only its owner. With no
  keys configured ids are not scoped and every run is open.
- Admin endpoints (``/admin/*``): with admin keys configured (``server.admin_keys`` /
  ``admin_keys_env``) only an admin key passes (401 for none or an unknown key, 403
  ``admin_key_required`` for a client key); with client keys but no admin key they are refused
  (403 ``admin_key_required``: no client key may reload the bundle); with no keys at all (the
  development mode) only loopback clients pass (403 ``admin_loopback_only``).
- ``/metrics``: open unless metrics keys are configured (``server.metrics_keys`` /
  ``metrics_keys_env``); then a metrics key or an admin key is needed (401).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import TYPE_CHECKING

from starlette.requests import Request

from router.server.errors import ProxyError

if TYPE_CHECKING:
    from router.server.settings import ServerSettings

__all__ = ["Access", "key_id", "LOOPBACK"]

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost", "testclient"})


def key_id(key: str) -> str:
    """The stored, loggable id of a key (never the key)."""
    return "k-" + hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def _bearer(request: Request) -> str:
    """The key of a request: ``Authorization: Bearer``, else ``x-api-key`` (Anthropic clients, e.g.
    Claude Code with ``ANTHROPIC_API_KEY``) or ``api-key`` (Azure-style clients)."""
    h = request.headers
    auth = h.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return (h.get("x-api-key") or h.get("api-key") or "").strip()


def _match(token: str, keys: Iterable[str]) -> bool:
    found = False
    for k in keys:  # no early exit: the time does not depend on which key matched
        found |= hmac.compare_digest(token.encode(), k.encode())
    return found


class Access:
    """The access rules of one app (module docstring), built from ``settings.server``."""

    def __init__(self, server: ServerSettings):
        self.client_keys: frozenset[str] = server.client_keys()
        self.admin_keys: frozenset[str] = server.admin_key_set()
        self.metrics_keys: frozenset[str] = server.metrics_key_set()

    def client(self, request: Request) -> str | None:
        """The caller's key id (None in open mode); raises 401 without a valid client key."""
        if not self.client_keys:
            return None
        token = _bearer(request)
        if not token or not _match(token, self.client_keys):
            raise ProxyError(401, "invalid_api_key", "missing or invalid API key (Authorization: Bearer ...)")
        return key_id(token)

    def admin(self, request: Request) -> None:
        if self.admin_keys:
            token = _bearer(request)
            if token and _match(token, self.admin_keys):
                return
            if token and _match(token, self.client_keys):
                raise ProxyError(403, "admin_key_required", "this endpoint needs an admin key")
            raise ProxyError(
                401, "invalid_api_key", "missing or invalid admin key (Authorization: Bearer ...)"
            )
        if self.client_keys:
            raise ProxyError(
                403,
                "admin_key_required",
                "admin endpoints need server.admin_keys (client keys cannot use them)",
            )
        host = request.client.host if request.client is not None else ""
        if host not in LOOPBACK:
            raise ProxyError(
                403, "admin_loopback_only", "without keys, admin endpoints answer loopback clients only"
            )

    def metrics(self, request: Request) -> None:
        if not self.metrics_keys:
            return
        token = _bearer(request)
        if not token or not (_match(token, self.metrics_keys) or _match(token, self.admin_keys)):
            raise ProxyError(
                401, "invalid_api_key", "missing or invalid metrics key (Authorization: Bearer ...)"
            )

    @staticmethod
    def owns(owner: str | None, caller: str | None) -> bool:
        """May ``caller`` (a key id, None in open mode) use a run owned by ``owner``?"""
        return owner is None or caller is None or owner == caller
