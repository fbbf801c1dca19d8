"""The one way ops reads a deployment's lanes: :func:`open_view` gives the view for the
configured broker — :class:`DeploymentView` on Redis, :class:`RabbitDeploymentView` on
RabbitMQ (the same questions, answered where RabbitMQ keeps the lanes)."""

from __future__ import annotations

from ..routing.contract.settings import Settings
from .cli_common import cli_store
from .deployment_view import DeploymentView


def open_view(settings: Settings) -> DeploymentView:
    """The view of the deployment's lanes (close it after use)."""
    view = DeploymentView.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    if not settings.broker_is_rabbitmq:
        return view
    from .rabbit_view import RabbitDeploymentView  # kombu and py-amqp: RabbitMQ only

    return RabbitDeploymentView(settings, view, lambda: cli_store(settings))
