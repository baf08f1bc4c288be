"""Node bootstrap: detect this node's devices and start a Ray node that advertises them.

    python -m worker start --address HEAD:6379            join a cluster as a worker node
    python -m worker start --head [--port 6379]           start a head node (devices included)
    python -m worker start --address HEAD:6379 --dry-run  print the ``ray start`` command only
    python -m worker detect                               print the devices found, as JSON

Resources: ``device:<class>`` per device, ``backend:<backend>/<class>`` saying which backend
serves it, and ``--num-gpus`` for CUDA devices. Token auth (Ray's default) follows
``RAY_AUTH_MODE`` / ``--auth-mode``; a joining node in token mode must hold the head's token.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from worker import ray_auth
from worker.device import NodeDevices, detect


@dataclass(frozen=True)
class StartCommand:
    argv: tuple[str, ...]
    env: dict[str, str]  # additions to the environment

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


def start_command(
    devices: NodeDevices,
    address: str | None,
    head: bool = False,
    port: int = 6379,
    auth_mode: str | None = None,
    block: bool = False,
    ray_exe: str | None = None,
) -> StartCommand:
    if bool(address) == head:
        raise ValueError("give exactly one of --address HOST:PORT (join) or --head (start)")
    exe = ray_exe or shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")
    argv = [exe, "start"]
    argv += ["--head", f"--port={port}"] if head else [f"--address={address}"]
    argv.append("--resources=" + json.dumps(devices.resources(), sort_keys=True))
    if devices.cuda_count:
        argv.append(f"--num-gpus={devices.cuda_count}")
    if block:
        argv.append("--block")
    env = ray_auth.auth_env(auth_mode, joining=not head)
    return StartCommand(tuple(argv), env)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m worker", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", help="start a Ray node advertising this node's devices")
    s.add_argument("--address", help="head node HOST:PORT to join")
    s.add_argument("--head", action="store_true", help="start a head node instead")
    s.add_argument("--port", type=int, default=6379, help="head port (with --head)")
    s.add_argument("--backends", help="comma-separated backends to probe (default: all)")
    s.add_argument(
        "--with-cpu",
        action="store_true",
        help="also advertise the NumPy 'cpu' class (default: only when no GPU is found)",
    )
    s.add_argument("--auth-mode", choices=ray_auth.MODES, help="default: $RAY_AUTH_MODE or token")
    s.add_argument("--block", action="store_true", help="keep ray start in the foreground")
    s.add_argument("--dry-run", action="store_true", help="print the ray start command only")
    d = sub.add_parser("detect", help="print the devices of this node as JSON")
    d.add_argument("--backends")
    d.add_argument("--with-cpu", action="store_true")
    args = p.parse_args(argv)

    backends = tuple(args.backends.split(",")) if args.backends else None
    devices = detect(backends, with_cpu=True if args.with_cpu else None)
    if args.command == "detect":
        out = {"devices": [d.to_dict() for d in devices.devices], "resources": devices.resources()}
        print(json.dumps(out, indent=1))
        return 0
    try:
        cmd = start_command(devices, args.address, args.head, args.port, args.auth_mode, args.block)
    except (ValueError, ray_auth.AuthSetupError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not devices.devices:
        print(
            "warning: no device found on this node; it joins with no device resources",
            file=sys.stderr,
        )
    print(cmd.shell())
    if args.dry_run:
        return 0
    return subprocess.run(cmd.argv, env={**os.environ, **cmd.env}).returncode
