"""Rendering the Helm chart with the real Helm engine (libhelm via helm-python-sdk), shared by
the chart's tests."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import yaml

__all__ = [
    "CHART",
    "FULLNAME",
    "NAMESPACE",
    "PROD_VALUES",
    "RELEASE",
    "REPO",
    "container",
    "env",
    "notes",
    "prod_values",
    "render",
]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "otel-guard"
PROD_VALUES = CHART / "ci" / "prod-values.yaml"
RELEASE, NAMESPACE = "otel-guard", "observability"
FULLNAME = "otel-guard"  # the release name already contains the chart name


def prod_values() -> dict:
    return yaml.safe_load(PROD_VALUES.read_text())


def _render_files(values, chart, release, namespace) -> dict[str, str]:
    with helm.Chart.load(chart) as loaded:
        return loaded.render(values, name=release, namespace=namespace, is_install=True)


def render(
    values: dict | None = None,
    *,
    chart: Path = CHART,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> dict[tuple[str, str], dict]:
    """Render offline; returns manifests keyed by (kind, name)."""
    docs: dict[tuple[str, str], dict] = {}
    for path, text in _render_files(values, chart, release, namespace).items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in docs, f"duplicate {key}"
                docs[key] = doc
    return docs


def notes(values: dict | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE) -> str:
    """The rendered NOTES.txt."""
    out = _render_files(values, CHART, release, namespace)
    return next(text for path, text in out.items() if path.endswith("NOTES.txt"))


def container(docs, fullname: str = FULLNAME) -> dict:
    (c,) = docs[("Deployment", fullname)]["spec"]["template"]["spec"]["containers"]
    return c


def env(docs, fullname: str = FULLNAME) -> dict[str, dict]:
    return {e["name"]: e for e in container(docs, fullname)["env"]}
