"""The version has one home (guard/_version.py): the package, the CLI and the build agree."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import yaml

import guard
from guard._version import __version__


def test_package_cli_and_metadata_agree() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "guard.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert out == f"otel-guard {__version__}"
    assert guard.__version__ == __version__
    assert metadata.version("otel-guard") == __version__


def test_chart_app_version_is_the_package_version() -> None:
    """The chart's default image tag is its appVersion: it must name the image this tree builds."""
    chart = Path(__file__).resolve().parents[1] / "helm" / "otel-guard" / "Chart.yaml"
    assert yaml.safe_load(chart.read_text())["appVersion"] == __version__
