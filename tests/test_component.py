"""The YAML declaration (OnlineTrainingPipelineComponent): same definitions as Python, bad YAML named by its path.

Unit rows validate attributes the way the two dg commands do: ``dg check yaml``
checks the component's JSON schema (Draft 2020-12), ``dg check defs`` and
``dg dev`` load the attributes through the model.  The integration test runs
the real ``dg`` on the example project and on a scaffolded one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from dagster import ComponentTree
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from kale_dagster import (
    KafkaSource,
    KubernetesLauncherConfig,
    OnlineTrainingPipeline,
    ThroughputModel,
    build_definitions,
)
from kale_dagster.definitions.component import (
    OnlineTrainingPipelineAttributes,
    OnlineTrainingPipelineComponent,
)
from kale_dagster.model.limits import Limits

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "kale_project"
SOURCE = {"bootstrap_servers": "127.0.0.1:9092", "topics": ["clicks"], "group_id": "ctr-trainer"}


def summary(defs) -> dict:
    """What a user sees of a code location: asset and check keys, jobs, schedules with crons, sensors with intervals."""
    repo = defs.get_repository_def()
    return {
        "assets": sorted(k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()),
        "checks": sorted(f"{k.asset_key.to_user_string()}:{k.name}" for k in repo.asset_graph.asset_check_keys),
        "jobs": sorted(j.name for j in repo.get_all_jobs() if not j.name.startswith("__")),
        "schedules": sorted((s.name, s.cron_schedule, str(s.default_status)) for s in repo.schedule_defs),
        "sensors": sorted((s.name, s.minimum_interval_seconds, str(s.default_status)) for s in repo.sensor_defs),
        "resources": sorted(repo.get_top_level_resources()),
    }


def load(attributes: dict) -> OnlineTrainingPipeline:
    return OnlineTrainingPipelineAttributes.model_validate(attributes).pipeline()


def test_yaml_and_python_declare_the_same_definitions():
    python = OnlineTrainingPipeline(
        name="ctr",
        source=KafkaSource(
            bootstrap_servers="127.0.0.1:9092",
            topics=("clicks",),
            group_id="ctr-trainer",
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="kale",
            sasl_password_env="KALE_CTR_KAFKA_PASSWORD",
        ),
        limits=Limits(min_workers=2, max_workers=32, slo_minutes=15),
        policy="hpa",
        policy_options={"target_utilization": 50},
        throughput_prior=ThroughputModel.sync(16384, (0.00035, 2.5726, 0.9824, 0.02786)),
        global_batch=16384,
        advisory=True,
        autostart=False,
        launcher=KubernetesLauncherConfig(
            image="registry.example.com/ctr-trainer:1.4",
            namespace="ml",
            checkpoint_pvc="ctr-checkpoints",
            kafka_secret="ctr-kafka-credentials",
            node_selector={"nvidia.com/gpu.product": "NVIDIA-A10"},
            tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
        ),
    )
    declared = yaml.safe_load("""
        name: ctr
        source:
          bootstrap_servers: "127.0.0.1:9092"
          topics: [clicks]
          group_id: ctr-trainer
          security_protocol: SASL_PLAINTEXT
          sasl_mechanism: SCRAM-SHA-512
          sasl_username: kale
          sasl_password_env: KALE_CTR_KAFKA_PASSWORD
        limits: {min_workers: 2, max_workers: 32, slo_minutes: 15}
        policy: hpa
        policy_options: {target_utilization: 50}
        throughput_prior: {form: sync, global_batch: 16384, theta: [0.00035, 2.5726, 0.9824, 0.02786]}
        global_batch: 16384
        advisory: true
        autostart: false
        launcher:
          kind: kubernetes
          image: registry.example.com/ctr-trainer:1.4
          namespace: ml
          checkpoint_pvc: ctr-checkpoints
          kafka_secret: ctr-kafka-credentials
          node_selector: {nvidia.com/gpu.product: NVIDIA-A10}
          tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
    """)
    from_yaml = load(declared)
    assert from_yaml == python
    context = ComponentTree.for_test().load_context
    component = OnlineTrainingPipelineComponent.load(OnlineTrainingPipelineAttributes.model_validate(declared), context)
    assert summary(component.build_defs(context)) == summary(build_definitions(python))


def test_defaults_are_the_python_apis():
    assert load({"name": "ctr", "source": SOURCE}) == OnlineTrainingPipeline(
        name="ctr", source=KafkaSource(bootstrap_servers="127.0.0.1:9092", topics=("clicks",), group_id="ctr-trainer")
    )


# (case, attributes, the field the errors name, what `dg check yaml` says (its JSON schema; None: it passes),
#  what loading says (dg check defs, dg dev))
BAD_YAML = [
    ("missing source", {"name": "ctr"}, "source", "'source' is a required property", "Field required"),
    (
        "unknown policy",
        {"name": "ctr", "source": SOURCE, "policy": "kael"},
        "policy",
        "'kael' is not one of ['kale', 'kale_stabilizer', 'hpa', 'keda', 'static']",
        "Input should be 'kale', 'kale_stabilizer', 'hpa', 'keda' or 'static'",
    ),
    (
        "unknown forecaster",
        {"name": "ctr", "source": SOURCE, "forecaster": "arima"},
        "forecaster",
        "'arima' is not one of",
        "Input should be 'prophet'",
    ),
    (
        "literal password",
        {"name": "ctr", "source": {**SOURCE, "sasl_password": "hunter2-secret"}},
        "sasl_password",
        "('sasl_password' was unexpected)",
        "put it in an environment variable and name that variable in sasl_password_env",
    ),
    (
        "password env not a variable name",
        {"name": "ctr", "source": {**SOURCE, "sasl_password_env": "hunter2 secret"}},
        "sasl_password_env",
        "does not match",
        "should match pattern",
    ),
    (
        "negative workers",
        {"name": "ctr", "source": SOURCE, "limits": {"min_workers": -1}},
        "limits.min_workers",
        "less than the minimum of 0",
        "greater than or equal to 0",
    ),
    ("bad name", {"name": "CTR-1", "source": SOURCE}, "name", "does not match", "should match pattern"),
    (
        "unknown launcher",
        {"name": "ctr", "source": SOURCE, "launcher": {"kind": "slurm"}},
        "launcher",
        "slurm",
        "does not match any of the expected tags: 'local', 'kubernetes'",
    ),
    (
        "typo in an attribute",
        {"name": "ctr", "source": SOURCE, "limits": {"max_worker": 4}},
        "max_worker",
        "('max_worker' was unexpected)",
        "Extra inputs are not permitted",
    ),
    (
        "every bad attribute at once",
        {"name": "ctr", "source": SOURCE, "limits": {"max_workers": 0, "slo_minutes": -1}, "forecaster": "arima"},
        "limits.slo_minutes",
        "less than or equal to the minimum of 0",
        "3 validation errors",
    ),
    # JSON Schema cannot compare two fields or call a policy's build: loading catches these, with the dataclasses'
    # messages.
    (
        "kubernetes without a place for the checkpoints",
        {"name": "ctr", "source": SOURCE, "launcher": {"kind": "kubernetes", "image": "t:1"}},
        "attributes.launcher.checkpoint_pvc",
        None,
        "give one place for the checkpoints: checkpoint_pvc",
    ),
    (
        "min_workers above max_workers",
        {"name": "ctr", "source": SOURCE, "limits": {"min_workers": 9, "max_workers": 8}},
        "attributes.limits.min_workers",
        None,
        "must be <= max_workers (8), got 9",
    ),
    (
        "SASL without a username",
        {"name": "ctr", "source": {**SOURCE, "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}},
        "attributes.source.sasl_username",
        None,
        "needs a username and a password",
    ),
    (
        "linear prior without its rate",
        {"name": "ctr", "source": SOURCE, "throughput_prior": {"form": "linear"}},
        "attributes.throughput_prior.per_worker_rate",
        None,
        "form linear needs per_worker_rate",
    ),
    (
        "policy option the policy does not take",
        {"name": "ctr", "source": SOURCE, "policy": "hpa", "policy_options": {"target": 0.5}},
        "attributes.policy_options",
        None,
        "not valid for policy 'hpa'",
    ),
    (
        "trainer that is no import path",
        {"name": "ctr", "source": SOURCE, "trainer": "train.py"},
        "trainer",
        "does not match",
        "should match pattern",
    ),
    (
        "trainer that is not installed",
        {"name": "ctr", "source": SOURCE, "trainer": "mypkg.train:make_trainer"},
        "attributes.trainer",
        None,
        "no module 'mypkg'",
    ),
    (
        "a credential in the trainer's options",
        {"name": "ctr", "source": SOURCE, "trainer_options": {"hf_token": "hunter2"}},
        "attributes.trainer_options",
        None,
        "hf_token look like credentials",
    ),
    (
        "public trainer URL",
        {"name": "ctr", "source": SOURCE, "launcher": {"kind": "local", "trainer_url": "http://10.0.0.5:8765"}},
        "attributes.launcher.trainer_url",
        None,
        "loopback",
    ),
]


@pytest.mark.parametrize("case, attributes, field, schema_says, load_says", BAD_YAML, ids=[row[0] for row in BAD_YAML])
def test_bad_yaml_fails_naming_the_field(case, attributes, field, schema_says, load_says):
    schema_errors = list(
        Draft202012Validator(OnlineTrainingPipelineAttributes.model_json_schema()).iter_errors(attributes)
    )
    checked = " | ".join(f"attributes.{'.'.join(map(str, e.absolute_path))} {e.message}" for e in schema_errors)
    if schema_says is None:
        assert not schema_errors, checked
    else:
        assert field in checked and schema_says in checked, checked
    with pytest.raises(ValidationError) as info:
        load(attributes)
    loaded = str(info.value)
    assert field in loaded and load_says in loaded, loaded
    assert (
        "hunter2" not in checked.replace("'hunter2 secret' does not match", "") and "hunter2" not in loaded
    )  # nothing written is echoed


def test_the_scaffolded_yaml_loads_and_lists_the_choices(tmp_path):
    from dagster import ScaffoldRequest

    from kale_dagster.definitions.component import _Scaffolder

    target = tmp_path / "click-rate"
    _Scaffolder().scaffold(
        ScaffoldRequest(
            type_name="kale_dagster.OnlineTrainingPipelineComponent",
            target_path=target,
            scaffold_format="yaml",
            project_root=tmp_path,
            params=None,
        )
    )
    text = (target / "defs.yaml").read_text()
    assert "one of: kale, kale_stabilizer, hpa, keda, static" in text and "sasl_password_env" in text
    doc = yaml.safe_load(text)
    assert doc["type"] == "kale_dagster.OnlineTrainingPipelineComponent"
    pipeline = load(doc["attributes"])
    assert pipeline.name == "click_rate" and pipeline.advisory  # scaffolded pipelines start advisory


def dg(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("dg")
    if exe is None:
        pytest.fail("dg is not installed: pip install -e '.[dev]' installs dagster-dg-cli")
    env = dict(
        os.environ, DAGSTER_HOME=str(home), PYTHONPATH=str(cwd / "src"), DAGSTER_DISABLE_TELEMETRY="1", COLUMNS="200"
    )
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.integration
def test_dg_lists_scaffolds_checks_and_loads_yaml_pipelines(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    listed = dg("list", "components", "--json", cwd=EXAMPLE, home=home)
    assert listed.returncode == 0, listed.stderr
    assert "kale_dagster.OnlineTrainingPipelineComponent" in listed.stdout

    # The shipped example: valid YAML, and its definitions are the pipeline's.
    checked = dg("check", "yaml", cwd=EXAMPLE, home=home)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    defs = dg("list", "defs", "--json", cwd=EXAMPLE, home=home)
    assert defs.returncode == 0, defs.stderr
    listed_defs = json.loads(defs.stdout)
    example = yaml.safe_load((EXAMPLE / "src/kale_project/defs/ctr/defs.yaml").read_text())["attributes"]
    expected = summary(build_definitions(load(example)))
    assert sorted(a["asset_key"] for a in listed_defs["assets"]) == expected["assets"]
    assert sorted(c["key"] for c in listed_defs["asset_checks"]) == expected["checks"]
    assert sorted(j["name"] for j in listed_defs["jobs"]) == expected["jobs"]
    assert sorted(s["name"] for s in listed_defs["sensors"]) == [s[0] for s in expected["sensors"]]
    assert sorted(s["name"] for s in listed_defs["schedules"]) == [s[0] for s in expected["schedules"]]

    # A new user's path: scaffold a second pipeline into a copy, break it, see the field named.
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    scaffolded = dg(
        "scaffold", "defs", "kale_dagster.OnlineTrainingPipelineComponent", "clicks", cwd=project, home=home
    )
    assert scaffolded.returncode == 0, scaffolded.stdout + scaffolded.stderr
    defs_yaml = project / "src/kale_project/defs/clicks/defs.yaml"
    assert dg("check", "yaml", cwd=project, home=home).returncode == 0
    assert dg("check", "defs", cwd=project, home=home).returncode == 0

    defs_yaml.write_text(defs_yaml.read_text().replace("policy: kale ", "policy: kael "))
    bad = dg("check", "yaml", cwd=project, home=home)
    assert bad.returncode == 1
    assert (
        "defs/clicks/defs.yaml" in bad.stdout + bad.stderr
        and "attributes.policy 'kael' is not one of" in bad.stdout + bad.stderr
    )

    defs_yaml.write_text(
        defs_yaml.read_text().replace("policy: kael ", "policy: kale ").replace("min_workers: 1", "min_workers: 9")
    )
    assert dg("check", "yaml", cwd=project, home=home).returncode == 0  # a schema cannot compare two fields...
    loaded = dg("check", "defs", cwd=project, home=home)
    assert loaded.returncode != 0  # ...loading does, with the dataclass's own message
    assert "attributes.limits.min_workers: must be <= max_workers (8), got 9" in loaded.stdout + loaded.stderr
    assert "defs/clicks/defs.yaml" in loaded.stdout + loaded.stderr


def test_the_cli_finds_a_yaml_pipeline_by_loading_the_projects_definitions(tmp_path, monkeypatch, capsys):
    """kale k8s render and kale history backfill load a code location's definitions (-m, -f, -w): a pipeline
    declared in a dg project's YAML is found like one declared in Python."""
    import sys

    from kale_dagster.cli import main

    project = tmp_path / "kale_project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    defs_yaml = project / "src/kale_project/defs/ctr/defs.yaml"
    spec = yaml.safe_load(defs_yaml.read_text())
    spec["attributes"]["launcher"] = {
        "kind": "kubernetes",
        "image": "registry.example.com/ranker:2",
        "checkpoint_pvc": "ckpt",
    }
    defs_yaml.write_text(yaml.safe_dump(spec))
    monkeypatch.syspath_prepend(str(project / "src"))
    for name in [m for m in sys.modules if m == "kale_project" or m.startswith("kale_project.")]:
        monkeypatch.delitem(sys.modules, name)
    assert main(["k8s", "render", "--pipeline", "ctr", "--workers", "3", "-m", "kale_project.definitions"]) == 0
    manifests = list(yaml.safe_load_all(capsys.readouterr().out))
    job = next(m for m in manifests if m["kind"] == "Job")
    assert job["spec"]["parallelism"] == 3
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/ranker:2"
    # A name the location does not declare is one line listing what it does.
    assert main(["k8s", "render", "--pipeline", "nope", "--workers", "1", "-m", "kale_project.definitions"]) == 2
    assert "no pipeline 'nope' in module kale_project.definitions; found: " in capsys.readouterr().err


def test_the_cli_reads_the_workspace_file_by_default(tmp_path, monkeypatch, capsys):
    from kale_dagster.cli import main

    (tmp_path / "team_pipelines.py").write_text(
        "from kale_dagster import KafkaSource, KubernetesLauncherConfig, OnlineTrainingPipeline, build_definitions\n"
        "defs = build_definitions(OnlineTrainingPipeline(name='ws_clicks', source=KafkaSource('127.0.0.1:9092', "
        "('clicks',), 'g'), launcher=KubernetesLauncherConfig(image='trainer:1', checkpoint_pvc='ckpt')))\n"
    )
    (tmp_path / "workspace.yaml").write_text("load_from:\n  - python_file:\n      relative_path: team_pipelines.py\n")
    monkeypatch.chdir(tmp_path)
    assert main(["k8s", "render", "--pipeline", "ws_clicks", "--workers", "2"]) == 0
    assert "kind: Job" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path.parent)
    assert main(["k8s", "render", "--pipeline", "ws_clicks", "--workers", "2"]) == 2
    assert "name the code location with -m MODULE, -f FILE or -w WORKSPACE" in capsys.readouterr().err


def test_env_templates_render_in_any_attribute_and_an_unset_one_is_named(monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "10.1.2.3:9092")
    monkeypatch.setenv("MAX_WORKERS", "24")
    monkeypatch.delenv("NO_SUCH_VARIABLE", raising=False)
    templated = {
        "name": "ctr",
        "source": {**SOURCE, "bootstrap_servers": "{{ env.KAFKA_BOOTSTRAP }}"},
        "limits": {"max_workers": "{{ env.MAX_WORKERS }}"},
        "trainer_options": {"region": "{{ env('REGION_UNSET_HERE', 'eu') }}"},
    }
    p = load(templated)
    assert p.source.bootstrap_servers == "10.1.2.3:9092" and p.limits.max_workers == 24
    assert p.trainer_options == {"region": "eu"}
    with pytest.raises(ValidationError) as info:
        load({**templated, "source": {**SOURCE, "group_id": "{{ env.NO_SUCH_VARIABLE }}"}})
    assert "attributes.source.group_id: environment variable NO_SUCH_VARIABLE is not set" in str(info.value)


def test_template_vars_and_env_render_when_the_project_loads_and_are_checked_then(tmp_path, monkeypatch):
    """A defs.yaml's template_vars_module and {{ env.* }}, as Dagster renders a Resolvable component's: the
    schema (dg check yaml) passes a template in a typed attribute, loading renders it and checks the value."""
    import sys

    from kale_dagster.definitions.build import built_pipelines

    project = tmp_path / "kale_project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    ctr = project / "src/kale_project/defs/ctr"
    (ctr / "team_vars.py").write_text(
        "import os\n\nimport dagster as dg\n\n\n@dg.template_var\ndef trainer_image():\n"
        "    return 'registry.example.com/ranker:7'\n\n\n@dg.template_var\ndef max_workers():\n"
        "    return int(os.environ.get('TEAM_MAX_WORKERS', '12'))\n"
    )
    spec = yaml.safe_load((ctr / "defs.yaml").read_text())
    spec["template_vars_module"] = ".team_vars"
    attributes = spec["attributes"]
    attributes["source"]["bootstrap_servers"] = "{{ env.KAFKA_BOOTSTRAP }}"
    attributes["limits"]["max_workers"] = "{{ max_workers }}"
    attributes["launcher"] = {"kind": "kubernetes", "image": "{{ trainer_image }}", "checkpoint_pvc": "ckpt"}
    (ctr / "defs.yaml").write_text(yaml.safe_dump(spec))
    schema = Draft202012Validator(OnlineTrainingPipelineAttributes.model_json_schema())
    assert not [e.message for e in schema.iter_errors(attributes)]

    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.2:9092")
    monkeypatch.syspath_prepend(str(project / "src"))

    def load_project():
        for name in [m for m in sys.modules if m == "kale_project" or m.startswith("kale_project.")]:
            monkeypatch.delitem(sys.modules, name)
        import kale_project.definitions

        kale_project.definitions.defs()
        return built_pipelines()["ctr"]

    pipeline = load_project()
    assert pipeline.source.bootstrap_servers == "127.0.0.2:9092" and pipeline.limits.max_workers == 12
    assert isinstance(pipeline.launcher, KubernetesLauncherConfig)
    assert pipeline.launcher.image == "registry.example.com/ranker:7"
    # A rendered value is checked by the same rules as a literal one, named by its path.
    monkeypatch.setenv("TEAM_MAX_WORKERS", "0")
    with pytest.raises(Exception) as info:
        load_project()
    assert (
        "attributes.limits.max_workers: Input should be greater than or equal to 1 (rendered from '{{ max_workers }}')"
        in str(info.value.__cause__)
    )


def test_every_attribute_is_documented_in_the_schema_dg_and_the_ui_show():
    schema = OnlineTrainingPipelineAttributes.model_json_schema()
    defs = schema.get("$defs", {})
    undocumented: list[str] = []

    def walk(node: dict, path: str) -> None:
        node = defs[node["$ref"].split("/")[-1]] if "$ref" in node else node
        for name, prop in (node.get("properties") or {}).items():
            target = defs[prop["$ref"].split("/")[-1]] if "$ref" in prop else prop
            if not (prop.get("description") or target.get("description")):
                undocumented.append(f"{path}.{name}")
            if target.get("properties"):
                walk(target, f"{path}.{name}")
        for branch in node.get("allOf", []):
            if "then" in branch:
                walk(branch["then"], f"{path}[{branch['if']['properties']['kind']['const']}]")

    walk(schema, "attributes")
    assert not undocumented, undocumented
