"""What keeps another site from using the web view through an operator's browser.

The operations listener is on loopback, but a browser on the same machine reaches it
too, whatever page it shows: a hostile page may post a form to it (cross-site request
forgery), or have its own name resolve to 127.0.0.1 and read pages as if it were the
view itself (DNS rebinding). So:

* every page answers only to a ``Host`` that names the listener as an operator would:
  an IP address, ``localhost``, or ``KEYLANE_OPS_HOST`` itself (a rebound name is none
  of these), else 421;
* an action (a POST) must carry this process's token, which only the view's own pages
  hold (in their forms; made when the process starts, never stored), and, when the
  browser says where the request comes from (``Sec-Fetch-Site``, ``Origin``), come from
  the view's own origin; else 403, and nothing is done.
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass, field

from starlette.requests import Request

TOKEN_FIELD = "token"  # noqa: S105 (the form field's name, not a secret)


def _new_token() -> str:
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Guard:
    """The checks of one process's web view: the names it answers to, its token."""

    ops_host: str
    token: str = field(default_factory=_new_token, repr=False)

    def host_refusal(self, request: Request) -> str | None:
        """Why the request's ``Host`` is not one the view answers to (None: it is)."""
        host = _hostname(request.headers.get("host", ""))
        if host in ("localhost", self.ops_host.lower()) or _is_address(host):
            return None
        return (
            f"this view answers to an IP address, localhost or {self.ops_host} "
            f"(KEYLANE_OPS_HOST), not to {host or 'no Host header'}"
        )

    def action_refusal(self, request: Request, token: str) -> str | None:
        """Why the POST ``request`` (whose form carried ``token``) is refused (None: it
        is not): a missing or wrong token, or a browser saying it comes from elsewhere."""
        if not secrets.compare_digest(token.encode(), self.token.encode()):
            return "the form's token is missing or not this process's: reload the page and retry"
        site = request.headers.get("sec-fetch-site")
        if site is not None and site != "same-origin":
            return f"the request comes from another site (Sec-Fetch-Site: {site})"
        origin = request.headers.get("origin")
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin is not None and origin != own:
            return f"the request comes from {origin}, not from this view ({own})"
        return None


def _hostname(host: str) -> str:
    """The name in a ``Host`` header, without its port (an IPv6 address without brackets)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if ":" in host else host


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
