"""Small pieces shared by the ASGI apps of relays and bootstrap nodes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


async def serve_lifespan(receive: Callable[[], Awaitable[dict[str, Any]]],
                         send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """Answer the ASGI lifespan protocol (nothing to start or stop) until shutdown."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
