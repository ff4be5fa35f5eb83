"""The manifests under deploy/ checked offline: the core Kubernetes kinds against the Kubernetes
JSON schemas (`kubernetes-validate`, strict: unknown fields fail), the KServe resources against
the `kserve` package's models, the Prometheus Operator and Kustomize files parsed and their key
fields checked, and the rules the manifests' comments state (probes, grace period, security,
the containers' command lines parsed by `queryserve serve`'s own parser). What `/metrics` must
export for them is checked against a running server in tests/e2e/test_manifest_metrics.py."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import importlib.util
import io
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes.client.models as kubernetes_models
import kubernetes_validate
import pytest

from queryserve.cli import build_parser
from tests.manifests import (
    KSERVE,
    KUBERNETES,
    Manifest,
    adapter_rule_serving,
    container_command,
    documents,
    kustomization,
    one,
)

# The oldest release with the preStop `sleep` action on by default, and the newest the package
# ships: the manifests hold on both.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.latest_version())
CORE_KINDS = {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
IMAGE = "localhost/queryserve"
API_KEY_SECRET = ("queryserve-api-key", "api-key")


def is_core(doc: Manifest) -> bool:
    """Whether Kubernetes itself defines the kind (API group "", apps, policy, ... or
    *.k8s.io), rather than a custom resource definition."""
    group = doc["apiVersion"].rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def core_objects() -> list[tuple[str, Manifest]]:
    return [(f"{path.name}:{doc['kind']}", doc) for path, doc in documents(KUBERNETES)
            if is_core(doc)]


def serve_options(command: list[str]) -> Any:
    """`queryserve serve`'s options for a container's command line, parsed by the CLI's own
    parser: a misspelt flag or a bad value fails here as it would in the pod."""
    assert command[:2] == ["queryserve", "serve"], command
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return build_parser().parse_args(command[1:])
    except SystemExit:
        pytest.fail(f"`{' '.join(command)}` is refused: {errors.getvalue()}")


def whole_cores(quantity: str) -> int:
    """A CPU quantity as the Downward API gives it with divisor 1: whole cores, rounded up."""
    millicores = int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)
    return -(-millicores // 1000)


def resolved_env(container: Manifest) -> dict[str, str]:
    """The values the kubelet puts in the container's `$(NAME)` references: literal values, and
    resource fields (the only other kind the command lines use)."""
    env = {}
    for variable in container.get("env", []):
        source = variable.get("valueFrom", {})
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        elif "resourceFieldRef" in source:
            field = source["resourceFieldRef"]
            assert field["resource"] == "limits.cpu" and field["divisor"] == "1", field
            env[variable["name"]] = str(whole_cores(container["resources"]["limits"]["cpu"]))
    return env


def api_key_source(container: Manifest) -> tuple[str, str]:
    [variable] = [v for v in container["env"] if v["name"] == "QUERYSERVE_API_KEY"]
    ref = variable["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


REMOVED = object()


def edited(doc: Manifest, path: tuple[str | int, ...], value: Any) -> Manifest:
    """A copy of `doc` with the field at `path` set to `value`, or removed (`REMOVED`)."""
    copied = copy.deepcopy(doc)
    parent: Any = copied
    for key in path[:-1]:
        parent = parent[key]
    if value is REMOVED:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return copied


# -- Kustomize --------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", [KUBERNETES, KSERVE], ids=lambda f: f.name)
def test_each_kustomization_lists_every_manifest_and_sets_the_image(folder: Path) -> None:
    listed = kustomization(folder)
    assert listed["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert listed["kind"] == "Kustomization"
    files = {path.name for path, _ in documents(folder)}
    assert set(listed["resources"]) == files, "a manifest missing from the kustomization"
    [image] = listed["images"]
    assert (image["name"], image["newName"], image["newTag"]) == (IMAGE, IMAGE, "latest")
    for _, doc in documents(folder):
        for container in pod_containers(doc):
            assert container["image"].split(":")[0] == image["name"], doc["kind"]


def pod_containers(doc: Manifest) -> list[Manifest]:
    if doc["kind"] == "Deployment":
        containers: list[Manifest] = doc["spec"]["template"]["spec"]["containers"]
        return containers
    if doc["kind"] == "ServingRuntime":
        containers = doc["spec"]["containers"]
        return containers
    return []


# -- Kubernetes schemas -----------------------------------------------------------------------


def test_the_core_kinds_are_all_there() -> None:
    assert {doc["kind"] for _, doc in core_objects()} == CORE_KINDS


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("where", "doc"), core_objects(), ids=[w for w, _ in core_objects()])
def test_core_kinds_validate_against_the_kubernetes_schema(
        where: str, doc: Manifest, version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


POD = ("spec", "template", "spec")


@pytest.mark.parametrize(("path", "value", "message"), [
    ((*POD, "terminationGracePeriod"), 45, "terminationGracePeriod"),
    ((*POD, "containers", 0, "ports", 0, "containerPort"), "8000", "'8000' is not of type"),
    ((*POD, "containers", 0, "lifecycle", "preStop", "sleep", "seconds"), REMOVED,
     "'seconds' is a required property"),
], ids=["misspelt", "port-as-string", "sleep-without-seconds"])
def test_the_schema_check_fails_on_a_misspelt_mistyped_or_missing_field(
        path: tuple[str | int, ...], value: Any, message: str) -> None:
    broken = edited(one(KUBERNETES, "Deployment"), path, value)
    with pytest.raises(kubernetes_validate.ValidationError, match=message):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


def test_the_serving_runtime_container_validates_against_the_kubernetes_schema() -> None:
    # KServe copies the runtime's containers and volumes into its pods: checked as a Pod.
    runtime = one(KSERVE, "ServingRuntime")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "queryserve"},
           "spec": {"containers": runtime["spec"]["containers"],
                    "volumes": runtime["spec"]["volumes"]}}
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)


# -- KServe models ----------------------------------------------------------------------------

PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "object": (object,)}


class NotTheModel(Exception):
    """A manifest that the package's models do not describe."""


@functools.cache
def _kserve_models() -> ModuleType:
    """`kserve.models`, without running `kserve/__init__.py`: that imports KServe's own copy of
    the v2 gRPC protos, and protobuf's default pool holds one definition of each `inference.*`
    name, so whichever of KServe's and the server's came second would fail to load (both do
    in one pytest run)."""
    if "kserve" not in sys.modules:
        spec = importlib.util.find_spec("kserve")  # found, not run
        assert spec is not None and spec.submodule_search_locations is not None
        package = ModuleType("kserve")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["kserve"] = package
    return importlib.import_module("kserve.models")


def deserialize(data: Any, type_name: str, path: str) -> Any:
    """`data` as an instance of the OpenAPI-generated type `type_name`, strictly: a field the
    model does not have, a value of the wrong type or a missing required field (the models'
    own client-side validation) fails with the path to it. Types are looked up in
    `kserve.models`, then in `kubernetes.client.models` (KServe's models name Kubernetes' for
    containers, volumes and metadata; its own ApiClient looks only in `kserve.models`)."""
    kserve_models = _kserve_models()
    if data is None:
        return None
    # KServe's models write `list[T]` and `dict(str, T)`; Kubernetes' (client 34+),
    # `List[T]` and `Dict[str, T]`.
    if item_type := re.fullmatch(r"[Ll]ist\[(.+)\]", type_name):
        if not isinstance(data, list):
            raise NotTheModel(f"{path}: expected a list, got {data!r}")
        return [deserialize(item, item_type.group(1), f"{path}[{i}]") for i, item in
                enumerate(data)]
    if value_type := re.fullmatch(r"(?:dict\(|Dict\[)[^,]+, (.+)[)\]]", type_name):
        if not isinstance(data, dict):
            raise NotTheModel(f"{path}: expected a mapping, got {data!r}")
        return {key: deserialize(value, value_type.group(1), f"{path}.{key}")
                for key, value in data.items()}
    if type_name in PRIMITIVES:
        wanted = PRIMITIVES[type_name]
        if not isinstance(data, wanted) or (bool not in wanted and isinstance(data, bool)):
            raise NotTheModel(f"{path}: expected {type_name}, got {data!r}")
        return data
    model = getattr(kserve_models, type_name, None) or getattr(kubernetes_models, type_name)
    if not isinstance(data, dict):
        raise NotTheModel(f"{path}: expected a {type_name} mapping, got {data!r}")
    attributes = {key: attribute for attribute, key in model.attribute_map.items()}
    unknown = sorted(set(data) - set(attributes))
    if unknown:
        raise NotTheModel(f"{path}: {type_name} has no field {', '.join(unknown)}")
    fields = {attributes[key]: deserialize(value, model.openapi_types[attributes[key]],
                                           f"{path}.{key}") for key, value in data.items()}
    try:
        return model(**fields)
    except ValueError as error:
        raise NotTheModel(f"{path}: {error}") from None


KSERVE_MODELS = {
    "ServingRuntime": ("serving.kserve.io/v1alpha1", "V1alpha1ServingRuntime"),
    "InferenceService": ("serving.kserve.io/v1beta1", "V1beta1InferenceService"),
}


@pytest.mark.parametrize("kind", sorted(KSERVE_MODELS))
def test_kserve_resources_match_the_kserve_models(kind: str) -> None:
    api_version, model = KSERVE_MODELS[kind]
    doc = one(KSERVE, kind)
    assert doc["apiVersion"] == api_version
    resource = deserialize(doc, model, kind)
    assert resource.metadata.name == "queryserve"


CONTAINER = ("spec", "containers", 0)


@pytest.mark.parametrize(("path", "value", "message"), [
    (("spec", "protocolVersion"), ["v2"],
     r"^ServingRuntime\.spec: V1alpha1ServingRuntimeSpec has no field protocolVersion$"),
    ((*CONTAINER, "readinessProbe", "httpGet", "paht"), "/v2/health/ready",
     r"readinessProbe\.httpGet: V1HTTPGetAction has no field paht$"),
    ((*CONTAINER, "args"), "serve", r"containers\[0\]\.args: expected a list"),
    ((*CONTAINER, "ports", 0, "containerPort"), "8080",
     r"ports\[0\]\.containerPort: expected int"),
    ((*CONTAINER, "name"), REMOVED, r"(?s)containers\[0\]: .*\bname\b"),
], ids=["misspelt", "misspelt-deep", "not-a-list", "port-as-string", "no-container-name"])
def test_the_kserve_check_fails_on_a_misspelt_mistyped_or_missing_field(
        path: tuple[str | int, ...], value: Any, message: str) -> None:
    broken = edited(one(KSERVE, "ServingRuntime"), path, value)
    with pytest.raises(NotTheModel, match=message):
        deserialize(broken, "V1alpha1ServingRuntime", "ServingRuntime")


# -- The Deployment -----------------------------------------------------------------------------


def deployment_container() -> Manifest:
    containers: list[Manifest] = one(KUBERNETES, "Deployment")["spec"]["template"]["spec"][
        "containers"]
    assert len(containers) == 1
    return containers[0]


def test_the_deployment_runs_queryserve_serve_on_every_address_with_the_cpu_limit() -> None:
    container = deployment_container()
    options = serve_options(container_command(container, resolved_env(container)))
    assert options.http == ("0.0.0.0", 8000) and options.grpc == ("0.0.0.0", 8001)
    assert options.cores == 2 == whole_cores(container["resources"]["limits"]["cpu"])
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001}


def test_probes_use_the_health_routes_and_the_liveness_probe_outlasts_the_drain() -> None:
    container = deployment_container()
    options = serve_options(container_command(container, resolved_env(container)))
    paths = {probe: container[probe]["httpGet"]["path"]
             for probe in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert paths == {"startupProbe": "/v2/health/ready", "readinessProbe": "/v2/health/ready",
                     "livenessProbe": "/v2/health/live"}
    assert {container[probe]["httpGet"]["port"] for probe in paths} == {"http"}
    liveness = container["livenessProbe"]
    # The listener closes when the drain starts: liveness must not restart a draining pod.
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > options.drain_timeout
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120  # a slow host's load


def test_the_grace_period_covers_the_pre_stop_pause_and_the_drain() -> None:
    pod = one(KUBERNETES, "Deployment")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    options = serve_options(container_command(container, resolved_env(container)))
    pause_s = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pause_s >= 5, "endpoints need a few seconds to drop the pod"
    assert pod["terminationGracePeriodSeconds"] > pause_s + options.drain_timeout


def test_the_pod_runs_as_non_root_on_a_read_only_root_with_a_tmp_volume() -> None:
    pod = one(KUBERNETES, "Deployment")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    [mount] = container["volumeMounts"]
    [volume] = pod["volumes"]
    assert (mount["mountPath"], mount["name"]) == ("/tmp", volume["name"])
    assert "emptyDir" in volume


def test_resources_are_guaranteed_and_the_key_comes_from_a_secret() -> None:
    container = deployment_container()
    resources = container["resources"]
    assert resources["requests"] == resources["limits"]
    assert resources["limits"]["cpu"] == "2"
    assert api_key_source(container) == API_KEY_SECRET
    [variable] = [v for v in container["env"] if v["name"] == "QUERYSERVE_API_KEY"]
    assert variable["valueFrom"]["secretKeyRef"].get("optional", False) is False


def test_the_autoscaler_owns_the_replica_count() -> None:
    deployment = one(KUBERNETES, "Deployment")
    # A `replicas` here would reset the autoscaler's count on every `kubectl apply`.
    assert "replicas" not in deployment["spec"]
    strategy = deployment["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0 and strategy["maxSurge"] >= 1


# -- Service, PodDisruptionBudget, autoscaler, ServiceMonitor -----------------------------------


def pod_labels() -> dict[str, str]:
    labels: dict[str, str] = one(KUBERNETES, "Deployment")["spec"]["template"]["metadata"][
        "labels"]
    return labels


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def test_the_service_selects_the_pods_and_exposes_both_protocols() -> None:
    service = one(KUBERNETES, "Service")
    assert selects(service["spec"]["selector"], pod_labels())
    ports = {port["name"]: port for port in service["spec"]["ports"]}
    assert set(ports) == {"http", "grpc"}
    container_ports = {port["name"] for port in deployment_container()["ports"]}
    assert {port["targetPort"] for port in ports.values()} == container_ports
    assert (ports["http"]["port"], ports["grpc"]["port"]) == (8000, 8001)
    assert ports["grpc"]["appProtocol"] == "grpc"


def test_the_disruption_budget_and_the_autoscaler_keep_one_pod_serving() -> None:
    budget = one(KUBERNETES, "PodDisruptionBudget")
    assert selects(budget["spec"]["selector"]["matchLabels"], pod_labels())
    autoscaler = one(KUBERNETES, "HorizontalPodAutoscaler")
    assert budget["spec"]["maxUnavailable"] < autoscaler["spec"]["minReplicas"]
    target = autoscaler["spec"]["scaleTargetRef"]
    deployment = one(KUBERNETES, "Deployment")
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])


def test_the_autoscaler_metric_is_served_by_the_prometheus_adapter_rule() -> None:
    autoscaler = one(KUBERNETES, "HorizontalPodAutoscaler")
    [metric] = autoscaler["spec"]["metrics"]
    assert metric["type"] == "Pods"
    rule = adapter_rule_serving(metric["pods"]["metric"]["name"])
    # The adapter maps the series' namespace and pod labels (the ServiceMonitor's) to pods.
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"},
                                              "pod": {"resource": "pod"}}
    assert re.fullmatch(r"\s*queryserve_queue_depth\{.*\}\s*", rule["seriesQuery"])
    assert re.search(rule["name"]["matches"], "queryserve_queue_depth")
    for placeholder in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
        assert placeholder in rule["metricsQuery"]


def test_the_service_monitor_scrapes_metrics_on_the_http_port_with_the_key() -> None:
    monitor = one(KUBERNETES, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = one(KUBERNETES, "Service")
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    authorization = endpoint["authorization"]
    assert authorization["type"] == "Bearer"
    credentials = authorization["credentials"]
    assert (credentials["name"], credentials["key"]) == api_key_source(deployment_container())


# -- KServe ------------------------------------------------------------------------------------


def test_the_serving_runtime_speaks_v2_over_http_and_grpc_from_the_mounted_repository() -> None:
    runtime = one(KSERVE, "ServingRuntime")
    assert runtime["spec"]["protocolVersions"] == ["v2", "grpc-v2"]
    [container] = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container"
    options = serve_options(container_command(container, resolved_env(container)))
    assert str(options.repository) == "/mnt/models"
    ports = [(port["name"], port["containerPort"]) for port in container["ports"]]
    # KServe's Standard mode: the first port becomes the Service's port 80.
    assert ports == [("http", options.http[1]), ("grpc", options.grpc[1])]
    assert options.http[0] == options.grpc[0] == "0.0.0.0"
    assert options.cores == whole_cores(container["resources"]["limits"]["cpu"])
    probes = {probe: container[probe]["httpGet"]
              for probe in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes == {"startupProbe": {"path": "/v2/health/ready", "port": options.http[1]},
                      "readinessProbe": {"path": "/v2/health/ready", "port": options.http[1]},
                      "livenessProbe": {"path": "/v2/health/live", "port": options.http[1]}}
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > options.drain_timeout
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_inference_service_uses_the_runtime_and_its_format() -> None:
    runtime = one(KSERVE, "ServingRuntime")
    service = one(KSERVE, "InferenceService")
    predictor = service["spec"]["predictor"]
    model = predictor["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    formats = {(f["name"], f["version"]) for f in runtime["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"]["version"]) in formats
    [container] = runtime["spec"]["containers"]
    options = serve_options(container_command(container, resolved_env(container)))
    pause_s = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert predictor["terminationGracePeriodSeconds"] > pause_s + options.drain_timeout
    assert predictor["minReplicas"] >= 2
