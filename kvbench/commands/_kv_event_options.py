"""Listening to a server's KV event stream: the three options, declared once for the commands that listen
(``sweep --target`` per point, ``watch`` live), and their checks (one-line errors naming the flag)."""

from __future__ import annotations

from dataclasses import dataclass

import typer

from kvbench.commands import _flags
from kvbench.errors import KvbenchError
from kvbench.measure.kv_events import parse_endpoint

# Annotated style (``name: Annotated[type, OPTION] = default``)
KV_EVENTS = _flags.KV_EVENTS.annotated(
    "The server's KV event stream (ZMQ: a port on 127.0.0.1, tcp://HOST:PORT or ipc://PATH): its resident "
    "blocks, lifetimes, eviction churn and thrash."
)
KV_EVENTS_BIND = typer.Option(
    "--kv-events-bind",
    help="Listen on the --kv-events address and let the server connect (vLLM connects to a tcp://HOST:PORT its "
    "--kv-events-config endpoint names; kvbench serve binds its own).",
)
KV_EVENTS_REPLAY = _flags.KV_EVENTS_REPLAY.annotated()


@dataclass(frozen=True)
class Listening:
    endpoint: str
    replay: str | None
    bind: bool


def listening(events: str | None, replay: str | None, bind: bool) -> Listening | None:
    """The options as given, checked; None without ``--kv-events`` (then the other two are refused)."""
    if events is None:
        if replay is not None:
            raise KvbenchError("--kv-events-replay replays the stream of --kv-events: give that address too")
        if bind:
            raise KvbenchError("--kv-events-bind listens on the --kv-events address: give that address too")
        return None
    endpoint = _address(events, "--kv-events")
    if bind and endpoint.startswith("tcp://") and not _loopback(endpoint):
        raise KvbenchError(
            f"--kv-events-bind {endpoint}: kvbench listens on loopback only (127.0.0.1 or [::1]); the server "
            "connects to it from the same machine"
        )
    return Listening(endpoint, _address(replay, "--kv-events-replay") if replay is not None else None, bind)


def _loopback(endpoint: str) -> bool:
    host = endpoint[len("tcp://") :].rpartition(":")[0]
    return host in ("127.0.0.1", "localhost", "[::1]")


def _address(text: str, flag: str) -> str:
    try:
        return parse_endpoint(text, bind=False)
    except ValueError as err:
        raise KvbenchError(f"{flag}: {err}") from None
