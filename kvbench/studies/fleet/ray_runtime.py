"""Starting and stopping Ray for a fleet or a fanned-out sweep.

By default ``ray.init()`` starts an embedded local cluster that listens on 127.0.0.1 only, without the
dashboard, and with the workers' logs kept out of the terminal; an address joins an existing cluster
instead. Whoever starts Ray here shuts it down in every path (:func:`ray_session`); a Ray already running in
the process (a test's, a notebook's) is used as it is and left running.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Iterator

from kvbench.errors import KvbenchError

_LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node address is the loopback interface
CONNECT_TIMEOUT_S = 3.0


def import_ray():
    """The ``ray`` module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise KvbenchError("this needs Ray, which is not installed: pip install 'kvbench[fleet]'") from None
    return ray


def check_address(address: str) -> None:
    """Refuse an address that is malformed or where nothing listens, at once (Ray itself retries for minutes)."""
    if address == "auto":
        return
    match = re.fullmatch(r"(?:ray://)?\[?([A-Za-z0-9._:-]+?)\]?:(\d{1,5})", address.strip())
    if not match or not 0 < int(match.group(2)) < 65536:
        raise KvbenchError(f"Ray address {address!r} is not HOST:PORT (or ray://HOST:PORT, or auto)")
    host, port = match.group(1), int(match.group(2))
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        raise KvbenchError(f"cannot reach the Ray cluster at {address}: {err.strerror or err}") from None


def prepare_ray(address: str | None = None):
    """Ray, imported, once ``address`` (if any) is known to be reachable: a command calls this before it prints
    or creates anything, so a missing Ray or an unreachable cluster is its first and only line."""
    if address is not None:
        check_address(address)
    else:
        os.environ.setdefault(_LOCAL_ONLY, "0")  # read when ray is imported: before the import
    return import_ray()


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[object]:
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
        yield ray
    finally:
        ray.shutdown()


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
        raise KvbenchError(f"{workers} CUDA workers need a GPU each, and the Ray cluster has {gpus}: run on fewer "
                           "instances or workers, or on the CPU")
    return {"num_gpus": 1}


def gpus_available(ray) -> int:
    return int(ray.cluster_resources().get("GPU", 0))
