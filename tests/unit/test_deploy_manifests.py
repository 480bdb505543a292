"""The deployment files, checked offline: ``docker-compose.yml``, ``deploy/Dockerfile``,
``deploy/kubernetes/*.yaml``. Nothing is started (no Docker engine, no Kubernetes API).

- The compose file validates with ``docker-compose config`` (Debian's ``docker-compose``
  package; CI installs it in ``.ci/run``).
- Every command the compose file and the Kubernetes manifests run in the EventBus image is an
  entry point the Dockerfile installs (``pyproject.toml [project.scripts]`` plus ``ray`` from
  the ``ray`` dependency, plus the base image's ``python``), with subcommands and flags that
  those commands really have (read from their click/typer definitions).
- The Kubernetes manifests validate against Kubernetes' strict JSON schemas (the
  ``kubernetes-validate`` package) and the RayCluster against KubeRay's ``ray.io/v1`` fields
  (``tests/unit/data/kuberay-raycluster-v1.schema.json``, whose pod templates are Kubernetes'
  own schemas); and the pieces refer to each other by the right names.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
K8S_DIR = ROOT / "deploy" / "kubernetes"
KUBERAY_SCHEMA = Path(__file__).parent / "data" / "kuberay-raycluster-v1.schema.json"
KUBERNETES_VERSION = "1.33"
TORCH_PIN = "2.13.0"
COMPOSE_ENV = {"RAY_AUTH_TOKEN": "unit-test-token"}


# -- helpers ----------------------------------------------------------------------------------


def _docker_compose() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail(
            "docker-compose is not installed: `apt-get install -y docker-compose` (Debian's package; .ci/run installs it)"
        )
    return exe


def _compose_config(
    path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_", "RAY_"))
    }
    return subprocess.run(
        [_docker_compose(), "--ansi", "never", "-f", str(path), "config"],
        env={**clean, **(env if env is not None else COMPOSE_ENV)},
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@functools.cache
def _resolved_compose() -> dict[str, Any]:
    res = _compose_config(COMPOSE)
    assert res.returncode == 0, res.stderr
    doc: dict[str, Any] = yaml.safe_load(res.stdout)
    return doc


def _k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


def _containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container of a workload (Deployment, Job, RayCluster head and workers)."""
    spec = doc.get("spec", {})
    templates = []
    if "template" in spec:
        templates.append(spec["template"])
    if doc["kind"] == "RayCluster":
        templates.append(spec["headGroupSpec"]["template"])
        templates += [g["template"] for g in spec.get("workerGroupSpecs", [])]
    for t in templates:
        yield from t["spec"].get("initContainers", [])
        yield from t["spec"]["containers"]


def _dockerfile() -> tuple[str, list[str]]:
    """The base image and the RUN instructions (continuation lines joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    [base] = [line.split()[1] for line in lines if line.upper().startswith("FROM ")]
    runs = [line[4:].strip() for line in lines if line.upper().startswith("RUN ")]
    return base, runs


@functools.cache
def _entry_points() -> dict[str, dict[str, set[str]] | None]:
    """Programs the image installs -> their subcommands -> each subcommand's options.

    ``None`` for a program whose arguments are not checked (the base image's ``python``).
    """
    base, runs = _dockerfile()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installs_project = any(re.search(r"\bpip install\b.*\s\.(\s|$)", r) for r in runs)
    programs: dict[str, dict[str, set[str]] | None] = {}
    if installs_project:
        for script, target in project["scripts"].items():
            assert target == "eventbus.cli:main", f"unexpected entry point {script} = {target}"
            import typer.main

            from eventbus.cli import app

            group = typer.main.get_command(app)
            programs[script] = {name: _options(cmd) for name, cmd in group.commands.items()}  # type: ignore[attr-defined]
        if any(
            re.match(r"ray(\[[^\]]*\])?\s*(==|>=|~=|$)", dep) for dep in project["dependencies"]
        ):
            from ray.scripts.scripts import cli as ray_cli

            programs["ray"] = {name: _options(cmd) for name, cmd in ray_cli.commands.items()}
    if base.startswith("python:"):
        programs["python"] = None
    return programs


def _options(command: Any) -> set[str]:
    return {
        opt
        for param in command.params
        for opt in (*param.opts, *param.secondary_opts)
        if opt.startswith("-")
    }


def _check_command(argv: list[str], where: str) -> None:
    """``argv`` runs an entry point of the image, with a real subcommand and real options."""
    programs = _entry_points()
    assert argv, f"{where}: empty command"
    program = argv[0]
    assert program in programs, (
        f"{where}: {program!r} is not installed by deploy/Dockerfile (it installs {sorted(programs)})"
    )
    subcommands = programs[program]
    if subcommands is None:
        return
    assert len(argv) > 1 and argv[1] in subcommands, (
        f"{where}: `{program} {argv[1:2]}` is no {program} subcommand"
    )
    known = subcommands[argv[1]]
    for arg in argv[2:]:
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            assert flag in known, f"{where}: `{program} {argv[1]}` has no option {flag}"


def _compose_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every command run in a container built from deploy/Dockerfile."""
    out = []
    for name, svc in _resolved_compose()["services"].items():
        if svc.get("build", {}).get("dockerfile") != "deploy/Dockerfile":
            continue
        command = svc.get("command")
        assert command, f"service {name}: no command (the image's CMD only prints help)"
        out.append(
            (
                f"service {name}: command",
                shlex.split(command) if isinstance(command, str) else command,
            )
        )
        test = svc.get("healthcheck", {}).get("test")
        if test:
            assert test[0] in ("CMD", "CMD-SHELL"), test
            argv = test[1:] if test[0] == "CMD" else shlex.split(test[1])
            out.append((f"service {name}: healthcheck", argv))
    return out


# -- docker-compose.yml -------------------------------------------------------------------------


def test_compose_file_validates_with_docker_compose_config() -> None:
    services = _resolved_compose()["services"]
    assert set(services) == {
        "kafka",
        "redis",
        "ray-head",
        "ray-worker",
        "gateway",
        "deploy-example",
    }
    # Every service that waits on another waits for it to be healthy (or, for a one-shot, started).
    for name, svc in services.items():
        for dep, cond in svc.get("depends_on", {}).items():
            assert cond["condition"] == "service_healthy", f"{name} -> {dep}: {cond}"
            assert "healthcheck" in services[dep], (
                f"{name} waits for {dep} to be healthy, which has no healthcheck"
            )
    assert set(services["gateway"]["depends_on"]) == {"kafka", "redis", "ray-head"}
    assert set(services["deploy-example"]["depends_on"]) == {
        "kafka",
        "redis",
        "ray-head",
        "ray-worker",
    }
    # Ports published to the host are published on loopback only.
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:") or port.get("host_ip") == "127.0.0.1", (
                f"{name}: {port}"
            )


def test_compose_wires_every_eventbus_process_to_the_same_services() -> None:
    services = _resolved_compose()["services"]
    ours = {
        n: s
        for n, s in services.items()
        if s.get("build", {}).get("dockerfile") == "deploy/Dockerfile"
    }
    assert set(ours) == {"ray-head", "ray-worker", "gateway", "deploy-example"}
    assert len({s["image"] for s in ours.values()}) == 1
    for name, svc in ours.items():
        env = svc["environment"]
        assert env["EVENTBUS_KAFKA_BOOTSTRAP"] == "kafka:9092", name
        assert env["EVENTBUS_REDIS_URL"] == "redis://redis:6379/0", name
        assert (
            env["RAY_AUTH_MODE"] == "token"
            and env["RAY_AUTH_TOKEN"] == COMPOSE_ENV["RAY_AUTH_TOKEN"]
        ), name
    head = services["ray-head"]["command"]
    assert "--head" in head and "--port=6379" in head and "--ray-client-server-port=10001" in head
    assert "--address=ray-head:6379" in services["ray-worker"]["command"]
    # Processes that are not Ray nodes use Ray Client on the head (a driver needs a local raylet).
    for name in ("gateway", "deploy-example"):
        assert services[name]["environment"]["RAY_ADDRESS"] == "ray://ray-head:10001", name
    assert services["gateway"]["command"] == [
        "eventbus",
        "gateway",
        "--host",
        "0.0.0.0",
        "--http-port",
        "8080",
        "--grpc-port",
        "50051",
    ]
    deployed = services["deploy-example"]["command"][-1]
    assert (ROOT / deployed).is_file(), deployed


def test_compose_refuses_to_start_without_a_ray_token() -> None:
    res = _compose_config(COMPOSE, env={})
    assert res.returncode != 0
    assert "set RAY_AUTH_TOKEN" in res.stderr


def test_docker_compose_config_rejects_a_broken_file(tmp_path: Path) -> None:
    """The validator really validates: a misspelt healthcheck condition fails it."""
    broken = COMPOSE.read_text().replace(
        "condition: service_healthy", "condition: service_healty", 1
    )
    assert broken != COMPOSE.read_text()
    (tmp_path / "docker-compose.yml").write_text(broken)
    res = _compose_config(tmp_path / "docker-compose.yml")
    assert res.returncode != 0
    assert "service_healty" in res.stderr


# -- deploy/Dockerfile --------------------------------------------------------------------------


def test_dockerfile_installs_cpu_torch_first_then_the_project() -> None:
    base, runs = _dockerfile()
    assert base == "python:3.11-slim"
    text = DOCKERFILE.read_text()
    assert f"ARG TORCH_VERSION={TORCH_PIN}" in text
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    torch = [i for i, r in enumerate(runs) if "torch==" in r]
    project = [i for i, r in enumerate(runs) if re.search(r"\bpip install\b.*\s\.(\s|$)", r)]
    assert torch and project and torch[0] < project[0], runs
    assert '--index-url "${TORCH_INDEX_URL}"' in runs[torch[0]]
    # The example pipeline the compose file and the Job deploy is in the image.
    assert re.search(r"^COPY examples \./examples$", text, re.M)


def test_every_compose_command_is_an_entry_point_of_the_image() -> None:
    commands = _compose_commands()
    assert {argv[0] for _, argv in commands} >= {"ray", "eventbus"}
    for where, argv in commands:
        _check_command(argv, where)


def test_the_command_check_catches_unknown_commands_and_flags() -> None:
    with pytest.raises(AssertionError, match="is not installed"):
        _check_command(["kafka-server-start.sh"], "x")
    with pytest.raises(AssertionError, match="no eventbus subcommand"):
        _check_command(["eventbus", "serve"], "x")
    with pytest.raises(AssertionError, match="has no option --http_port"):
        _check_command(["eventbus", "gateway", "--http_port", "8080"], "x")
    with pytest.raises(AssertionError, match="has no option --worker"):
        _check_command(["ray", "start", "--worker"], "x")


# -- deploy/kubernetes ------------------------------------------------------------------------


@functools.cache
def _kuberay_validator() -> Any:
    import importlib.resources

    import jsonschema
    from referencing import Registry, Resource

    # The same strict definitions kubernetes_validate checks the other manifests with.
    strict = (
        importlib.resources.files("kubernetes_validate")
        / "kubernetes-json-schema"
        / f"v{KUBERNETES_VERSION}.0-local-strict"
    )
    definitions = json.loads((strict / "_definitions.json").read_text())
    schema = json.loads(KUBERAY_SCHEMA.read_text())
    registry: Registry[Any] = Registry().with_resources(
        [
            (definitions["$id"], Resource.from_contents(definitions)),
            (schema["$id"], Resource.from_contents(schema)),
        ]
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _validate(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("ray.io/"):
        assert doc["kind"] == "RayCluster", f"no KubeRay schema for {doc['kind']} here"
        errors = sorted(_kuberay_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))
        if errors:
            msg = "\n".join(
                f"{'.'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in errors
            )
            raise AssertionError(msg)
        return
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        msg = f"{'.'.join(map(str, e.absolute_path))}: {e.message[:300]}"
        raise AssertionError(msg) from None


@pytest.mark.parametrize(("where", "doc"), _k8s_docs(), ids=[w for w, _ in _k8s_docs()])
def test_kubernetes_manifest_validates(where: str, doc: dict[str, Any]) -> None:
    _validate(doc)


def test_the_schemas_catch_mistakes() -> None:
    docs = dict(_k8s_docs())
    cluster = docs["raycluster.yaml:RayCluster/eventbus"]
    bad = copy.deepcopy(cluster)
    bad["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0  # must be the string "0"
    with pytest.raises(AssertionError, match="rayStartParams.num-cpus"):
        _validate(bad)
    bad = copy.deepcopy(cluster)
    bad["spec"]["workerGroupSpec"] = bad["spec"].pop("workerGroupSpecs")
    with pytest.raises(AssertionError, match="workerGroupSpec"):
        _validate(bad)
    bad = copy.deepcopy(cluster)
    bad["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMap"] = {
        "name": "x"
    }
    with pytest.raises(AssertionError, match="configMap"):
        _validate(bad)
    bad = copy.deepcopy(docs["gateway.yaml:Deployment/eventbus-gateway"])
    bad["spec"]["replica"] = bad["spec"].pop("replicas")
    with pytest.raises(AssertionError, match="replica"):
        _validate(bad)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    files = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)


def test_kubernetes_pieces_refer_to_each_other() -> None:
    docs = [doc for _, doc in _k8s_docs()]
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    [cluster] = by_kind["RayCluster"].values()
    head_svc = f"{cluster['metadata']['name']}-head-svc"  # the Service KubeRay creates for the head
    client_port = cluster["spec"]["headGroupSpec"]["rayStartParams"]["ray-client-server-port"]
    config = by_kind["ConfigMap"]["eventbus-config"]["data"]
    external = {n for n, s in by_kind["Service"].items() if s["spec"].get("type") == "ExternalName"}
    assert config["EVENTBUS_KAFKA_BOOTSTRAP"].split(":")[0] in external
    assert config["EVENTBUS_REDIS_URL"].removeprefix("redis://").split(":")[0] in external
    assert cluster["spec"]["gcsFaultToleranceOptions"]["redisAddress"].split(":")[0] in external

    secrets = set()
    images = set()
    for doc in docs:
        for c in _containers(doc):
            where = f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}"
            images.add(c["image"])
            for src in c.get("envFrom", []):
                assert src["configMapRef"]["name"] in by_kind["ConfigMap"], where
            env = {e["name"]: e for e in c.get("env", [])}
            token = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
            secrets.add((token["name"], token["key"]))
            if "RAY_ADDRESS" in env:  # not a Ray node: Ray Client on the head service
                assert env["RAY_ADDRESS"]["value"] == f"ray://{head_svc}:{client_port}", where
            if "command" in c:
                _check_command(c["command"], where)
            for probe in ("readinessProbe", "livenessProbe"):
                if "exec" in c.get(probe, {}):
                    _check_command(c[probe]["exec"]["command"], f"{where} {probe}")
    assert len(images) == 1, images
    # The Secret is created by hand (deploy/README.md says how), so it is named there.
    assert secrets == {("eventbus-ray-token", "auth_token")}
    readme = (ROOT / "deploy" / "README.md").read_text()
    assert "kubectl create secret generic eventbus-ray-token --from-literal=auth_token=" in readme
    # The Job deploys a pipeline file that the image has.
    [job] = by_kind["Job"].values()
    assert (ROOT / job["spec"]["template"]["spec"]["containers"][0]["command"][-1]).is_file()
