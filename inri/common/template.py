"""A commented TOML config with every key at its default (`inri relay init`, `inri-bootstrap init`).

Keys and defaults come from the config dataclasses themselves, so a new key appears in the next
`init` without anyone touching this module; the comment above each key is the "meaning" column of
its row in the docs' reference tables (the `| key | default | meaning |` table that follows a line
starting with `` `[section]` ``), read from the installed docs (inri.common.docs). Keys the caller
sets are written as settings; every other key is written commented out (`# key = default`), so the
file documents the defaults without pinning them: an upgrade that changes a default applies to it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from inri.common.docs import doc_path

WIDTH = 100
_SECTION = re.compile(r"^`\[([a-z_]+)\]`")
_ROW = re.compile(r"^\| `([a-z_0-9]+)` \| [^|]* \| (.*) \|\s*$")


def doc_rows(names: Iterable[str]) -> dict[str, dict[str, str]]:
    """section -> key -> meaning, from the reference tables of the docs `names` (missing docs: none)."""
    rows: dict[str, dict[str, str]] = {}
    for name in names:
        path = doc_path(name)
        if path is None:
            continue
        section: str | None = None
        for line in path.read_text(encoding="utf-8").splitlines():
            head = _SECTION.match(line)
            if head is not None:
                section = head.group(1)
                continue
            row = _ROW.match(line)
            if row is not None and section is not None:
                rows.setdefault(section, {}).setdefault(row.group(1), row.group(2).strip())
            elif section is not None and line.strip() and not line.startswith("|"):
                section = None  # prose after the table ends it
    return rows


def toml_value(value: Any) -> str:
    """A TOML literal for a config value (str, bool, int, float, enum, tuple of those)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return toml_value(value.value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string for the text configs hold
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _comment(text: str) -> list[str]:
    plain = text.replace("`", "")
    return [f"# {line}" for line in textwrap.wrap(plain, WIDTH - 2, break_on_hyphens=False)]


def render(header: str, sections: Mapping[str, Any], settings: Mapping[str, Mapping[str, Any]],
           meanings: Mapping[str, Mapping[str, str]], *, table: bool = True) -> str:
    """The config text: `header` (comment lines), then each section's keys, defaults commented out.

    sections: name -> a dataclass instance holding the defaults; settings: name -> key -> value
    written as a setting. table=False writes the keys of the only section without a [name] line."""
    out = [*(f"# {line}" if line else "#" for line in header.splitlines()), ""]
    for name, defaults in sections.items():
        if table:
            out.append(f"[{name}]")
        chosen = settings.get(name, {})
        unknown = set(chosen) - {f.name for f in dataclasses.fields(defaults)}
        if unknown:
            raise KeyError(f"[{name}] has no key {sorted(unknown)}")
        for f in dataclasses.fields(defaults):
            meaning = meanings.get(name, {}).get(f.name)
            out += _comment(meaning) if meaning else []
            if f.name in chosen:
                out.append(f"{f.name} = {toml_value(chosen[f.name])}")
            else:
                out.append(f"# {f.name} = {toml_value(getattr(defaults, f.name))}")
        out.append("")
    return "\n".join(out)
