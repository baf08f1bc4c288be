"""Connecting the agent to Ray: the cluster it runs in (a Ray job, or ``--address``), or an
embedded local Ray started with this machine's devices as resources."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import ray

from worker import ray_auth
from worker.device import detect, device_classes_in

log = logging.getLogger(__name__)


def connect(
    address: str | None,
    backends: tuple[str, ...],
    setup: Callable[[], None] | None = None,
    resources: dict[str, float] | None = None,
) -> str:
    """Initialise Ray; returns "cluster" or "embedded". With no address and no RAY_ADDRESS
    (set for Ray jobs) an embedded Ray starts with the devices found here."""
    if ray.is_initialized():
        return "cluster"
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray_auth.check(joining=True)
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
        return "cluster"
    if setup is not None:
        setup()
    ray_auth.check()
    if resources is None:
        found = detect(backends)
        resources = found.resources()
        num_gpus = found.cuda_count
    else:
        num_gpus = 0
    log.info("starting embedded Ray with %s", resources)
    ray.init(
        address="local",
        resources=resources,
        num_gpus=num_gpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
    )
    return "embedded"


_dashboard_url: str | None = None


def dashboard_url() -> str:
    """The Ray dashboard's URL (``http://host:port``), "" when Ray runs without one (the embedded
    Ray) or is not started; asked once per process."""
    global _dashboard_url
    if _dashboard_url is None:
        if not ray.is_initialized():
            return ""
        try:
            from ray._private.worker import get_dashboard_url  # no public API for it

            url = str(get_dashboard_url() or "")
        except Exception:  # noqa: BLE001 - a Ray without it: no link
            url = ""
        _dashboard_url = f"http://{url}" if url and "://" not in url else url
    return _dashboard_url


def device_classes() -> dict[str, int]:
    return device_classes_in(ray.cluster_resources())
