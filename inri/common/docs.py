"""Where the operator docs are: installed with the package, or in the source checkout.

The wheel installs docs/operations.md and its neighbours under `<prefix>/share/doc/inri/`
(pyproject.toml, `data-files`), so `--help` can name a file that exists on the operator's machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inri import __version__

DOC_DIR = Path("share") / "doc" / "inri"  # under sys.prefix (the venv) once installed


def doc_path(name: str) -> Path | None:
    """The installed (or checked-out) doc `name` (e.g. "operations.md"), or None when neither exists."""
    for base in (Path(sys.prefix) / DOC_DIR, Path(__file__).resolve().parents[2] / "docs"):
        path = base / name
        if path.is_file():
            return path
    return None


def docs_hint(name: str = "operations.md") -> str:
    """One line for a --help epilog: where to read `name`."""
    path = doc_path(name)
    return f"Docs: {path}" if path is not None else f"Docs: docs/{name} in the INRI source distribution"


class DocsHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, but the docs line of an epilog is printed whole: wrapped at the terminal's
    width it broke a path at its hyphens (`/tmp/pytest-of-` + newline + `root/...`), which no operator
    can copy."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("Docs: "):
            return indent + text
        return super()._fill_text(text, width, indent)


def version_line(prog: str) -> str:
    """What `PROG --version` prints: the program and the package version."""
    return f"{prog} {__version__}"
