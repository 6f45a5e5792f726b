"""Starting and stopping Ray for a fleet or a fanned-out sweep: the one module of kvbench that imports Ray.

By default ``ray.init()`` starts an embedded local cluster that listens on 127.0.0.1 only, without the
dashboard, and with the workers' logs kept out of the terminal; an address joins an existing cluster
instead. Whoever starts Ray here shuts it down in every path (:func:`ray_session`); a Ray already running in
the process (a test's, a notebook's) is used as it is and left running.

Ray's processes (GCS, raylet, workers, agents) listen on every interface unless Ray's "no cluster" switch is
off when it decides its node address; they are unauthenticated, so whoever reaches them can run code here.
The switch is an environment variable read when ``ray`` is first imported (and inherited by the processes
Ray starts), so this module sets it before its import, and sets Ray's own constant too where ``ray`` was
imported earlier by something else; after the start it checks the node's address and refuses any other.
Every other module gets Ray from :func:`prepare_ray` or :func:`ray_session` (a test enforces it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from kvbench.errors import KvbenchError

_LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node address is the loopback interface
_USER_LOCAL_ONLY = os.environ.get(_LOCAL_ONLY)  # what the user had set, restored to join a cluster
CONNECT_TIMEOUT_S = 3.0
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS
_SETTINGS_FRAME = 0x04


def import_ray():
    """The ``ray`` module, or a one-line error saying how to install it (use :func:`prepare_ray`)."""
    try:
        import ray
    except ImportError:
        raise KvbenchError("this needs Ray, which is not installed: pip install 'kvbench[fleet]'") from None
    return ray


def _network_mode(local: bool) -> None:
    """Loopback only for a local cluster (before Ray's import, and in Ray's constant if it was imported
    already); the user's own setting back when joining a cluster, whose nodes must reach this driver."""
    if local:
        os.environ[_LOCAL_ONLY] = "0"
    elif _USER_LOCAL_ONLY is None:
        os.environ.pop(_LOCAL_ONLY, None)
    else:
        os.environ[_LOCAL_ONLY] = _USER_LOCAL_ONLY
    constants: Any = sys.modules.get("ray._private.ray_constants")  # a private module: no types to rely on
    if constants is not None and hasattr(constants, "ENABLE_RAY_CLUSTER"):
        default = not getattr(constants, "IS_WINDOWS_OR_OSX", False)
        setting = os.environ.get(_LOCAL_ONLY)
        constants.ENABLE_RAY_CLUSTER = not local and (default if setting is None else setting.lower() in ("1", "true"))


def check_address(address: str) -> None:
    """Refuse, at once and within a few seconds, an address that is malformed, where nothing listens, or where
    something other than Ray listens (Ray itself retries for minutes, and waits for ever on an HTTP server):
    Ray's GCS and client server speak gRPC, so an HTTP/2 preface gets a SETTINGS frame back."""
    if address == "auto":
        return
    match = re.fullmatch(r"(?:ray://)?\[?([A-Za-z0-9._:-]+?)\]?:(\d{1,5})", address.strip())
    if not match or not 0 < int(match.group(2)) < 65536:
        raise KvbenchError(f"Ray address {address!r} is not HOST:PORT (or ray://HOST:PORT, or auto)")
    host, port = match.group(1), int(match.group(2))
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as connection:
            connection.sendall(_HTTP2_PREFACE)
            head = _read_up_to(connection, 9, deadline)
    except OSError as err:
        if isinstance(err, TimeoutError):
            raise KvbenchError(
                f"the Ray cluster at {address} did not answer within {CONNECT_TIMEOUT_S:g} s: "
                "is it the GCS port of a Ray head node?"
            ) from None
        raise KvbenchError(f"cannot reach the Ray cluster at {address}: {err.strerror or err}") from None
    if len(head) < 9 or head[3] != _SETTINGS_FRAME:
        seen = head.split(b"\r\n")[0][:40].decode("ascii", "backslashreplace") if head else "closed the connection"
        raise KvbenchError(
            f"{address} does not answer as a Ray cluster (Ray speaks gRPC; it answered {seen!r}): "
            "is it the GCS port of a Ray head node?"
        )


def _read_up_to(connection: socket.socket, size: int, deadline: float) -> bytes:
    """At least ``size`` bytes (what came with them too, to quote a wrong answer), fewer when the peer closes;
    a TimeoutError past ``deadline`` (the whole read, not one ``recv``)."""
    data = b""
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        connection.settimeout(left)
        chunk = connection.recv(256)
        if not chunk:
            break
        data += chunk
    return data


def prepare_ray(address: str | None = None) -> ModuleType:
    """Ray, imported, once ``address`` (if any) is known to answer as a Ray cluster, and set for a
    loopback-only cluster when there is none: a command calls this before it prints or creates anything, so a
    missing Ray or an unreachable cluster is its first and only line."""
    if address is not None:
        check_address(address)
    _network_mode(local=address is None)  # before the import: Ray reads it then
    return import_ray()


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[ModuleType]:
    """Ray, started (or joined) for the block and shut down after it, however it ends."""
    ray = prepare_ray(address)
    if ray.is_initialized():
        yield ray
        return
    kwargs = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    try:
        if address is None:
            ray.init(num_cpus=num_cpus, **kwargs)
        else:
            ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as err:
        where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
        raise KvbenchError(f"cannot start or join {where}: {str(err).splitlines()[0] if str(err) else err}") from None
    try:
        if address is None:
            _check_loopback(ray)
        yield ray
    finally:
        ray.shutdown()


def _check_loopback(ray) -> None:
    """Refuse a local cluster whose node address is not the loopback interface (its ports would be open to
    the network): Ray's setting was lost somewhere."""
    node_ip = ray.util.get_node_ip_address()
    try:
        loopback = ipaddress.ip_address(node_ip).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise KvbenchError(
            f"the local Ray cluster came up on {node_ip}, not on the loopback interface: refusing to "
            "run on ports others could reach"
        )


def uses_gpu(device: str, simulate: bool, gpus: int) -> bool:
    """Whether a run's Ray workers each reserve a GPU: only tensor engines whose device is CUDA (``auto``
    becomes CUDA on a worker only where the cluster has GPUs). A CPU run or a simulation never holds one, so
    it is never left waiting for GPUs that other workers hold."""
    if simulate:
        return False
    device = (device or "auto").strip().lower()
    return device == "cuda" or device.startswith("cuda:") or (device == "auto" and gpus > 0)


def actor_resources(device: str, simulate: bool, gpus: int, workers: int, cpus: float = 1.0) -> dict[str, float]:
    """What each of ``workers`` Ray workers reserves: one GPU for a CUDA run (refused where the cluster has too
    few for all of them, which would otherwise wait for ever), else ``cpus`` CPUs."""
    if not uses_gpu(device, simulate, gpus):
        return {"num_cpus": cpus}
    if gpus < workers:
        raise KvbenchError(
            f"{workers} CUDA workers need a GPU each, and the Ray cluster has {gpus}: run on fewer "
            "instances or workers, or on the CPU"
        )
    return {"num_gpus": 1}


def check_gpus_here(device: str, simulate: bool, address: str | None, workers: int) -> None:
    """Before an embedded cluster starts: a CUDA run needs a GPU per worker on this machine (Ray would count
    the same GPUs, but only after its start-up)."""
    if address is not None or not uses_gpu(device, simulate, 0):
        return
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < workers:
        raise KvbenchError(
            f"{workers} CUDA workers need a GPU each, and this machine has {gpus}: run on fewer "
            "instances or workers, on the CPU, or on a Ray cluster that has the GPUs"
        )


def gpus_available(ray) -> int:
    return int(ray.cluster_resources().get("GPU", 0))
