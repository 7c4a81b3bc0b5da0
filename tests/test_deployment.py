"""Checks of the deployment files: docker-compose.yml (structure; ``docker compose config`` when a compose
CLI is installed), the Dockerfile and changefeed script it uses, and the Airflow DAG example (compiles and
imports without Airflow; with a stand-in ``airflow`` module it builds the DAG we document)."""

from __future__ import annotations

import importlib.util
import py_compile
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from ticdc_delta.config import load_config

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
DAG_FILE = REPO / "jobs" / "airflow_dag.py"
SINK_URI = "kafka://kafka:9092/tidb-cdc?protocol=canal-json&enable-tidb-extension=true&partition-num=3"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_file_passes_the_compose_cli() -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no docker compose CLI installed; the structural tests below still run")
    proc = subprocess.run([*cli, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_compose_services_and_images(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"kafka", "schema-registry", "pd", "tikv", "tidb", "ticdc", "changefeed", "job"}
    images = {name: str(svc.get("image", "")).split(":")[0] for name, svc in services.items()}
    assert images["kafka"] == "apache/kafka"
    assert images["schema-registry"] == "confluentinc/cp-schema-registry"
    for name in ("pd", "tikv", "tidb", "ticdc"):
        assert images[name] == f"pingcap/{name}"
    assert images["changefeed"] == "pingcap/ticdc"


def test_kafka_runs_in_kraft_mode(compose: dict[str, Any]) -> None:
    env = compose["services"]["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert not any("ZOOKEEPER" in key for key in env)


def test_every_dependency_and_volume_is_declared(compose: dict[str, Any]) -> None:
    services = compose["services"]
    named_volumes = set(compose.get("volumes") or {})
    for name, svc in services.items():
        deps = svc.get("depends_on") or []
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in services, f"{name} depends on unknown service {dep}"
        for volume in svc.get("volumes") or []:
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in named_volumes, f"{name} uses undeclared volume {source}"


def test_changefeed_service_creates_the_canal_json_changefeed(compose: dict[str, Any]) -> None:
    svc = compose["services"]["changefeed"]
    assert svc["environment"]["SINK_URI"] == SINK_URI
    assert svc["restart"] == "no"
    script_mount = next(v for v in svc["volumes"] if "create-changefeed.sh" in v)
    script = REPO / script_mount.split(":")[0]
    text = script.read_text()
    assert "cli changefeed create" in text and '--sink-uri="$SINK_URI"' in text
    assert SINK_URI in text  # the script's default is the same URI
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0


def test_changefeed_script_waits_then_creates_once(tmp_path: Path) -> None:
    """Run the script against a fake ``cdc`` that records its calls (no TiCDC here)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "cdc"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        'case "$*" in\n'
        '  "cli changefeed query"*) exit "${QUERY_RC:-1}" ;;\n'
        "esac\n"
        "exit 0\n"
    )
    fake.chmod(0o755)
    script = REPO / "docker" / "create-changefeed.sh"
    env = {"PATH": "/usr/bin:/bin", "CDC_BIN": str(fake), "TICDC_SERVER": "http://t:8300"}
    assert subprocess.run(["sh", str(script)], env=env, capture_output=True).returncode == 0
    lines = calls.read_text().splitlines()
    assert lines[0] == "cli capture list --server=http://t:8300"
    assert lines[-1] == (
        f"cli changefeed create --server=http://t:8300 --changefeed-id=compose-demo --sink-uri={SINK_URI}"
    )
    calls.unlink()
    proc = subprocess.run(["sh", str(script)], env={**env, "QUERY_RC": "0"}, capture_output=True, text=True)
    assert proc.returncode == 0 and "already exists" in proc.stdout
    assert not any("create" in line for line in calls.read_text().splitlines())


def test_job_service_builds_from_the_repo_and_runs_the_compose_config(compose: dict[str, Any]) -> None:
    job = compose["services"]["job"]
    assert job["build"]["context"] == "."
    dockerfile = REPO / job["build"]["dockerfile"]
    assert dockerfile.is_file() and dockerfile.parent.name == "docker"
    assert "openjdk-17" in dockerfile.read_text()
    assert job["command"] == ["python", "-m", "ticdc_delta", "run", "--config", "/conf/compose.yaml"]
    assert "./conf:/conf:ro" in job["volumes"]
    assert job["depends_on"]["changefeed"]["condition"] == "service_completed_successfully"
    # the config the container reads loads with the container's environment
    cfg = load_config(REPO / "conf" / "compose.yaml", env=job["environment"])
    assert cfg.source.bootstrap_servers == "kafka:9092"
    assert cfg.topics == ["tidb-cdc"] and cfg.source.protocol == "canal-json"
    assert cfg.source.options == {"enable-tidb-extension": "true"}
    assert cfg.sink.path.startswith("/data/") and cfg.checkpoint.startswith("/data/")


# -- the Airflow DAG ---------------------------------------------------------------------------------


def _load_dag_module(name: str = "airflow_dag_under_test") -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, DAG_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dag_file_compiles() -> None:
    py_compile.compile(str(DAG_FILE), doraise=True)


def test_dag_imports_without_airflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "airflow", None)  # `import airflow` raises ImportError
    module = _load_dag_module()
    assert module.dag is None
    assert module.EXIT_RETRYABLE == 75 and module.EXIT_TERMINAL == 1


class _FakeDAG:
    """Stands in for ``airflow.DAG``: records its arguments and the operators created inside it."""

    current: "_FakeDAG | None" = None

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.tasks: list[_FakeBashOperator] = []

    def __enter__(self) -> "_FakeDAG":
        _FakeDAG.current = self
        return self

    def __exit__(self, *exc: object) -> None:
        _FakeDAG.current = None


class _FakeBashOperator:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        assert _FakeDAG.current is not None, "operator created outside the DAG context"
        _FakeDAG.current.tasks.append(self)


@pytest.fixture
def fake_airflow(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    airflow = types.ModuleType("airflow")
    airflow.DAG = _FakeDAG  # type: ignore[attr-defined]
    operators = types.ModuleType("airflow.operators")
    bash = types.ModuleType("airflow.operators.bash")
    bash.BashOperator = _FakeBashOperator  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow", airflow)
    monkeypatch.setitem(sys.modules, "airflow.operators", operators)
    monkeypatch.setitem(sys.modules, "airflow.operators.bash", bash)
    monkeypatch.setitem(sys.modules, "airflow.providers", None)  # Airflow 2 layout: no standard provider
    monkeypatch.setenv("TICDC_DELTA_HOME", "/srv/ticdc delta")
    monkeypatch.setenv("TICDC_DELTA_CONFIG", "/etc/ticdc/prod.yaml")
    monkeypatch.setenv("TICDC_DELTA_EVERY_MINUTES", "5")
    yield


def test_dag_runs_the_job_once_on_a_schedule_with_retries(fake_airflow: None) -> None:
    module = _load_dag_module()
    dag = module.dag
    assert isinstance(dag, _FakeDAG)
    kwargs = dag.kwargs
    assert kwargs["schedule"].total_seconds() == 300
    assert kwargs["max_active_runs"] == 1 and kwargs["catchup"] is False
    assert kwargs["default_args"]["retries"] >= 1
    assert kwargs["default_args"]["on_failure_callback"] is module.page_on_call
    (task,) = dag.tasks
    command = task.kwargs["bash_command"]
    assert command == (
        "cd '/srv/ticdc delta' && exec spark-submit --master 'local[2]' "
        "jobs/ticdc_to_delta.py --config /etc/ticdc/prod.yaml --once"
    )
    assert task.kwargs["append_env"] is True


@pytest.mark.parametrize("code", [0, 1, 75])
def test_dag_command_passes_the_job_exit_code_to_airflow(tmp_path: Path, code: int) -> None:
    """BashOperator fails (and retries) the task on a non-zero exit: the command must not hide it."""
    module = _load_dag_module()
    (tmp_path / "jobs").mkdir()
    fake_submit = tmp_path / "spark-submit"
    fake_submit.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\nexit {code}\n')
    fake_submit.chmod(0o755)
    command = module.bash_command(config_path="/c.yaml", home=str(tmp_path), spark_submit=str(fake_submit))
    proc = subprocess.run(["bash", "-c", command])
    assert proc.returncode == code
    assert (tmp_path / "args").read_text().split() == [
        "--master", "local[2]", "jobs/ticdc_to_delta.py", "--config", "/c.yaml", "--once",
    ]


def test_page_on_call_logs_the_failed_task(caplog: pytest.LogCaptureFixture) -> None:
    module = _load_dag_module()
    ti = types.SimpleNamespace(dag_id="ticdc_to_delta", task_id="ticdc_to_delta_once", try_number=4, log_url="u")
    with caplog.at_level("ERROR"):
        module.page_on_call({"task_instance": ti})
    assert "page the on-call engineer" in caplog.text and "ticdc_to_delta_once" in caplog.text
