"""Which physical device a Vulkan worker process opens, on a node with several.

Ray places a worker by one unit of ``device:<class>`` and, unlike GPUs, gives custom resources no
per-unit ids: two workers of one class on a node would both open the loader's first device, and a
worker of class ``rx9070xt`` on a node that also has an R9700 could open the R9700. So the worker
picks for itself: the devices of its class that the node serves (worker.device.served_devices),
the first one whose lock file it can take with an exclusive ``flock``. The kernel drops the lock
when the process dies, so a worker the agent kills and restarts frees its device for its
replacement. The worker opens the picked index (``Evaluator(device=...)``).

Locks live in ``$FLEETTUNE_LOCK_DIR`` or ``<tmp>/fleettune-<uid>-devices`` (one per host: Ray
nodes sharing a host share its devices). An operator's pinned device
(``engine.backends.default_device``: ``FLEETTUNE_VK_DEVICE``) wins, unlocked.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from pathlib import Path
from typing import IO

from worker.device import served_devices

log = logging.getLogger(__name__)


def lock_dir() -> Path:
    d = os.environ.get("FLEETTUNE_LOCK_DIR")
    return Path(d) if d else Path(tempfile.gettempdir()) / f"fleettune-{os.getuid()}-devices"


def claim(indices: list[int], directory: Path, kind: str = "vulkan") -> tuple[int, IO | None]:
    """The first index in ``indices`` whose lock this process takes, with the open lock file
    (keep it open for as long as the device is used). When every one is taken (more workers of
    a class than devices), the first index and no lock: the workers share it, with a warning."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in indices:
        f = (directory / f"{kind}-{i}.lock").open("a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        return i, f
    log.warning(
        "every %s device %s is taken by another worker on this host; sharing %d",
        kind,
        indices,
        indices[0],
    )
    return indices[0], None


def claim_vulkan_device(device_class: str) -> tuple[int | None, IO | None]:
    """Pick and lock this worker's Vulkan device of ``device_class``: (index to open, lock).
    The operator's pinned device: (that index, None). (None, None) when no served device has
    the class (the backend then opens its default device and reports its class)."""
    from engine.backends import default_device

    pinned = default_device("vulkan")
    if pinned is not None:
        return pinned, None
    mine = [d.index for d in served_devices("vulkan") if d.device_class == device_class]
    if not mine:
        return None, None
    index, lock = claim(mine, lock_dir())
    log.info("vulkan worker of class %s takes physical device %d of %s", device_class, index, mine)
    return index, lock
