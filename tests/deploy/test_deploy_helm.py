"""The Helm chart, rendered and linted by the real Helm engine (libhelm via helm-python-sdk) and
every manifest validated against the Kubernetes schemas (kubernetes-validate)."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request

import grpc
import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from _deploy_collector import check_wiring, duration_s
from _deploy_helm import CHART, FULLNAME, NAMESPACE, RELEASE, REPO
from _deploy_helm import container as _container
from _deploy_helm import env as _env
from _deploy_helm import notes as _notes
from _deploy_helm import prod_values as _prod_values
from _deploy_helm import render as _render
from _deploy_rotel import free_port
from _wait import wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc

from guard.policy import PolicyConfig
from guard.v1 import guard_pb2, guard_pb2_grpc

# The chart's kubeVersion floor (gRPC probes are GA since 1.27) and the newest schemas shipped.
KUBE_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


@pytest.fixture(scope="module")
def default():
    return _render()


@pytest.fixture(scope="module")
def prod():
    return _render(_prod_values())


def pod_grace(docs) -> int:
    return docs[("Deployment", FULLNAME)]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]


def _policy(docs) -> dict:
    return yaml.safe_load(docs[("ConfigMap", FULLNAME)]["data"]["guard.yaml"])


@pytest.mark.parametrize("values_name", ["default", "prod"])
def test_lint_clean(values_name):
    values = None if values_name == "default" else _prod_values()
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert serious == [], serious


@pytest.mark.parametrize("values_name", ["default", "prod"])
@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_manifests_validate(values_name, kube, default, prod):
    docs = default if values_name == "default" else prod
    for (kind, name), doc in docs.items():
        try:
            kubernetes_validate.validate(doc, kube, strict=True)
        except kubernetes_validate.ValidationError as ex:
            pytest.fail(f"{kind}/{name} invalid for Kubernetes {kube}: {ex.message} at {ex.path}")


def test_expected_resources(default, prod):
    base = {
        ("Deployment", FULLNAME),
        ("Service", FULLNAME),
        ("Service", f"{FULLNAME}-headless"),
        ("ConfigMap", FULLNAME),
        ("ConfigMap", f"{FULLNAME}-dashboards"),
        ("Secret", FULLNAME),
        ("ServiceAccount", FULLNAME),
        ("PodDisruptionBudget", FULLNAME),
        ("NetworkPolicy", FULLNAME),
    }
    assert set(default) == base
    # prod: an existing Secret (none rendered), autoscaling and the collector wiring.
    assert set(prod) == (base - {("Secret", FULLNAME)}) | {
        ("HorizontalPodAutoscaler", FULLNAME),
        ("ConfigMap", f"{FULLNAME}-collector"),
    }
    assert "replicas" not in prod[("Deployment", FULLNAME)]["spec"], "the HPA owns replicas"


@pytest.mark.parametrize("values_name", ["default", "prod"])
def test_deployment_essentials(values_name, default, prod):
    docs = default if values_name == "default" else prod
    values = {} if values_name == "default" else _prod_values()
    pod = docs[("Deployment", FULLNAME)]["spec"]["template"]["spec"]
    c = _container(docs)
    args = c["args"]
    assert args[0] == "serve"
    assert args[args.index("--listen") + 1] == "0.0.0.0:4317"
    config_file = args[args.index("--config") + 1]
    assert config_file == "/etc/otel-guard/guard.yaml"
    assert args[args.index("--data-dir") + 1] == "/var/lib/otel-guard"
    drain_s = float(args[args.index("--drain-s") + 1])
    assert drain_s + 10 <= pod_grace(docs)
    assert c["ports"][0] == {"name": "grpc", "containerPort": 4317, "protocol": "TCP"}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["grpc"] == {"port": 4317}, probe
    assert pod["terminationGracePeriodSeconds"] == values.get("terminationGracePeriodSeconds", 30)
    assert pod["terminationGracePeriodSeconds"] > 15, "longer than the guard's SIGTERM drain"
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # The policy file is mounted where --config points.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert config_file.startswith(mounts["config"] + "/")
    assert volumes["config"]["configMap"]["name"] == FULLNAME
    assert mounts["data"] == "/var/lib/otel-guard"
    # The pods roll when the policy changes.
    annotations = docs[("Deployment", FULLNAME)]["spec"]["template"]["metadata"]["annotations"]
    policy_text = docs[("ConfigMap", FULLNAME)]["data"]["guard.yaml"]
    # (the YAML block scalar adds one trailing newline to what the checksum was taken of)
    digest = hashlib.sha256(policy_text.removesuffix("\n").encode()).hexdigest()
    assert annotations["checksum/config"] == digest


def test_checksum_changes_with_the_policy():
    values = {"policy": {"runs": {"max_steps": 7}}}
    a = _render()[("Deployment", FULLNAME)]["spec"]["template"]["metadata"]["annotations"]
    b = _render(values)[("Deployment", FULLNAME)]["spec"]["template"]["metadata"]["annotations"]
    assert a["checksum/config"] != b["checksum/config"]


def test_services(default):
    pod_labels = default[("Deployment", FULLNAME)]["spec"]["template"]["metadata"]["labels"]
    svc = default[("Service", FULLNAME)]["spec"]
    headless = default[("Service", f"{FULLNAME}-headless")]["spec"]
    assert svc["type"] == "ClusterIP" and "clusterIP" not in svc
    # Both gRPC channels of an agent (OTLP and GuardControl) reach the replica tracking its runs.
    assert svc["sessionAffinity"] == "ClientIP"
    assert svc["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] > 0
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is False
    for spec in (svc, headless):
        assert spec["ports"] == [
            {
                "name": "grpc",
                "port": 4317,
                "targetPort": "grpc",
                "protocol": "TCP",
                "appProtocol": "grpc",
            },
            {"name": "otlp-http", "port": 4318, "targetPort": "otlp-http", "protocol": "TCP"},
        ]
        assert spec["selector"].items() <= pod_labels.items()
    pdb = default[("PodDisruptionBudget", FULLNAME)]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    netpol = default[("NetworkPolicy", FULLNAME)]["spec"]
    assert netpol["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert netpol["ingress"] == [
        {"ports": [{"port": "grpc", "protocol": "TCP"}, {"port": "otlp-http", "protocol": "TCP"}]},
        {"ports": [{"port": "metrics", "protocol": "TCP"}]},
    ]


def test_metrics_wiring(default):
    """The guard's metrics: flags, container port, scrape annotations, the replica id from the
    pod's name, the NetworkPolicy rule; OTLP export and the ServiceMonitor when asked."""
    c = _container(default)
    args = c["args"]
    assert args[args.index("--metrics-listen") + 1] == "0.0.0.0:9464"
    assert args[args.index("--metrics-top-tenants") + 1] == "20"
    assert "--metrics-otlp" not in args
    assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in c["ports"]
    assert _env(default)["OTEL_GUARD_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    annotations = default[("Deployment", FULLNAME)]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9464"
    values = {
        "metrics": {
            "otlp_endpoint": "http://otel-collector.observability:4317",
            "otlp_interval_s": 5,
            "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
            "ingressFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        }
    }
    docs = _render(values)
    args = _container(docs)["args"]
    assert args[args.index("--metrics-otlp") + 1] == "http://otel-collector.observability:4317"
    assert args[args.index("--metrics-interval-s") + 1] == "5"
    svc = docs[("Service", f"{FULLNAME}-metrics")]
    kubernetes_validate.validate(svc, KUBE_VERSIONS[-1], strict=True)
    monitor = docs[("ServiceMonitor", FULLNAME)]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]
    assert [p["name"] for p in svc["spec"]["ports"]] == ["metrics"]
    # the grpc Services do not select the metrics Service's label: no double scrape
    assert "app.kubernetes.io/component" not in docs[("Service", FULLNAME)]["metadata"]["labels"]
    netpol = docs[("NetworkPolicy", FULLNAME)]["spec"]
    assert netpol["ingress"][1]["from"] == values["metrics"]["ingressFrom"]
    off = _render({"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}})
    assert not any(a.startswith("--metrics") for a in _container(off)["args"])
    assert (
        "prometheus.io/scrape"
        not in (off[("Deployment", FULLNAME)]["spec"]["template"]["metadata"]["annotations"])
    )
    assert ("ServiceMonitor", FULLNAME) not in off
    assert len(off[("NetworkPolicy", FULLNAME)]["spec"]["ingress"]) == 1


@pytest.mark.parametrize("values_name", ["default", "prod"])
def test_policy_configmap(values_name, default, prod):
    docs = default if values_name == "default" else prod
    policy = _policy(docs)
    if values_name == "default":
        with helm.Chart.load(CHART) as chart:
            expected = chart.values["policy"]
    else:
        expected = _prod_values()["policy"]
    assert policy == expected, "guard.yaml is the policy values, key for key"
    assert set(policy) <= {"runs", "tenants", "auth", "prices", "guard", "store", "presets"}
    config = PolicyConfig.from_dict(policy)  # the guard's own validation
    assert config.runs.max_steps == expected["runs"]["max_steps"]
    if values_name == "prod":
        assert config.tenants["acme"].rolling[0].metric == "cost_usd"
        assert config.prices.version == "2026-11"
        assert config.store.retention_days == 180


def test_default_secret_references(default):
    env = _env(default)
    secret = default[("Secret", FULLNAME)]
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    admin_env = _policy(default)["auth"]["admin_token_env"]
    assert admin_env == "OTEL_GUARD_ADMIN_TOKEN"
    for name in (admin_env, "OTEL_GUARD_HMAC_KEY"):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == FULLNAME and ref["key"] == name
        assert len(data[name]) >= 32, f"{name}: generated value too short"
    assert "OTEL_GUARD_CLICKHOUSE_DSN" not in env, "no DSN: embedded chDB"
    assert "--clickhouse" not in _container(default)["args"]
    assert "WARNING: clickhouse.dsn is empty" in _notes()


def test_chart_secret_carries_given_tokens_and_dsn():
    dsn = "http://guard:s3cret@clickhouse:8123/?database=otel_guard"
    values = {
        "clickhouse": {"dsn": dsn},
        "policy": {
            "auth": {
                "admin_token_env": "ADMIN_TOK",
                "tenants": {"acme": {"token_env": "ACME_TOK"}, "globex": "GLOBEX_TOK"},
            }
        },
        "secret": {"adminToken": "a" * 40, "tenantTokens": {"acme": "b" * 40}, "hmacKey": "k" * 48},
    }
    docs = _render(values)
    env = _env(docs)
    data = {k: base64.b64decode(v).decode() for k, v in docs[("Secret", FULLNAME)]["data"].items()}
    assert data["ADMIN_TOK"] == "a" * 40
    assert data["ACME_TOK"] == "b" * 40
    assert len(data["GLOBEX_TOK"]) == 40, "missing tenant token is generated"
    assert data["OTEL_GUARD_HMAC_KEY"] == "k" * 48
    assert data["OTEL_GUARD_CLICKHOUSE_DSN"] == dsn
    for name in ("ADMIN_TOK", "ACME_TOK", "GLOBEX_TOK", "OTEL_GUARD_CLICKHOUSE_DSN"):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": FULLNAME, "key": name}
    # Every Secret reference of the pod resolves to a key the chart's Secret has.
    for e in env.values():
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == FULLNAME and ref["key"] in data, ref
    # the guard reads OTEL_GUARD_CLICKHOUSE_DSN itself: no argument shows it in `ps`
    assert not any("CLICKHOUSE" in a or "clickhouse" in a for a in _container(docs)["args"])
    assert dsn not in json.dumps(docs[("Deployment", FULLNAME)]), "the DSN stays in the Secret"


def test_prod_secret_references(prod):
    env = _env(prod)
    values = _prod_values()
    existing = values["secret"]["existingSecret"]
    for tenant, cfg in values["policy"]["auth"]["tenants"].items():
        ref = env[cfg["token_env"]]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": existing, "key": cfg["token_env"]}, tenant
    assert env["OTEL_GUARD_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == existing
    hmac = env["OTEL_GUARD_HMAC_KEY"]["valueFrom"]["secretKeyRef"]
    assert hmac["name"] == existing and hmac["optional"] is True
    dsn = env["OTEL_GUARD_CLICKHOUSE_DSN"]["valueFrom"]["secretKeyRef"]
    assert dsn == {"name": "otel-guard-clickhouse", "key": "dsn"}
    assert not any("clickhouse" in a.lower() for a in _container(prod)["args"])
    assert env["TZ"]["value"] == "UTC", "guard.extraEnv"
    redis = values["redis"]["urlSecret"]
    assert env["OTEL_GUARD_REDIS_URL"]["valueFrom"]["secretKeyRef"] == redis
    assert "WARNING" not in _notes(values)


def test_dashboards_configmap(default, prod):
    sources = {p.name: p.read_text() for p in sorted((REPO / "dashboards").glob("*.json"))}
    assert sources
    chart_copies = {p.name: p.read_text() for p in sorted((CHART / "dashboards").glob("*.json"))}
    assert chart_copies == sources, (
        "helm/otel-guard/dashboards/ is out of date: cp dashboards/*.json helm/otel-guard/dashboards/"
    )
    for docs, ns in ((default, NAMESPACE), (prod, "monitoring")):
        cm = docs[("ConfigMap", f"{FULLNAME}-dashboards")]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == ns
        assert cm["data"] == sources
        for text in cm["data"].values():
            json.loads(text)


def test_collector_configmap_wiring(prod):
    cm = prod[("ConfigMap", f"{FULLNAME}-collector")]
    text = cm["data"]["collector.yaml"]
    cfg = yaml.safe_load(text)
    assert check_wiring(cfg, text) == []
    lb = cfg["exporters"]["load_balancing/guard"]
    assert lb["routing_key"] == "traceID"
    assert lb["resolver"]["dns"]["hostname"] == f"{FULLNAME}-headless.{NAMESPACE}.svc.cluster.local"
    assert lb["resolver"]["dns"]["port"] == "4317"
    assert duration_s(lb["protocol"]["otlp"]["sending_queue"]["batch"]["flush_timeout"]) <= 0.05
    upstream = cfg["exporters"]["otlp_grpc/upstream"]
    assert upstream["tls"]["insecure"] is True
    # Same shape as the repository's collector/loadbalancing.yaml.
    repo_cfg = yaml.safe_load((REPO / "collector" / "loadbalancing.yaml").read_text())
    repo_lb = repo_cfg["exporters"]["load_balancing/guard"]
    assert set(lb) == set(repo_lb)
    assert (
        lb["protocol"]["otlp"]["retry_on_failure"]
        == repo_lb["protocol"]["otlp"]["retry_on_failure"]
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"replicaCount": 0},
        {"terminationGracePeriodSeconds": 5},
        {"guard": {"port": 70000}},
        {"clickhouse": {"dsn": "mysql://x"}},
        {"policy": {"runs": {"max_stepz": 3}}},
        {"policy": {"runs": {"max_steps": 0}}},
        {
            "policy": {
                "tenants": {
                    "acme": {"rolling": [{"metric": "dollars", "limit": 1, "window_s": 60}]}
                }
            }
        },
        {"policy": {"unknown_section": {}}},
        {"secret": {"adminToken": 42}},
        {"collector": {"batchTimeout": "fast"}},
        {"metrics": {"port": 0}},
        {"metrics": {"otlp_endpoint": "collector:4317"}},
        {"metrics": {"top_tenants": 5000}},
        {"metrics": {"serviceMonitor": {"interval": "often"}}},
        {"metrics": {"listen": "0.0.0.0:9464"}},
        {"redis": {"url": "http://redis.data:6379/0"}},
        {"redis": {"url": "redis.data:6379"}},
        {"redis": {"urlSecret": {"name": "redis", "key": ""}}},
        {"redis": {"host": "redis.data"}},
        {"no_such_value": True},
    ],
    ids=lambda v: json.dumps(v)[:60],
)
def test_schema_rejects_bad_values(bad):
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(bad)
        with pytest.raises(helm.HelmError):
            chart.render(bad, name=RELEASE, namespace=NAMESPACE, is_install=True)


def test_schema_accepts_the_shipped_values():
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(None)
        chart.validate_schema(_prod_values())
        chart.validate_schema(chart.values)


def test_schema_and_guard_agree_on_policy_keys():
    """Every key the schema allows under policy.runs is one PolicyConfig accepts, and back."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    runs_keys = set(schema["properties"]["policy"]["properties"]["runs"]["properties"])
    for key in runs_keys:
        sample = {
            "soft_thresholds": [0.5, 0.8],
            "loop": {"window": 10},
            "pause_freezes_deadline": True,
            "implicit_estimates": False,
        }.get(key, 5)
        PolicyConfig.from_dict({"runs": {key: sample}})
    with pytest.raises(Exception, match="max_stepz"):
        PolicyConfig.from_dict({"runs": {"max_stepz": 5}})
    sections = set(schema["properties"]["policy"]["properties"])
    assert sections == set(PolicyConfig._SECTIONS)


def test_grace_period_must_cover_the_drain():
    with pytest.raises(helm.HelmRenderError, match="drainSeconds"):
        _render({"terminationGracePeriodSeconds": 30, "guard": {"drainSeconds": 25}})
    docs = _render({"terminationGracePeriodSeconds": 60, "guard": {"drainSeconds": 25}})
    args = _container(docs)["args"]
    assert args[args.index("--drain-s") + 1] == "25" and pod_grace(docs) == 60


def test_no_auth_needs_an_explicit_opt_in():
    with pytest.raises(helm.HelmRenderError, match="insecureNoAuth"):
        _render({"policy": {"auth": None}})
    values = {"policy": {"auth": None}, "guard": {"insecureNoAuth": True}}
    docs = _render(values)
    assert "--insecure-bind-any" in _container(docs)["args"]
    assert not any(
        "secretKeyRef" in e.get("valueFrom", {}) and "TOKEN" in e["name"]
        for e in _container(docs)["env"]
    )
    assert "guard.yaml" in docs[("ConfigMap", FULLNAME)]["data"]
    assert PolicyConfig.from_dict(_policy(docs)).auth is None
    assert "Development only" in _notes(values)
    assert "--insecure-bind-any" not in _container(_render())["args"]


def test_values_do_not_mutate_between_renders():
    values = _prod_values()
    before = copy.deepcopy(values)
    _render(values)
    assert values == before


@pytest.mark.slow
def test_rendered_pod_runs_the_real_guard(tmp_path, default):
    """Run the container's command line (args, policy file, env from the Secret) as a real
    ``otel-guard serve`` process, probe it the way the kubelet does (grpc.health.v1 Check on
    the probe port, service ""), call GuardAdmin with the admin token from the Secret, then
    SIGTERM it: it must exit within the grace period."""
    pod = default[("Deployment", FULLNAME)]["spec"]["template"]["spec"]
    pod_annotations = default[("Deployment", FULLNAME)]["spec"]["template"]["metadata"][
        "annotations"
    ]
    c = _container(default)
    secret = {
        k: base64.b64decode(v).decode() for k, v in default[("Secret", FULLNAME)]["data"].items()
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_GUARD_")}
    for e in c["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            env[e["name"]] = secret[e["valueFrom"]["secretKeyRef"]["key"]]
    # The ConfigMap mounted at /etc/otel-guard, and the data volume, under tmp_path.
    config_dir = tmp_path / "etc"
    config_dir.mkdir()
    for name, text in default[("ConfigMap", FULLNAME)]["data"].items():
        (config_dir / name).write_text(text)
    port = free_port()
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]
    args[args.index("--listen") + 1] = f"127.0.0.1:{port}"
    args[args.index("--config") + 1] = str(config_dir / "guard.yaml")
    args[args.index("--data-dir") + 1] = str(tmp_path / "data")
    metrics_port = free_port()
    args[args.index("--metrics-listen") + 1] = f"127.0.0.1:{metrics_port}"
    env["OTEL_GUARD_ID"] = "otel-guard-7d9f-x2"  # the downward API's metadata.name
    assert c["command"] == ["otel-guard"]
    argv = [sys.executable, "-m", "guard.cli", *args]
    log = (tmp_path / "guard.log").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        probe = c["readinessProbe"]["grpc"]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            req = health_pb2.HealthCheckRequest(service=probe.get("service", ""))

            def serving() -> bool:  # the probe's answer once the guard listens
                assert proc.poll() is None, (tmp_path / "guard.log").read_text()
                try:
                    return (
                        stub.Check(req, timeout=1).status == health_pb2.HealthCheckResponse.SERVING
                    )
                except grpc.RpcError:
                    return False

            wait_until(serving, 60, "the readiness probe to answer SERVING", interval_s=0.1)
        # The policy's auth section took its admin token from the env the Secret fills.
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            admin = guard_pb2_grpc.GuardAdminStub(channel)
            token = env[_policy(default)["auth"]["admin_token_env"]]
            bearer = [("authorization", f"Bearer {token}")]
            admin.ListRuns(guard_pb2.ListRunsRequest(), metadata=bearer, timeout=5)
            with pytest.raises(grpc.RpcError) as denied:
                wrong = [("authorization", "Bearer wrong")]
                admin.ListRuns(guard_pb2.ListRunsRequest(), metadata=wrong, timeout=5)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # The scrape endpoint the pod annotations point at, labelled with the pod's name.
        scraped = f"http://127.0.0.1:{metrics_port}{pod_annotations['prometheus.io/path']}"
        with urllib.request.urlopen(scraped, timeout=5) as resp:
            text = resp.read().decode()
        assert 'otel_guard_spans_received_total{guard_id="otel-guard-7d9f-x2"}' in text
        assert (
            'otel_guard_store_records_total{guard_id="otel-guard-7d9f-x2",outcome="queued"}' in text
        )
        proc.send_signal(signal.SIGTERM)
        # within the pod's grace period: the bounded wait itself is the check
        code = proc.wait(timeout=pod["terminationGracePeriodSeconds"])
        assert code == 0, (tmp_path / "guard.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
