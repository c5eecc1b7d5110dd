"""The component package (provider/): its committed schema is the one the components'
annotations give, it passes Pulumi's package metaschema (vendored: tests/infra/schemas/pulumi.json),
every input has a type and a description, secrets are marked, every stack key is an input or
has a reason not to be, and the plugin Pulumi runs serves that schema.

The Pulumi CLI is not here: ``pulumi package add`` and the SDKs it generates are not run;
the plugin is started as Pulumi starts it and asked for its schema over gRPC, as the CLI does."""
from __future__ import annotations

import copy
import difflib
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import jsonschema
import pytest
import yaml

import provider
from infra import config
from provider import keys, schema as package
from provider.components import COMPONENTS
from provider.host import ElasticCtrProvider

ROOT = Path(__file__).resolve().parents[2]
METASCHEMA = Path(__file__).resolve().parent / "schemas" / "pulumi.json"
#: inputs whose names read like a credential but hold the name of a Secret or of its key
SECRET_REFERENCES = {"uploadTokenSecret", "uploadTokenKey"}
CREDENTIAL_NAME = re.compile(r"token|password|secret|accesskey|credential", re.IGNORECASE)


@pytest.fixture(scope="module")
def fresh() -> dict:
    return package.package_schema()


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads(package.SCHEMA_FILE.read_text())


def metaschema() -> dict:
    """Pulumi's metaschema, its patterns' named groups in Python's syntax (``(?P<name>``)."""
    meta = json.loads(METASCHEMA.read_text())

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "pattern" and isinstance(v, str):
                    node[k] = re.sub(r"\(\?<(?=[A-Za-z])", "(?P<", v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(meta)
    return meta


def metaschema_errors(schema: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(metaschema(), format_checker=jsonschema.FormatChecker())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(schema)]


def properties(schema: dict):
    """(where, name, property) of every input and output of every resource and type."""
    for token, res in schema["resources"].items():
        for name, prop in res["inputProperties"].items():
            yield f"{token} input", name, prop
        for name, prop in res["properties"].items():
            yield f"{token} output", name, prop
    for token, typ in schema["types"].items():
        for name, prop in typ.get("properties", {}).items():
            yield f"{token} property", name, prop


def test_pulumi_package_schema_json_is_generated_from_the_components(fresh, committed):
    if committed != fresh:
        diff = "".join(list(difflib.unified_diff(package.text(committed).splitlines(True),
                                                 package.text(fresh).splitlines(True),
                                                 "provider/schema.json", "fresh", n=1))[:60])
        pytest.fail(f"provider/schema.json is not the components' schema: run `{package.REGENERATE}` "
                    f"(python -m provider.schema) and commit it\n{diff}")
    assert package.SCHEMA_FILE.read_text() == package.text(fresh)  # the file's exact text too


def test_pulumi_package_component_schema_passes_pulumis_metaschema(committed):
    assert metaschema_errors(committed) == []
    # every $ref of the package's own types names a type it declares
    refs = set(re.findall(r'"\$ref": "#/types/([^"]+)"', json.dumps(committed)))
    assert refs and refs <= set(committed["types"])


@pytest.mark.parametrize("break_it", [
    lambda s: s.update(version="one"),
    lambda s: s["resources"].update({"elastic-ctr:Serving": s["resources"]["elastic-ctr:index:Serving"]}),
    lambda s: s["resources"]["elastic-ctr:index:Serving"]["inputProperties"]["servingReplicas"].update(plain="yes"),
    lambda s: s["types"]["elastic-ctr:index:Parts"].update(type="dict"),
    lambda s: s["resources"]["elastic-ctr:index:Serving"].update(isComponent="yes"),
], ids=["version", "token", "plain", "type", "isComponent"])
def test_component_schema_metaschema_refuses_a_broken_schema(committed, break_it):
    broken = copy.deepcopy(committed)
    break_it(broken)
    assert metaschema_errors(broken)


def test_component_schema_names_the_package_and_every_component(committed):
    assert committed["name"] == provider.NAME == "elastic-ctr"
    assert committed["version"] == provider.version() == _pyproject_version()
    assert sorted(committed["resources"]) == sorted(provider.token(c.__name__) for c in COMPONENTS)
    assert {"Images", "Credentials", "ObjectStoreAccess", "FileServer", "TrackingServer", "TrainingJob",
            "CubeCluster", "CubeTransfer", "Serving", "NetworkPolicies", "Monitoring"} == {c.__name__ for c in COMPONENTS}
    for res in committed["resources"].values():
        assert res["isComponent"] is True and res["description"]


def _pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'^version = "([^"]+)"', text, re.MULTILINE).group(1)


def test_component_schema_every_input_and_output_has_a_type_and_a_description(committed):
    for where, name, prop in properties(committed):
        assert prop.get("description", "").strip(), f"{where} {name}: no description"
        assert "type" in prop or "$ref" in prop, f"{where} {name}: no type"
        for inner in ("items", "additionalProperties"):
            if inner in prop:
                assert "type" in prop[inner] or "$ref" in prop[inner], f"{where} {name}: untyped {inner}"


def test_component_schema_inputs_that_are_stack_keys_say_what_the_reference_says(committed):
    from infra.config_reference import config_rows

    rows = {r["key"]: r for r in config_rows()}
    replicas = committed["resources"]["elastic-ctr:index:Serving"]["inputProperties"]["servingReplicas"]
    assert replicas["type"] == "integer" and replicas["plain"] is True
    assert rows["servingReplicas"]["description"] in replicas["description"]
    assert "Allowed: an integer in [1, 100]. Default: `2`." in replicas["description"]
    mode = committed["resources"]["elastic-ctr:index:TrainingJob"]["inputProperties"]["psMode"]
    assert "Allowed: async | async-merged | geo. Default: `async`." in mode["description"]
    for name, keyed in keys.KEYS.items():
        for key in keyed:
            token = (f"elastic-ctr:index:{name}" if name in ("Deployment", "EnvVar", "Parts")
                     else f"elastic-ctr:index:{name.removesuffix('Args')}")
            where = committed["types"] if token in committed["types"] else committed["resources"]
            props = where[token].get("properties" if where is committed["types"] else "inputProperties")
            assert rows[key]["description"] in props[key]["description"], (name, key)
            assert f"Stack key `{key}`" in props[key]["description"], (name, key)
            assert props[key]["type"] == {"integer": "integer", "boolean": "boolean"}.get(
                rows[key]["type"], props[key]["type"]), (name, key)


def test_component_schema_secrets_are_marked_and_never_plain(committed):
    secret_inputs = set()
    for where, name, prop in properties(committed):
        if prop.get("secret"):
            assert not prop.get("plain"), f"{where} {name}: a secret must be an Input (an Output stays secret)"
            if where.endswith("input") or where.endswith("property"):
                secret_inputs.add(name)
        elif where.endswith("input") and prop.get("type") == "string" and name not in SECRET_REFERENCES:
            assert not CREDENTIAL_NAME.search(name), f"{where} {name}: reads like a credential but is not secret"
    stack_secrets = {k for ks in keys.KEYS.values() for k in ks if k in config.SECRETS}
    assert stack_secrets <= secret_inputs
    assert {"uploadToken", "registryPassword", "trackingBackendStoreUri", "cubeControlToken", "trackingPassword",
            "storageSecretAccessKey", "storageReadSecretAccessKey"} <= secret_inputs
    assert committed["resources"]["elastic-ctr:index:Credentials"]["properties"]["values"]["secret"] is True
    assert "secret" not in committed["resources"]["elastic-ctr:index:Credentials"]["properties"]["secrets"]


def test_pulumi_package_covers_every_stack_key():
    inputs = {k for ks in keys.KEYS.values() for k in ks}
    missing = sorted(set(config.KEYS) - inputs - set(keys.NOT_INPUTS))
    assert not missing, (f"stack keys {missing} are no input of a package component: add each to the args of the "
                         "component that uses it (provider/keys.py KEYS, provider/components.py), or to "
                         f"provider/keys.py NOT_INPUTS with the reason, then run `{package.REGENERATE}`")
    assert not set(keys.NOT_INPUTS) - set(config.KEYS), "NOT_INPUTS names keys the stack does not have"
    assert not set(keys.NOT_INPUTS) & inputs


def test_pulumi_package_inputs_refuse_bad_values_in_the_stack_keys_words():
    prov = ElasticCtrProvider()
    with pytest.raises(Exception) as exc:
        prov.construct("serving", "elastic-ctr:index:Serving",
                       {"servingReplicas": 0.0, "denseBackend": "tf", "deployment": {"imagePullPolicy": "Sometimes"}})
    errors = {e["property_path"]: e["reason"] for e in exc.value.errors}
    assert errors == {"servingReplicas": "0.0 is invalid; allowed: an integer in [1, 100]",
                      "denseBackend": "'tf' is invalid; allowed: onnxruntime | paddle",
                      "deployment.imagePullPolicy": "'Sometimes' is invalid; allowed: IfNotPresent | Always | Never"}
    with pytest.raises(Exception) as exc:
        prov.construct("fileserver", "elastic-ctr:index:FileServer", {"fileServerCpu": "9000"})
    assert {e["property_path"] for e in exc.value.errors} == {"uploadToken", "fileServerCpu"}


def test_pulumi_package_plugin_files():
    plugin = yaml.safe_load((ROOT / "PulumiPlugin.yaml").read_text())
    assert plugin["runtime"]["name"] == "python"
    assert plugin["runtime"]["options"]["virtualenv"] == ".venv"
    assert "provider.host import main" in (ROOT / "__main__.py").read_text()
    reqs = (ROOT / "requirements.txt").read_text().split()
    assert "-e" in reqs and ".[infra]" in reqs and "requirements/constraints.txt" in reqs


def test_pulumi_package_plugin_serves_the_committed_schema(committed, tmp_path):
    """The plugin started as Pulumi starts it (``python <repository> <engine address>``,
    PulumiPlugin.yaml) prints its port and answers GetPluginInfo and GetSchema, what
    ``pulumi package add`` asks for."""
    from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc
    from google.protobuf import empty_pb2

    # as the Python language host runs it: `python <plugin directory> <engine>` from the program's directory
    proc = subprocess.Popen([sys.executable, str(ROOT), "127.0.0.1:1"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        port = proc.stdout.readline().strip()
        assert port.isdigit(), proc.stderr.read() if proc.poll() is not None else port
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = provider_pb2_grpc.ResourceProviderStub(channel)
            info = stub.GetPluginInfo(empty_pb2.Empty(), timeout=30)
            served = stub.GetSchema(provider_pb2.GetSchemaRequest(version=0), timeout=30)
        assert info.version == committed["version"]
        assert json.loads(served.schema) == committed
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_pulumi_package_reference_page_lists_every_component_and_input(committed):
    """The docs' generated reference page (docs/hooks/reference.py) has a section per
    component with a row per input and output, and one per input type."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs/hooks/reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.package_page()
    for token, res in committed["resources"].items():
        section = page.split(f"## `{token.rsplit(':', 1)[1]}`\n", 1)[1].split("\n## ", 1)[0]
        for name in (*res["inputProperties"], *res["properties"]):  # a stack key's name links to its row
            assert f"| `{name}` |" in section or f"| [`{name}`](configuration.md#{name}) |" in section, (token, name)
    for token, typ in committed["types"].items():
        assert f"### `{token.rsplit(':', 1)[1]}`" in page
    assert "| [`servingReplicas`](configuration.md#servingReplicas) | integer (plain) | Serving pods (1-100)" in page
    assert "| [`uploadToken`](configuration.md#uploadToken) | string (required, secret) |" in page


def test_pulumi_package_training_job_applies_the_trainers_rules():
    """The trainer's rules across its settings (``TrainConfig``) refuse a TrainingJob's
    inputs before anything is declared, naming the inputs as the stack keys they are."""
    with pytest.raises(Exception, match=r"TrainingJob: psMode 'geo' is invalid; allowed: async or async-merged "
                                        r"when trainingMode is continuous"):
        ElasticCtrProvider().construct("ctr-train", "elastic-ctr:index:TrainingJob", {
            "deployment": {"namespace": "ns", "instance": "elastic-ctr-dev"}, "image": "trainer:dev",
            "versionRoot": "s3://bucket/model", "psMode": "geo", "trainingMode": "continuous",
            "dataSource": "s3://bucket/hours", "dataStartHour": "20261120/00"})
