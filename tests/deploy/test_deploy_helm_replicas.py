"""Several guard replicas in the Helm chart: Redis (redis.url / redis.urlSecret) and an external
ClickHouse are required for replicaCount > 1 and the HPA, by the schema and by a template
``fail``; the URL reaches the guard as OTEL_GUARD_REDIS_URL; agents and the collector reach the
replicas through the headless Service. Rendered by the real Helm engine, every manifest
validated against the Kubernetes schemas."""

from __future__ import annotations

import base64
import json
import re
import shutil

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from _deploy_helm import CHART, FULLNAME, NAMESPACE, RELEASE, REPO, container, env, notes, render

REDIS_URL = "redis://redis-master.data.svc.cluster.local:6379/0"
CLICKHOUSE = {"dsn": "http://clickhouse.data:8123/?database=otel_guard"}
SECRET_REF = {"name": "guard-redis", "key": "url"}
NEEDS_REDIS = (
    "{what} needs redis.url or redis.urlSecret: replicas share tenant budgets, the run "
    "directory and directives through Redis"
)


def _replicas(count: int = 3, **values) -> dict:
    return {"replicaCount": count, "clickhouse": CLICKHOUSE, **values}


@pytest.fixture(scope="module")
def schemaless(tmp_path_factory):
    """The chart without values.schema.json: what tools that skip the schema render (helm
    --skip-schema-validation), so the templates' own checks are what stands."""
    dst = tmp_path_factory.mktemp("chart") / "otel-guard"
    shutil.copytree(CHART, dst, ignore=shutil.ignore_patterns("values.schema.json"))
    return dst


def _refused(values: dict, schemaless, match: str) -> str:
    """Both layers refuse ``values``: the schema (naming the value's path) and the templates
    (with the one-line message ``match``). Returns the schema's message."""
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError) as by_schema:
            chart.validate_schema(values)
        with pytest.raises(helm.HelmError):
            chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    with pytest.raises(helm.HelmRenderError, match=re.escape(match)):
        render(values, chart=schemaless)
    return str(by_schema.value)


def _validate_all(docs) -> None:
    for (kind, name), doc in docs.items():
        try:
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
        except kubernetes_validate.ValidationError as ex:
            pytest.fail(f"{kind}/{name} invalid: {ex.message} at {ex.path}")


def _headless(docs) -> dict:
    """The chart's headless Service, found by what it is (clusterIP None), not by its name."""
    (svc,) = [
        d
        for (kind, _), d in docs.items()
        if kind == "Service" and d["spec"].get("clusterIP") == "None"
    ]
    return svc


def _dns_name(svc: dict) -> str:
    return f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"


def test_replicas_need_redis(schemaless):
    message = _refused(_replicas(3), schemaless, NEEDS_REDIS.format(what="replicaCount=3"))
    assert "/redis/url" in message and "/redis/urlSecret/name" in message
    # One replica needs no Redis: the default install and the quickstart stay as they are.
    assert "OTEL_GUARD_REDIS_URL" not in env(render({"replicaCount": 1}))


def test_autoscaling_needs_redis(schemaless):
    values = {"autoscaling": {"enabled": True, "minReplicas": 1}, "clickhouse": CLICKHOUSE}
    message = _refused(values, schemaless, NEEDS_REDIS.format(what="autoscaling.enabled=true"))
    assert "/redis" in message
    docs = render({**values, "redis": {"url": REDIS_URL}})
    assert ("HorizontalPodAutoscaler", FULLNAME) in docs
    assert env(docs)["OTEL_GUARD_REDIS_URL"] == {"name": "OTEL_GUARD_REDIS_URL", "value": REDIS_URL}


@pytest.mark.parametrize(
    "clickhouse",
    [{}, {"dsn": "chdb:///var/lib/otel-guard/chdb"}],
    ids=["embedded", "chdb-dsn"],
)
def test_replicas_need_an_external_clickhouse(clickhouse, schemaless):
    values = {"replicaCount": 2, "redis": {"url": REDIS_URL}, "clickhouse": clickhouse}
    message = _refused(values, schemaless, "replicaCount=2 needs an external ClickHouse")
    assert "/clickhouse/dsn" in message and "/clickhouse/dsnSecret/name" in message
    # A DSN from a Secret is external by contract (its value is not the chart's to read).
    secret = {"dsnSecret": {"name": "ch", "key": "dsn"}}
    docs = render({**values, "clickhouse": secret})
    assert (
        env(docs)["OTEL_GUARD_CLICKHOUSE_DSN"]["valueFrom"]["secretKeyRef"] == secret["dsnSecret"]
    )


@pytest.mark.parametrize("url", [REDIS_URL, "rediss://valkey.data:6380/2", "redis://guard@r:6379"])
def test_redis_url_renders_as_an_env_var(url):
    docs = render(_replicas(3, redis={"url": url}))
    _validate_all(docs)
    assert docs[("Deployment", FULLNAME)]["spec"]["replicas"] == 3
    variables = env(docs)
    assert variables["OTEL_GUARD_REDIS_URL"] == {"name": "OTEL_GUARD_REDIS_URL", "value": url}
    # Each replica's id is its pod's name.
    assert variables["OTEL_GUARD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    args = container(docs)["args"]
    assert "--redis" not in args and not any(url in a for a in args), "never on the command line"
    assert _headless(docs)["spec"]["selector"].items() <= (
        docs[("Deployment", FULLNAME)]["spec"]["template"]["metadata"]["labels"].items()
    )


def test_redis_url_secret_keeps_the_url_out_of_the_manifests():
    values = _replicas(3, redis={"urlSecret": SECRET_REF})
    docs = render(values)
    _validate_all(docs)
    assert env(docs)["OTEL_GUARD_REDIS_URL"] == {
        "name": "OTEL_GUARD_REDIS_URL",
        "valueFrom": {"secretKeyRef": SECRET_REF},
    }
    rendered = json.dumps(list(docs.values()))
    secret_data = docs[("Secret", FULLNAME)]["data"]
    decoded = " ".join(base64.b64decode(v).decode() for v in secret_data.values())
    for text in (rendered, decoded, notes(values)):
        assert "redis://" not in text and "rediss://" not in text


def test_redis_url_and_url_secret_are_exclusive(schemaless):
    values = _replicas(3, redis={"url": REDIS_URL, "urlSecret": SECRET_REF})
    message = _refused(values, schemaless, "redis.url and redis.urlSecret are both set")
    assert "/redis/urlSecret/name" in message


@pytest.mark.parametrize(
    "url",
    ["redis://:hunter2@r:6379/0", "rediss://guard:hunter2@r:6380", "redis://r:6379/0?password=x"],
)
def test_a_password_in_redis_url_is_refused(url):
    with pytest.raises(helm.HelmRenderError, match=r"set redis\.urlSecret") as refused:
        render(_replicas(3, redis={"url": url}))
    assert "hunter2" not in str(refused.value), "the refusal does not echo the password"


def test_agents_and_the_collector_reach_the_headless_service():
    """The collector's load_balancing resolver, in the chart's ConfigMap and in the repository's
    collector/loadbalancing.yaml, and the endpoint NOTES.txt gives agents, all name the headless
    Service the chart renders. The repository file's default is checked for the release and
    namespace the README installs with."""
    readme = (REPO / "README.md").read_text()
    release, namespace = re.search(
        r"helm install (\S+) \./helm/otel-guard -n (\S+)", readme
    ).groups()
    values = _replicas(3, redis={"url": REDIS_URL}, collector={"configMap": {"enabled": True}})
    docs = render(values, release=release, namespace=namespace)
    svc = _headless(docs)
    (port,) = [p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"]
    host = _dns_name(svc)

    (cm,) = [
        d
        for (kind, name), d in docs.items()
        if kind == "ConfigMap" and "collector.yaml" in d.get("data", {})
    ]
    chart_lb = yaml.safe_load(cm["data"]["collector.yaml"])["exporters"]["load_balancing/guard"]
    assert chart_lb["routing_key"] == "traceID"
    chart_dns = chart_lb["resolver"]["dns"]
    assert (chart_dns["hostname"], chart_dns["port"]) == (host, str(port))

    repo = yaml.safe_load((REPO / "collector" / "loadbalancing.yaml").read_text())
    repo_dns = repo["exporters"]["load_balancing/guard"]["resolver"]["dns"]
    default = re.fullmatch(r"\$\{env:[A-Z_]+:-(.+)\}", repo_dns["hostname"]).group(1)
    assert (default, repo_dns["port"]) == (host, str(port))

    text = notes(values, release=release, namespace=namespace)
    (endpoint,) = re.findall(r"OTEL_GUARD_ENDPOINT=(\S+)", text)
    assert endpoint == f"{host}:{port}", "agents fail over between the headless Service's addresses"
    # One replica: agents keep the ClusterIP Service.
    (single,) = re.findall(
        r"OTEL_GUARD_ENDPOINT=(\S+)", notes(release=release, namespace=namespace)
    )
    assert not single.startswith(svc["metadata"]["name"] + ".")


def test_egress_policy_lets_the_replicas_reach_redis():
    values = _replicas(3, redis={"url": REDIS_URL}, networkPolicy={"egress": {"enabled": True}})
    egress = render(values)[("NetworkPolicy", FULLNAME)]["spec"]["egress"]
    ports = [p["port"] for rule in egress for p in rule["ports"]]
    assert int(re.search(r":(\d+)/", REDIS_URL).group(1)) in ports
