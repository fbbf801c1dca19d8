"""The benchmark's baseline receiver: the least a webhook endpoint can do with Redis.

It parses the JSON body and ``LPUSH``es it to one list: no validation, no dedupe, no
shard routing, no Celery message. It is served by uvicorn exactly as ``keylane serve``
serves the real receiver (same loop, HTTP parser and options), so the ratio between the
two is the price of keylane's checks and of its accept script.

Run as ``python -m keylane.ops.bench.baseline --port P --redis-url URL --key KEY``.
"""

from __future__ import annotations

import argparse
import json

import redis.asyncio as aioredis
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def create_baseline(redis_url: str, key: str) -> Starlette:
    """An ASGI app that answers 202 after one ``LPUSH`` of the parsed body."""
    client = aioredis.Redis.from_url(
        redis_url, socket_timeout=5, socket_connect_timeout=5, health_check_interval=15
    )

    async def webhook(request: Request) -> Response:
        body = await request.body()
        try:
            json.loads(body)
        except ValueError:
            return JSONResponse({"error": "malformed_json"}, status_code=400)
        await client.lpush(key, body)
        return JSONResponse({"status": "accepted"}, status_code=202)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/webhooks/{source}", webhook, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )


def main() -> None:
    """Serve the baseline app until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--key", required=True, help="the Redis list to push to")
    args = parser.parse_args()
    uvicorn.run(
        create_baseline(args.redis_url, args.key),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main()
