"""Bearer-token auth from the policy file's ``auth`` section.

Tokens are never in the file: it names environment variables, resolved here from
``os.environ`` (or an injected mapping for tests). A tenant token is bound to its tenant; the
admin token may do everything. With no ``auth`` section every caller is an anonymous admin,
which is why the server refuses non-loopback binds in that case (see ``_app``).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, overload

from guard.errors import AuthError
from guard.server.runtime._status import PermissionDenied

__all__ = ["ANONYMOUS", "Authenticator", "Principal"]

log = logging.getLogger("guard.server")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling. ``tenant`` is ``None`` for the admin (or when auth is off)."""

    tenant: str | None
    admin: bool

    def check_tenant(self, tenant: str, what: str = "run") -> None:
        """Raise PermissionDenied unless this caller may act on ``tenant``."""
        if self.tenant is not None and tenant != self.tenant:
            raise PermissionDenied(
                f"token of tenant {self.tenant!r} may not access {what} of tenant {tenant!r}"
            )

    @overload
    def scope_tenant(self, tenant: str, verb: str) -> str: ...
    @overload
    def scope_tenant(self, tenant: str | None, verb: str) -> str | None: ...
    def scope_tenant(self, tenant: str | None, verb: str) -> str | None:
        """The tenant a query of this caller covers: ``tenant`` as asked (empty: all of them)
        for the admin; its own for a tenant's token, which may not ``verb`` another tenant."""
        if self.tenant is None:
            return tenant
        if tenant and tenant != self.tenant:
            raise PermissionDenied(
                f"token of tenant {self.tenant!r} may not {verb} tenant {tenant!r}"
            )
        return self.tenant

    def require_admin(self, what: str) -> None:
        if not self.admin:
            raise PermissionDenied(
                f"{what} needs the admin token (caller is tenant {self.tenant!r})"
            )


ANONYMOUS = Principal(tenant=None, admin=True)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Authenticator:
    """Maps the ``authorization: Bearer <token>`` metadata to a :class:`Principal`."""

    def __init__(self, auth: Any | None, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.enabled = auth is not None
        self._tokens: dict[bytes, Principal] = {}
        if auth is None:
            return
        admin_env = getattr(auth, "admin_token_env", None)
        if admin_env:
            token = env.get(admin_env)
            if token:
                self._tokens[_digest(token)] = Principal(tenant=None, admin=True)
            else:
                log.warning("auth: admin token variable %s is not set; admin calls fail", admin_env)
        for tenant, var in (getattr(auth, "tenants", None) or {}).items():
            token = env.get(var)
            if not token:
                log.warning("auth: token variable %s of tenant %r is not set", var, tenant)
                continue
            self._tokens[_digest(token)] = Principal(tenant=tenant, admin=False)
        self.resolved = len(self._tokens)

    def principal(self, metadata: Any) -> Principal:
        """Authenticate invocation metadata (a sequence of (key, value) pairs)."""
        if not self.enabled:
            return ANONYMOUS
        header = None
        for key, value in metadata or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode("latin-1")
                break
        if not header:
            raise AuthError("missing authorization metadata (expected 'Bearer <token>')")
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError("authorization metadata must be 'Bearer <token>'")
        found = self._tokens.get(_digest(token.strip()))
        if found is None:
            raise AuthError("unknown bearer token")
        return found
