"""The web view on the operations listener: deliveries, dead letters, records
(``ops/docs/web-view.md``)."""

from .routes import web_routes

__all__ = ["web_routes"]
