"""Invariants that tie the Dockerfile and the rendered Kubernetes manifests to
each other and to the real temb-server.

Renders every kustomization under deploy/ with `kubectl kustomize` (TEMB_KUBECTL)
and reads the Dockerfile from TEMB_SOURCE_DIR.  Checks that need the server
(its flags, the health services it registers) run it from TEMB_BIN_DIR and
are skipped, with the reason in the report, when it has not been built.
"""

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

import tembproc

SOURCE = Path(os.environ.get("TEMB_SOURCE_DIR", Path(__file__).resolve().parents[2]))
DEPLOY = SOURCE / "deploy"
KUSTOMIZATIONS = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))
# deploy/front only generates the front's ConfigMap; the others serve.
LAYOUTS = [d for d in KUSTOMIZATIONS if d.name != "front"]
WORKLOADS = [d for d in LAYOUTS if d.name != "kserve"]
FRONT_CONF = DEPLOY / "front" / "nginx.conf"
OVERLAYS = {d.name: d for d in KUSTOMIZATIONS if d.parent.name == "overlays"}

# The server's defaults as documented (README, docs/deploy.md); when the
# binary is built, test_defaults_match_server checks them against it.
DEFAULT_GRPC_PORT = 50051
DEFAULT_METRICS_PORT = 9090
DEFAULT_DRAIN_GRACE_S = 15.0
# Health services temb-server registers on its gRPC port.
HEALTH_SERVICES = {"", "temb.v1.EmbeddingService", "inference.GRPCInferenceService",
                   "temb.models"}
# SERVING once every model of --model_repository has loaded or failed
# (App::kModelsHealthName): what readiness waits for.
MODELS_HEALTH = "temb.models"
# The pod annotation that carries W, the conditioning weights' bytes the
# deployment is sized for (docs/deploy.md, "Models").
WEIGHT_ANNOTATION = "temb/model-weight-bytes"
# The longest model load the startup probe allows: a 13 GiB Qwen-Image
# checkpoint at 20 MiB/s (docs/deploy.md, "Probes") is 666 s.
LONGEST_LOAD_S = (13 << 30) / (20 << 20)


def render(directory):
    kubectl = os.environ.get("TEMB_KUBECTL") or "kubectl"
    result = subprocess.run([kubectl, "kustomize", str(directory)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kustomize {directory}:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def label(directory):
    return str(directory.relative_to(DEPLOY))


SERVER_NAMES = {"temb-server", "kserve-container"}


def pods(docs):
    """(pod template metadata, pod spec) of each Deployment and ServingRuntime."""
    for doc in docs:
        if doc["kind"] == "Deployment":
            template = doc["spec"]["template"]
            yield template["metadata"], template["spec"]
        elif doc["kind"] == "ServingRuntime":
            yield {"annotations": doc["spec"].get("annotations", {})}, doc["spec"]


def server_containers(docs):
    """(pod template metadata, pod spec, container) for each server container."""
    for metadata, pod in pods(docs):
        for container in pod["containers"]:
            if container["name"] in SERVER_NAMES:
                yield metadata, pod, container


def front_of(pod):
    """The pod's nginx front container."""
    (front,) = [c for c in pod["containers"] if c["name"] == "front"]
    return front


def is_loopback(address):
    return address.rsplit(":", 1)[0] in ("127.0.0.1", "[::1]", "localhost")


def front_config(docs, pod):
    """The nginx.conf the pod's front reads: the ConfigMap its volume names,
    mounted where its command reads it."""
    front = front_of(pod)
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in front["volumeMounts"]
                if "configMap" in volumes[m["name"]]]
    name = volumes[mount["name"]]["configMap"]["name"]
    (config_map,) = [d for d in by_kind(docs, "ConfigMap")
                     if d["metadata"]["name"] == name]
    assert mount["mountPath"] == "/etc/temb", mount
    return config_map["data"]["nginx.conf"]


def front_routes(text):
    """{listen port: (kind, upstream port)} of an nginx config: kind is
    "grpc" for grpc_pass, "http" for proxy_pass."""
    upstreams = {name: int(port) for name, port in re.findall(
        r"upstream (\w+) \{\s*server 127\.0\.0\.1:(\d+);", text)}
    routes = {}
    for block in re.split(r"\n    server \{", text)[1:]:
        (listen,) = re.findall(r"listen (\d+)", block)
        (kind, upstream), = re.findall(r"(grpc|proxy)_pass \w+://(\w+);",
                                        block)
        routes[int(listen)] = ("grpc" if kind == "grpc" else "http",
                               upstreams[upstream])
    return routes


def flag_values(args):
    """{"address": "0.0.0.0:50051", ...} from ["--address=0.0.0.0:50051", ...]."""
    values = {}
    for arg in args:
        assert arg.startswith("--") and "=" in arg, f"not --flag=value: {arg!r}"
        name, value = arg[2:].split("=", 1)
        values[name] = value
    return values


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def seconds(duration):
    """absl duration ("15s", "1m30s", "500ms") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|ns|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def dockerfile(target=None):
    """Instructions of the stage named `target` (by default the last one),
    continuation lines joined."""
    text = (SOURCE / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    stages, current = {}, []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        if keyword.upper() == "FROM":
            current = []
            stages[rest.split()[-1]] = current
        current.append((keyword.upper(), rest.strip()))
    return stages[target] if target else list(stages.values())[-1]


def instruction(stage, keyword):
    found = [rest for kw, rest in stage if kw == keyword]
    assert len(found) == 1, f"expected one {keyword} in the runtime stage, got {found}"
    return found[0]


def exec_form(rest):
    value = yaml.safe_load(rest)  # JSON arrays are YAML
    assert isinstance(value, list), f"not exec form: {rest}"
    return value


@pytest.fixture(scope="module")
def rendered():
    return {d: render(d) for d in KUSTOMIZATIONS}


@pytest.fixture(scope="module")
def helpfull():
    server = Path(os.environ.get("TEMB_BIN_DIR", "")) / "temb-server"
    if not server.is_file():
        pytest.skip(f"{server} is not built: the flag checks need it")
    result = subprocess.run([str(server), "--helpfull"], capture_output=True,
                            text=True, timeout=30)
    text = result.stdout + result.stderr
    assert "--address" in text, f"unexpected --helpfull output:\n{text}"
    return text


@pytest.fixture(scope="module")
def server_flags(helpfull):
    """{flag name: default value as printed} from `temb-server --helpfull`."""
    flags = {}
    for match in re.finditer(r"^\s+--(\w+)\b(.*?)(?=^\s+--\w|\Z)", helpfull, re.M | re.S):
        default = re.search(r'default: "?([^";]*)"?;', match.group(2))
        flags[match.group(1)] = default.group(1) if default else None
    return flags


def test_every_layout_is_rendered():
    names = {label(d) for d in KUSTOMIZATIONS}
    assert {"base", "overlays/cpu", "overlays/gpu", "kserve"} <= names


@pytest.mark.parametrize("directory", WORKLOADS, ids=label)
def test_selectors_match_pod_labels(rendered, directory):
    docs = rendered[directory]
    (deployment,) = by_kind(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector and selector.items() <= pod_labels.items()
    selectors = [s["spec"]["selector"] for s in by_kind(docs, "Service")]
    selectors += [p["spec"]["selector"]["matchLabels"]
                  for p in by_kind(docs, "PodDisruptionBudget")]
    selectors += [c["labelSelector"]["matchLabels"]
                  for c in deployment["spec"]["template"]["spec"].get(
                      "topologySpreadConstraints", [])]
    for other in selectors:
        assert other == selector, f"{other} differs from the Deployment's {selector}"
    for doc in docs:
        assert selector.items() <= doc["metadata"].get("labels", {}).items(), \
            f"{doc['kind']}/{doc['metadata']['name']} lacks the app labels"
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])


@pytest.mark.parametrize("directory", WORKLOADS, ids=label)
def test_services(rendered, directory):
    services = {s["metadata"]["name"]: s["spec"] for s in by_kind(rendered[directory], "Service")}
    headless = [s for s in services.values() if s.get("clusterIP") == "None"]
    cluster_ip = [s for s in services.values() if s.get("clusterIP") != "None"]
    assert len(headless) == 1 and len(cluster_ip) == 1, services
    assert "temb-headless" in services and services["temb-headless"]["clusterIP"] == "None"
    (_, pod, _), = server_containers(rendered[directory])
    # Every target is a port of the front: none reaches temb-server itself.
    named = {p["name"]: p["containerPort"] for p in front_of(pod)["ports"]}
    for spec in services.values():
        for port in spec["ports"]:
            assert port["targetPort"] in named, f"targetPort {port['targetPort']} names no front port"
            assert port["port"] == named[port["targetPort"]]
            if port["targetPort"] == "grpc":
                assert port.get("appProtocol") == "kubernetes.io/h2c"
    # Triton's REST port, on both Services (docs/deploy.md, "The front").
    for spec in services.values():
        assert {p["targetPort"] for p in spec["ports"]} >= {"grpc", "http"}


@pytest.mark.parametrize("directory", LAYOUTS, ids=label)
def test_front_stands_before_every_port(rendered, directory):
    """temb-server listens on loopback only and offers no port; each port
    of the pod is the front's, and each front port proxies to one of
    temb-server's loopback listeners with the protocol it speaks."""
    docs = rendered[directory]
    front_exposed = {int(p.split("/")[0]) for p in
                     instruction(dockerfile("front"), "EXPOSE").split()}
    for metadata, pod, container in server_containers(docs):
        assert "ports" not in container, \
            f"{label(directory)}: temb-server offers {container['ports']}"
        flags = flag_values(container.get("args", []))
        listeners = {"grpc": flags.get("address", f"0.0.0.0:{DEFAULT_GRPC_PORT}"),
                     "metrics": flags.get("metrics_address",
                                          f"0.0.0.0:{DEFAULT_METRICS_PORT}")}
        if flags.get("http_address"):
            listeners["http"] = flags["http_address"]
        for name, address in listeners.items():
            assert is_loopback(address), f"{label(directory)}: --{name} {address} is not loopback"
        front = front_of(pod)
        ports = {p["containerPort"] for p in front["ports"]}
        assert ports <= front_exposed, f"front ports {ports} not all EXPOSEd ({front_exposed})"
        routes = front_routes(front_config(docs, pod))
        assert ports <= routes.keys(), f"front ports {ports} nginx does not listen on"
        # gRPC and, where REST is on, REST go through the front.
        assert routes[DEFAULT_GRPC_PORT] == ("grpc", port_of(listeners["grpc"]))
        assert DEFAULT_GRPC_PORT in ports
        rest = [p for p, (kind, up) in routes.items()
                if "http" in listeners and up == port_of(listeners["http"])]
        if directory in WORKLOADS:
            assert rest and set(rest) <= ports, "REST is on but no front port serves it"
            assert routes[rest[0]][0] == "http"
        metrics = [p for p, (_, up) in routes.items()
                   if up == port_of(listeners["metrics"])]
        assert len(metrics) == 1
        annotations = metadata.get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true"
        assert annotations.get("prometheus.io/port") == str(metrics[0])
        assert annotations.get("prometheus.io/path") == "/metrics"


@pytest.mark.parametrize("directory", LAYOUTS, ids=label)
def test_front_config_is_the_file(rendered, directory):
    """The ConfigMap the front mounts is deploy/front/nginx.conf itself,
    the file tests/reliability/test_front.py floods through."""
    docs = rendered[directory]
    for _, pod, _ in server_containers(docs):
        assert front_config(docs, pod) == FRONT_CONF.read_text()
        front = front_of(pod)
        stage = dockerfile("front")
        command = exec_form(instruction(stage, "ENTRYPOINT")) + front.get("args", [])
        assert command[0] == "nginx" and "-c" in command
        assert command[command.index("-c") + 1] == "/etc/temb/nginx.conf"
        assert ["deploy/front/nginx.conf", "/etc/temb/nginx.conf"] == \
            instruction(stage, "COPY").split()
        user = instruction(stage, "USER").split(":")[0]
        assert user.isdigit() and int(user) != 0
        security = front["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        mounts = {m["mountPath"] for m in front["volumeMounts"]}
        assert "/tmp" in mounts, "nginx's temporary paths need a writable /tmp"
        assert {"cpu", "memory"} <= front["resources"]["limits"].keys()


@pytest.mark.parametrize("directory", LAYOUTS, ids=label)
def test_models_volume(rendered, directory):
    """The model repository is a volume mounted read-only where
    --model_repository points.  The shipped layouts mount an empty one, so a
    fresh cluster serves the presets, and size the pod for no weights; a
    layout that mounts checkpoints states their bytes."""
    for metadata, pod, container in server_containers(rendered[directory]):
        flags = flag_values(container["args"])
        path = flags.get("model_repository")
        assert path, "--model_repository is not set"
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == path]
        assert mount.get("readOnly") is True
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "conditioning_cache_bytes" in flags, \
            "the cache is a term of the memory bound: set it explicitly"
        weights = int(metadata["annotations"][WEIGHT_ANNOTATION])
        if "emptyDir" in volumes[mount["name"]]:
            assert weights == 0, "an empty volume holds no weights"
        else:
            assert weights > 0, (
                f"{label(directory)} mounts checkpoints: set {WEIGHT_ANNOTATION} "
                "to their bytes (docs/deploy.md, \"Models\")")
        if label(directory) in ("base", "overlays/cpu", "overlays/gpu", "kserve"):
            assert "emptyDir" in volumes[mount["name"]], volumes[mount["name"]]


def test_image_defaults_match_manifests():
    stage = dockerfile()
    exposed = {int(p.split("/")[0]) for p in instruction(stage, "EXPOSE").split()}
    assert exposed == {DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT}
    assert exec_form(instruction(stage, "ENTRYPOINT")) == ["temb-server"]
    flags = flag_values(exec_form(instruction(stage, "CMD")))
    assert port_of(flags["address"]) == DEFAULT_GRPC_PORT
    assert port_of(flags["metrics_address"]) == DEFAULT_METRICS_PORT
    assert flags.get("backend", "auto") == "auto"
    healthcheck = instruction(stage, "HEALTHCHECK")
    command = exec_form(healthcheck.split(" CMD ", 1)[1])
    assert command[:2] == ["temb", "health"]
    assert port_of(flag_values(command[2:])["target"]) == DEFAULT_GRPC_PORT
    user = instruction(stage, "USER").split(":")[0]
    assert user.isdigit() and int(user) != 0, "the image must run as a numeric non-root user"
    # The arena cap of the memory bound holds for `docker run` too, and is
    # the manifests' (test_memory_limit_holds_the_documented_bound).
    assert instruction(stage, "ENV") == "MALLOC_ARENA_MAX=4"
    for docs in (render(DEPLOY / "base"), render(DEPLOY / "kserve")):
        for _, _, container in server_containers(docs):
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env.get("MALLOC_ARENA_MAX") == "4"


@pytest.mark.parametrize("directory", LAYOUTS, ids=label)
def test_probes_are_grpc_health_checks(rendered, directory):
    """kubelet probes the pod's gRPC port, the front's, which proxies
    grpc.health.v1 to temb-server: every probe checks both."""
    docs = rendered[directory]
    for _, pod, container in server_containers(docs):
        grpc_port = port_of(flag_values(container.get("args", [])).get(
            "address", f":{DEFAULT_GRPC_PORT}"))
        routes = front_routes(front_config(docs, pod))
        (front_grpc,) = [p for p, route in routes.items() if route == ("grpc", grpc_port)]
        assert front_grpc in {p["containerPort"] for p in front_of(pod)["ports"]}
        probes = {k: v for k, v in container.items() if k.endswith("Probe")}
        assert "readinessProbe" in probes
        # Ready once every model of the repository has loaded or failed.
        assert probes["readinessProbe"]["grpc"]["service"] == MODELS_HEALTH
        if directory in WORKLOADS:
            assert probes.keys() == {"startupProbe", "readinessProbe", "livenessProbe"}
            startup = probes["startupProbe"]
            assert startup["grpc"]["service"] == MODELS_HEALTH
            allowed = startup["periodSeconds"] * startup["failureThreshold"]
            assert allowed >= LONGEST_LOAD_S, \
                f"the startup probe allows {allowed}s, a 13 GiB load takes {LONGEST_LOAD_S:.0f}s"
            # Liveness asks for the server as a whole, SERVING while models load.
            assert probes["livenessProbe"]["grpc"].get("service", "") == ""
        for kind, probe in probes.items():
            assert set(probe) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, kind
            assert probe["grpc"]["port"] == front_grpc, kind
            assert probe["grpc"].get("service", "") in HEALTH_SERVICES, kind


@pytest.mark.parametrize("directory", WORKLOADS, ids=label)
def test_pod_security(rendered, directory):
    (_, pod, server), = server_containers(rendered[directory])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    for container in (server, front_of(pod)):
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        resources = container["resources"]
        assert {"cpu", "memory"} <= resources["requests"].keys()
        assert {"cpu", "memory"} <= resources["limits"].keys()


@pytest.mark.parametrize("directory", WORKLOADS, ids=label)
def test_termination_outlasts_drain(rendered, directory):
    (_, pod, container), = server_containers(rendered[directory])
    drain = seconds(flag_values(container["args"]).get("drain_grace", "15s"))
    pre_stop = container["lifecycle"]["preStop"]
    if "exec" in pre_stop:
        command = pre_stop["exec"]["command"]
        assert command[0] == "sleep", command
        sleep = float(command[1])
    else:
        sleep = float(pre_stop["sleep"]["seconds"])
    assert sleep > 0, "endpoints need time to drop the pod before the drain starts"
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > sleep + drain, f"grace {grace}s <= preStop {sleep}s + drain {drain}s"
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > sleep + drain, \
        "liveness would restart a pod in the middle of its drain"
    # The front proxies until temb-server has drained, and stops in the grace.
    (_, front_sleep) = front_of(pod)["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep + drain < float(front_sleep) < grace


# The Dockerfile target each deployable kustomization runs; base names the
# image "temb" and leaves the registry and tag to them.
IMAGE_TARGETS = {"overlays/cpu": "cpu", "overlays/gpu": "gpu", "kserve": "gpu"}


def test_image_name_is_consistent(rendered):
    """One repository everywhere, tagged <project version>-<target> (the tags
    scripts/container-smoke.sh and docs/deploy.md build)."""
    version = re.search(r"project\(temb VERSION ([0-9.]+)",
                        (SOURCE / "CMakeLists.txt").read_text()).group(1)
    repositories = set()
    for directory, docs in rendered.items():
        for _, pod, container in server_containers(docs):
            front = front_of(pod)["image"]
            image = container["image"]
            if label(directory) == "base":
                assert (image, front) == ("temb", "temb-front"), (image, front)
                continue
            repository, _, tag = image.rpartition(":")
            assert repository.rsplit("/", 1)[-1] == "temb", image
            assert tag == f"{version}-{IMAGE_TARGETS[label(directory)]}", image
            # The front: the Dockerfile's front target, same repository.
            assert front == f"{repository}:{version}-front", front
            repositories.add(repository)
    assert len(repositories) == 1, repositories


def test_gpu_overlay_requests_a_gpu_and_cpu_overlay_does_not(rendered):
    def gpus(directory):
        (_, _, container), = server_containers(rendered[directory])
        return container["resources"].get("limits", {}).get("nvidia.com/gpu")

    def backend(directory):
        (_, _, container), = server_containers(rendered[directory])
        return flag_values(container["args"]).get("backend", "auto")

    assert gpus(OVERLAYS["gpu"]) == 1
    assert backend(OVERLAYS["gpu"]) in ("cuda", "auto")
    assert gpus(OVERLAYS["cpu"]) is None
    assert backend(OVERLAYS["cpu"]) == "cpu"


def test_kserve_runtime_serves_v2_grpc(rendered):
    docs = rendered[DEPLOY / "kserve"]
    (runtime,) = by_kind(docs, "ServingRuntime")
    (service,) = by_kind(docs, "InferenceService")
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats
    assert model["protocolVersion"] == "v2"
    assert {"v2", "grpc-v2"} <= set(runtime["spec"]["protocolVersions"])
    # Knative allows one container with ports: the front's gRPC port.
    (port,) = [p for c in runtime["spec"]["containers"] for p in c.get("ports", [])]
    assert port["name"] == "h2c"  # KServe's marker for an HTTP/2 (gRPC) port
    assert port["containerPort"] == DEFAULT_GRPC_PORT
    assert port in front_of(runtime["spec"])["ports"]


def test_defaults_match_server(server_flags):
    assert port_of(server_flags["address"]) == DEFAULT_GRPC_PORT
    assert port_of(server_flags["metrics_address"]) == DEFAULT_METRICS_PORT
    assert seconds(server_flags["drain_grace"]) == DEFAULT_DRAIN_GRACE_S
    assert server_flags["backend"] == "auto"


@pytest.mark.parametrize("directory", LAYOUTS, ids=label)
def test_args_are_server_flags(rendered, server_flags, directory):
    for _, _, container in server_containers(rendered[directory]):
        for name in flag_values(container.get("args", [])):
            assert name in server_flags, f"temb-server has no flag --{name}"


def test_image_cmd_flags_are_server_flags(server_flags):
    for name in flag_values(exec_form(instruction(dockerfile(), "CMD"))):
        assert name in server_flags, f"temb-server has no flag --{name}"


# docs/operations.md, "Memory bound": the idle server, and what the CUDA
# backend adds (its page-locked buffers, and room for the CUDA runtime's own
# host memory, which the GPU overlay's limit leaves).
IDLE_SERVER_BYTES = 20 << 20
MALLOC_ARENA_BYTES = 64 << 20
PINNED_POOL_BYTES = 512 << 20
CUDA_RUNTIME_ALLOWANCE_BYTES = 512 << 20


def quantity_bytes(text):
    """Kubernetes memory quantity ("1Gi", "256Mi", "1G", "1000") in bytes."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "": 1}
    number, unit = re.fullmatch(r"(\d+)([KMGT]i?|k|)", str(text)).groups()
    return int(number) * units[unit]


@pytest.mark.parametrize("directory", LAYOUTS, ids=label)
def test_memory_limit_holds_the_documented_bound(rendered, server_flags,
                                                 directory):
    """No client can push a pod past its memory limit: the bound of
    docs/operations.md with the pod's flags (the server's defaults where
    unset) and its malloc arena cap stays under the limit, so an attack
    meets the server's own refusals, not the OOM killer.  With a model
    repository the bound holds W, the weights the pod is sized for (its
    annotation), and K, the row cache."""
    for metadata, _, container in server_containers(rendered[directory]):
        flags = flag_values(container.get("args", []))
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        quota = int(flags.get("grpc_memory_quota",
                              server_flags["grpc_memory_quota"]))
        queued = int(flags.get("max_queued_bytes",
                               server_flags["max_queued_bytes"]))
        largest = int(flags.get("max_output_bytes",
                                server_flags["max_output_bytes"]))
        assert quota > 0 and queued > 0, "an unlimited quota has no bound"
        assert "MALLOC_ARENA_MAX" in env, \
            "without MALLOC_ARENA_MAX the kept heap grows with the cores"
        bound = (IDLE_SERVER_BYTES + 3 * quota + 2 * queued
                 + int(env["MALLOC_ARENA_MAX"]) * MALLOC_ARENA_BYTES)
        if flags.get("http_address"):
            # The REST port's connections: C x (H + 32 KiB), H + 128 KiB
            # with HTTPS, and 64 threads' unsettled parse estimates.
            connections = int(flags.get(
                "http_max_connections", server_flags["http_max_connections"]))
            header = int(flags.get("http_max_header_bytes",
                                   server_flags["http_max_header_bytes"]))
            per_connection = header + (
                (128 << 10) if flags.get("tls_cert") else (32 << 10))
            bound += connections * per_connection + 64 * (64 << 10)
        if flags.get("model_repository"):
            weights = int(metadata["annotations"][WEIGHT_ANNOTATION])
            cache = int(flags["conditioning_cache_bytes"])
            bound += weights + cache
            # The weights stay resident: the scheduler must reserve them.
            requests = container["resources"]["requests"]
            assert quantity_bytes(requests["memory"]) >= weights + IDLE_SERVER_BYTES
        limits = container["resources"]["limits"]
        if "nvidia.com/gpu" in limits:
            bound += PINNED_POOL_BYTES + CUDA_RUNTIME_ALLOWANCE_BYTES
        assert bound <= quantity_bytes(limits["memory"]), (
            f"{label(directory)}: bound {bound >> 20} MiB over the "
            f"{limits['memory']} limit")
        # The largest answer is counted twice while gRPC serialises it: it
        # must fit the queue, or it would be refused as overload.
        assert 2 * largest <= queued


def test_server_runs_with_deployment_args_and_serves_probe_services(
        rendered, helpfull, tmp_path):
    services = {c[k]["grpc"].get("service", "")
                for docs in rendered.values() for _, _, c in server_containers(docs)
                for k in c if k.endswith("Probe")}
    # The base Deployment's own arguments, less the listen addresses (the
    # test listens on loopback ports of its own) and with an empty model
    # repository of its own, as the default emptyDir volume is.
    (_, _, container), = server_containers(rendered[DEPLOY / "base"])
    models = tmp_path / "models"
    models.mkdir()
    args = [a for a in container["args"]
            if not a.startswith(("--address=", "--metrics_address=",
                                 "--http_address=", "--model_repository="))]
    args.append(f"--model_repository={models}")
    server = tembproc.Server(tmp_path, "probe", extra_args=args)
    try:
        server.start()
        for service in sorted(services):
            assert tembproc.health(server.address, service), \
                f"health service {service!r} is not SERVING on temb-server"
        assert not tembproc.health(server.address, "no.such.Service"), \
            "the health check cannot tell a registered service from a missing one"
        server.signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    finally:
        server.stop()
