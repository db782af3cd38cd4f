"""The policy file reference (reference/policy.md), rendered from the settings objects.

Keys, types and defaults come from the dataclasses the file is validated into, descriptions
and bounds from ``guard.policy._describe``, the example errors from the validator itself, and
the built-in presets from ``guard.policy.PRESETS``: nothing here is written by hand twice.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, fields
from typing import Any

from guard.errors import ConfigError
from guard.policy import PRESETS, Limits, LoopSettings, PolicyConfig, limits_to_dict
from guard.policy._describe import Key, Section, describe_settings

__all__ = ["example_policy", "key_ids", "render_policy_reference"]

# Placeholder segments of a section's path, and the name each takes in the examples.
_NAMES = {"<tenant>": "acme", "<model>": "gpt-4.1", "<preset>": "faq"}
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")
_LOOP_DEFAULTS = {
    k: list(v) if isinstance(v, tuple) else v for k, v in asdict(LoopSettings()).items()
}
_YAML_WORDS = {"null", "true", "false", "yes", "no", "on", "off", "y", "n", "~"}


def _md(text: str) -> str:
    """Docstring-style ``code`` to Markdown `code`."""
    return text.replace("``", "`")


def _anchor(section: Section, key: Key | None = None) -> str:
    """``tenants.tenant.rolling`` for that section, ``tenants.rolling.metric`` for a key in
    it: a section's anchor keeps its placeholders' names, a key's drops them, so none of the
    two kinds can be the other."""
    parts = [p.removesuffix("[]") for p in section.path.split(".")]
    if key is None:
        return ".".join(p.strip("<>") for p in parts)
    return ".".join([*(p for p in parts if not p.startswith("<")), key.name])


def key_ids() -> list[str]:
    """The anchor of every key on the page (``runs.max_steps``, ``guard.metrics.listen``)."""
    return [_anchor(s, k) for s in describe_settings() for k in s.keys]


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        plain = _PLAIN.match(v) and v.lower() not in _YAML_WORDS
        return v if plain else json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_scalar(k)}: {_scalar(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no YAML for {v!r}")


def _fmt(x: float) -> str:
    return f"{x:g}" if x < 1e5 else f"{x:,.0f}".replace(",", " ")


def _allowed(key: Key) -> str:
    d = key.doc
    parts = []
    if d.choices:
        parts.append("one of " + ", ".join(f"`{c}`" for c in d.choices))
    if d.minimum is not None and d.maximum is not None:
        lo = "<" if d.exclusive else "≤"
        parts.append(f"{_fmt(d.minimum)} {lo} x ≤ {_fmt(d.maximum)}")
    elif d.minimum is not None:
        parts.append(f"{'>' if d.exclusive else '≥'} {_fmt(d.minimum)}")
    if d.rule:
        parts.append(d.rule)
    if key.nullable:
        parts.append("or `null`")
    return ", ".join(parts) or "any"


def _default(key: Key) -> str:
    return "**required**" if key.required else f"`{_scalar(key.default)}`"


def _table(section: Section) -> list[str]:
    out = [
        "| Key | Type | Default | Unit | Allowed | Description |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for k in section.keys:
        anchor = _anchor(section, k)
        out.append(
            f'| <span id="{anchor}"></span>`{k.name}` | {k.type} | {_default(k)} | '
            f"{k.doc.unit or '–'} | {_allowed(k)} | {_md(k.doc.text)} |"
        )
    return out


def _error(data: dict[str, Any]) -> str:
    try:
        PolicyConfig.from_dict(data)
    except ConfigError as e:
        return f"ConfigError: {e}"
    raise AssertionError(f"{data!r} was accepted")


def _presets_table() -> list[str]:
    rows = {name: _preset_changes(limits) for name, limits in PRESETS.items()}
    used = {k for r in rows.values() for k in r}
    cols = [f.name for f in fields(Limits) if f.name in used and f.name != "loop"]
    used = {k for r in rows.values() for k in r.get("loop", {})}
    loop_cols = [f.name for f in fields(LoopSettings) if f.name in used]
    head = ["preset", *cols, *(f"loop.{c}" for c in loop_cols)]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, r in rows.items():
        cells = [f"`{name}`"] + [_scalar(r[c]) if c in r else "–" for c in cols]
        cells += [_scalar(r["loop"][c]) if c in r.get("loop", {}) else "–" for c in loop_cols]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _sample(section: Section) -> dict[str, Any]:
    """One entry of a section that is empty by default: each key's example, or its default."""
    return {
        k.name: k.doc.example if k.doc.example is not None else k.default
        for k in section.keys
        if k.doc.example is not None or k.required
    }


def _leaf(v: Any) -> bool:
    """A value written on one line: a scalar, or a short mapping / list of scalars."""
    if isinstance(v, dict):
        return all(not isinstance(x, dict | list) for x in v.values()) and len(_scalar(v)) < 60
    if isinstance(v, list):
        return all(not isinstance(x, dict | list) for x in v)
    return True


def _yaml(data: dict[str, Any], indent: int, comments: dict[str, str]) -> list[str]:
    out = []
    pad = "  " * indent
    for name, v in data.items():
        note = comments.get(name, "")
        note = f"  # {note}" if note else ""
        if isinstance(v, dict) and v and not _leaf(v):
            out.append(f"{pad}{name}:{note}")
            out.extend(_yaml(v, indent + 1, {}))
        elif isinstance(v, list) and v and not _leaf(v):
            out.append(f"{pad}{name}:{note}")
            out.extend(f"{pad}  - {_scalar(item)}" for item in v)
        else:
            out.append(f"{pad}{_scalar(name)}: {_scalar(v)}{note}")
    return out


def _preset_changes(limits: Any) -> dict[str, Any]:
    """What a preset sets: its keys off the defaults, ``loop`` reduced to its own changes."""
    out = limits_to_dict(limits)
    if "loop" in out:
        out["loop"] = {k: v for k, v in out["loop"].items() if v != _LOOP_DEFAULTS[k]}
    return out


def _section_values(section: Section) -> tuple[dict[str, Any], dict[str, str]]:
    values = {k.name: k.default for k in section.keys if not k.required}
    return values, {k.name: k.doc.unit for k in section.keys if k.doc.unit}


def _commented(lines: list[str]) -> list[str]:
    return ["# " + line for line in lines]


def example_policy() -> str:
    """A complete policy file: every key at its default (``from_dict`` of it is the default
    ``PolicyConfig``), with one commented-out entry for each section empty by default."""
    by_path = {s.path: s for s in describe_settings()}
    runs, runs_notes = _section_values(by_path["runs"])
    loop, loop_notes = _section_values(by_path["runs.loop"])
    guard, guard_notes = _section_values(by_path["guard"])
    metrics, metrics_notes = _section_values(by_path["guard.metrics"])
    store, store_notes = _section_values(by_path["store"])
    tenant = {
        **_sample(by_path["tenants.<tenant>"]),
        "rolling": [_sample(by_path["tenants.<tenant>.rolling[]"])],
    }
    auth = {k.name: k.doc.example for k in by_path["auth"].keys}
    book = PolicyConfig().to_dict()["prices"]
    lines = ["runs:"]
    lines += _yaml(runs, 1, runs_notes)
    lines += ["  loop:", *_yaml(loop, 2, loop_notes)]
    lines += ["tenants: {}", *_commented(_yaml({_NAMES["<tenant>"]: tenant}, 1, {}))]
    lines += ["auth: null", *_commented(_yaml(auth, 1, {}))]
    lines += ["prices:", *_yaml(book, 1, {})]
    lines += ["guard:", *_yaml(guard, 1, guard_notes)]
    lines += ["  metrics:", *_yaml(metrics, 2, metrics_notes)]
    lines += ["store:", *_yaml(store, 1, store_notes)]
    presets = {name: _preset_changes(limits) for name, limits in PRESETS.items()}
    lines += ["presets:", *_yaml(presets, 1, {})]
    return "\n".join(lines) + "\n"


_INTRO = """\
`otel-guard serve --config guard.yaml` reads one YAML file, the policy file. The guard sends
its `runs` section and its price book to every agent, so the SDK applies the same limits
locally. Every key is optional unless its default says **required**.

The file is validated whole before the guard starts. **An unknown key is an error**, and so
is a wrong type or an out-of-range value; the error names the key:

```text
{errors}
```

`null`, or leaving the key out, turns off a limit whose *Allowed* column says "or `null`";
`0` never means unlimited. A number where an integer is expected must be whole (`3.0` is 3).
"""


def render_policy_reference() -> str:
    sections = describe_settings()
    errors = "\n".join(
        _error(d)
        for d in (
            {"tenants": {"acme": {"rolling": [{"metrc": "tokens"}]}}},
            {"runs": {"max_steps": 0}},
            {"guard": {"agent_grace": 30}},
        )
    )
    out = [
        "# Policy file reference",
        "",
        '!!! info "Generated"',
        "    This page is generated from the guard's validated settings objects each time the",
        "    site is built, so it lists exactly the keys, defaults and bounds of this version.",
        "",
        _INTRO.format(errors=errors),
        "## Sections",
        "",
        "| Section | What |",
        "| --- | --- |",
    ]
    for s in sections:
        out.append(f"| [`{s.path}`](#{_anchor(s)}) | {_md(s.text)} |")
        if s.path == "runs.loop":
            out.append("| [`presets.<preset>`](#presets) | Named sets of run limits. |")
    for s in sections:
        out += ["", f"## `{s.path}` {{#{_anchor(s)}}}", "", _md(s.text), ""]
        out += _table(s)
        if s.path == "runs.loop":
            out += _presets_section()
    out += [
        "",
        "## A complete policy file {#example}",
        "",
        "Every key at its default: loading this file gives the same settings as no file. The",
        "sections that are empty by default (`tenants`, `auth`) show one entry, commented out.",
        "",
        "```yaml",
        example_policy().rstrip("\n"),
        "```",
        "",
    ]
    return "\n".join(out)


def _presets_section() -> list[str]:
    return [
        "",
        "## `presets.<preset>` {#presets}",
        "",
        "A preset is a named set of run limits, chosen per run (`@guard.run(preset=...)`). It",
        "takes the keys of [`runs`](#runs) and [`runs.loop`](#runs.loop). A preset only",
        "tightens: the limits of a run are the `runs` section, tightened by its preset,",
        "tightened by the decorator's arguments, and the tightest value of each key wins.",
        "Setting a built-in preset in the file changes only the keys it sets; a new name",
        "starts from the defaults. The built-in presets (keys not shown are at their",
        "defaults):",
        "",
        *_presets_table(),
    ]
