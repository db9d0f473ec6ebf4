"""deploy/kubernetes: schema-valid manifests (offline, kubernetes-validate's bundled schemas), and
the facts that make the example work, checked across files: a native sidecar that gates the app's
start, probes on the admin port, the ConfigMap's config equal to the example file and valid with
exactly the environment the pod gives it, Secrets referenced by name, a PodMonitor that selects the
pod and names its port."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from deploy_support import ROOT

KDIR = ROOT / "deploy/kubernetes"
# Native sidecars (init containers with restartPolicy: Always) are on by default from 1.29 and GA
# in 1.33; validate against the oldest version that runs the example and the newest schemas shipped.
VERSIONS = ["1.29.0", "1.33.0", kubernetes_validate.latest_version()]
# Custom resources: kubernetes-validate ships core schemas only. test_podmonitor checks the
# PodMonitor's fields by hand instead.
CRD_KINDS = {("monitoring.coreos.com/v1", "PodMonitor")}


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_manifests() -> list[tuple[Path, dict]]:
    return [(p, d) for p in sorted(KDIR.glob("*.yaml")) if p.name != "kustomization.yaml" for d in docs(p)]


def kustomization() -> dict:
    return yaml.safe_load((KDIR / "kustomization.yaml").read_text())


def applied() -> list[dict]:
    """The resources `kubectl apply -k deploy/kubernetes` creates (before kustomize's edits)."""
    return [d for r in kustomization()["resources"] for d in docs(KDIR / r)]


def find(kind: str, name: str) -> dict:
    for _, d in all_manifests():
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise AssertionError(f"no {kind}/{name} in {KDIR}")


def deployment() -> dict:
    return find("Deployment", "example-app")


def sidecar() -> dict:
    (c,) = [c for c in deployment()["spec"]["template"]["spec"]["initContainers"] if c["name"] == "rebound"]
    return c


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_are_schema_valid(version):
    checked = 0
    for path, d in all_manifests():
        if (d["apiVersion"], d["kind"]) in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(d, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{path.name}: {d['kind']}/{d['metadata']['name']} (k8s {version}): {e}") from None
        checked += 1
    assert checked >= 6


def test_native_sidecars_need_1_29():
    """The schemas are strict enough to mean something: before 1.28 an init container has no
    restartPolicy, so the same Deployment is rejected."""
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicy"):
        kubernetes_validate.validate(deployment(), "1.27.0", strict=True)


def test_kustomization_composes_every_manifest():
    k = kustomization()
    assert k["kind"] == "Kustomization"
    resources = k["resources"]
    for r in resources:
        assert (KDIR / r).is_file(), r
    on_disk = {p.name for p in KDIR.glob("*.yaml")} - {"kustomization.yaml", "secrets.example.yaml"}
    assert set(resources) == on_disk, "every manifest but the example Secrets is applied"
    assert "secrets.example.yaml" not in resources, "real Secrets are created out of band, never from git"
    images = {i["name"]: i for i in k.get("images", [])}
    assert sidecar()["image"] in images, "the kustomization sets the sidecar's image"
    kinds = {d["kind"] for d in applied()}
    assert {"ConfigMap", "Deployment", "Service", "PodMonitor"} <= kinds


def test_sidecar_is_native_and_gates_the_app():
    spec = deployment()["spec"]["template"]["spec"]
    c = sidecar()
    assert c["restartPolicy"] == "Always", "a native sidecar: starts before the app, stops after it"
    assert [x["name"] for x in spec["containers"]] == ["app"]
    assert c["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}, (
        "the app starts once rebound's startupProbe passes: rebound must be listening by then"
    )
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"admin": 9901}
    env = {e["name"]: e for e in c["env"]}
    assert env["REBOUND_ADMIN_LISTEN"]["value"] == "0.0.0.0:9901", "kubelet and Prometheus come from outside the pod"
    assert env["REBOUND_LISTEN"]["value"].startswith("127.0.0.1:"), "the proxy is for this pod's app only"
    proxy_port = env["REBOUND_LISTEN"]["value"].rsplit(":", 1)[1]
    app_env = {e["name"]: e.get("value", "") for e in spec["containers"][0]["env"]}
    assert app_env["OPENAI_BASE_URL"] == f"http://127.0.0.1:{proxy_port}/openai/v1"
    assert app_env["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{proxy_port}/anthropic"
    # Grace: rebound drains within shutdown_grace (30s) after the app is gone.
    assert spec["terminationGracePeriodSeconds"] >= 45


def test_sidecar_resources_and_security():
    c = sidecar()
    res = c["resources"]

    def mib(q: str) -> float:
        n, unit = re.fullmatch(r"(\d+)(Mi|Gi)", q).groups()
        return int(n) * (1024 if unit == "Gi" else 1)

    assert 16 <= mib(res["requests"]["memory"]) <= 64
    assert mib(res["limits"]["memory"]) >= 4 * mib(res["requests"]["memory"])
    assert res["requests"]["cpu"] == "50m"
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["runAsUser"] == 65532 and sc["readOnlyRootFilesystem"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]


def test_config_is_mounted_as_a_directory_for_reloads():
    c = sidecar()
    env = {e["name"]: e.get("value") for e in c["env"]}
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "rebound-config"]
    assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates"
    assert env["REBOUND_CONFIG"] == mount["mountPath"].rstrip("/") + "/rebound.toml"
    volumes = {v["name"]: v for v in deployment()["spec"]["template"]["spec"]["volumes"]}
    assert volumes["rebound-config"]["configMap"]["name"] == "rebound-config"
    assert "rebound.toml" in find("ConfigMap", "rebound-config")["data"]


def test_configmap_is_the_fleet_example():
    shipped = find("ConfigMap", "rebound-config")["data"]["rebound.toml"]
    example = (ROOT / "config/examples/fleet-redis.toml").read_text()
    assert shipped == example, (
        "deploy/kubernetes/configmap.yaml's rebound.toml differs from config/examples/fleet-redis.toml: "
        "copy the example into the ConfigMap"
    )


def pod_env_for_check(container: dict) -> dict[str, str]:
    """The container's environment as `rebound check` should see it: literal values as they are
    ($(VAR) references expanded), Secret references as placeholders."""
    env: dict[str, str] = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), ""), e["value"])
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = f"placeholder-{ref['name']}-{ref['key']}"
    return env


def test_configmap_config_is_valid_with_the_pods_environment(rebound_bin, tmp_path):
    """Every ${VAR} without a default in the config is set by the sidecar's env, and `rebound check`
    accepts the config with exactly that environment (nothing inherited)."""
    c = sidecar()
    text = find("ConfigMap", "rebound-config")["data"]["rebound.toml"]
    env = pod_env_for_check(c)
    required = set(re.findall(r"\$\{(\w+)\}", text))
    missing = required - set(env)
    assert not missing, f"the config needs {sorted(missing)}, which the sidecar's env does not set"
    cfg = tmp_path / "rebound.toml"
    cfg.write_text(text)
    r = subprocess.run([rebound_bin, "check", "--config", cfg], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", **env})
    assert r.returncode == 0, r.stderr
    assert "admin 0.0.0.0:9901" in r.stdout, r.stdout
    assert "listen 127.0.0.1:8080" in r.stdout, r.stdout
    assert "redis standalone redis://" in r.stdout and "rebound-redis:6379" in r.stdout, r.stdout
    assert "placeholder" not in r.stdout, "secrets never appear in `rebound check`"


def test_secret_references_resolve():
    """Every Secret the pods read is in secrets.example.yaml with that key, and no applied
    manifest is a Secret."""
    examples = {d["metadata"]["name"]: d for d in docs(KDIR / "secrets.example.yaml")}
    assert all(d["kind"] == "Secret" for d in examples.values())
    assert not [d for d in applied() if d["kind"] == "Secret"]
    refs = []
    for d in applied():
        if d["kind"] != "Deployment":
            continue
        spec = d["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.append((c["name"], ref["name"], ref["key"]))
    assert len(refs) >= 4
    for container, name, key in refs:
        assert name in examples, f"{container} reads Secret {name}, absent from secrets.example.yaml"
        assert key in examples[name]["stringData"], f"{container} reads {name}/{key}"
    provider_keys = {e["name"] for e in sidecar()["env"] if "valueFrom" in e}
    assert {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"} <= provider_keys, "provider keys come from a Secret"
    app = deployment()["spec"]["template"]["spec"]["containers"][0]
    assert not [e for e in app["env"] if "valueFrom" in e], "the app never holds the provider keys"


def test_redis_service_matches_the_config():
    svc = find("Service", "rebound-redis")
    redis = find("Deployment", "rebound-redis")
    labels = redis["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    port = svc["spec"]["ports"][0]["port"]
    url = pod_env_for_check(sidecar())["REDIS_URL"]
    assert url.endswith(f"@{svc['metadata']['name']}:{port}/0"), url
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--requirepass" in args and "noeviction" in args


def test_podmonitor_selects_the_pod_and_its_admin_port():
    pm = find("PodMonitor", "rebound")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    spec = pm["spec"]
    assert set(spec) <= {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel", "podTargetLabels"}
    labels = deployment()["spec"]["template"]["metadata"]["labels"]
    sel = spec["selector"]["matchLabels"]
    assert all(labels.get(k) == v for k, v in sel.items()), f"{sel} does not select the pod ({labels})"
    (ep,) = spec["podMetricsEndpoints"]
    assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "scheme", "relabelings", "metricRelabelings"}
    assert ep["port"] == "admin" and ep["path"] == "/metrics"
    ann = deployment()["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/port"] == "9901" and ann["prometheus.io/path"] == "/metrics"
