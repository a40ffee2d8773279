"""Serve ``jobs_api`` with uvicorn, ending open streams the moment shutdown starts.

    python examples/service/serve.py --host 127.0.0.1 --port 8000

On SIGTERM or SIGINT uvicorn stops accepting, then waits for every open
response to finish, and only after that runs the lifespan's shutdown (where
the Supervisor closes). A log or watch stream lasts as long as its app, so
the server would wait on them: this server subclass calls
``Supervisor.begin_shutdown()`` from uvicorn's own signal handling, which
ends every stream and wait at once, and the server stops promptly. The
library installs no signal handler; this is the server's, as it should be.

Prints ``listening on http://HOST:PORT`` once serving (``--port 0`` picks a free port).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

# Run as a script, this file's directory is first on sys.path: jobs_api is found beside it.
from jobs_api import app


class Server(uvicorn.Server):
    """uvicorn's server, calling ``on_shutdown`` on the loop when a signal asks it to stop."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        for server in self.servers:
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                print(f"listening on http://{host}:{port}", flush=True)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # A signal handler: hand the call to the loop rather than run it in between.
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_shutdown)


def begin_shutdown() -> None:
    sv = getattr(app.state, "sv", None)  # None before the lifespan started
    if sv is not None:
        sv.begin_shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        lifespan="on",
        # A backstop only: with the streams ended, open responses finish at once.
        timeout_graceful_shutdown=5,
    )
    Server(config, begin_shutdown).run()


if __name__ == "__main__":
    main()
