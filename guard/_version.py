"""The package's version: one home, read by the build (pyproject.toml), ``guard.__version__``,
``otel-guard --version`` and the image's labels."""

__version__ = "0.1.0"
