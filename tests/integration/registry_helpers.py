"""A schema registry (or any ASGI app) served on a loopback port, in a thread of its own."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import uvicorn

__all__ = ["Served"]


class Served:
    """An ASGI app on a loopback port, in a thread of its own (lifespan on)."""

    def __init__(self, app: Any, lifespan: str = "on", sock: socket.socket | None = None) -> None:
        """``sock``: a bound socket to listen on (its port known before); else a free port."""
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, lifespan=lifespan, log_level="warning")
        )
        ready = threading.Event()

        def run() -> None:
            async def main() -> None:
                task = asyncio.create_task(self.server.serve([sock] if sock else None))
                while not self.server.started and not task.done():
                    await asyncio.sleep(0.01)
                ready.set()
                await task

            asyncio.run(main())

        self.thread = threading.Thread(target=run, daemon=True, name="schema-registry")
        self.thread.start()
        assert ready.wait(60), "the registry did not start within 60 s"
        assert self.server.started, "the registry's startup failed (see the log)"
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()
