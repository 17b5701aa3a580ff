"""Docs that are specifications carry no lab notebook: dated measurements live in docs/results/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS = ("docs/protocol.md",)
RESULTS_LINK = re.compile(r"docs/results/[\w.-]+\.md")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# A commit hash as the docs quoted them: 7 to 40 hex digits, at least one of them a digit (numbers in the
# docs group their thousands: 1,000,000). Algorithm names of that shape are not hashes.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
NOT_COMMITS = {"ed25519"}


def notebook_marks(text: str) -> list[str]:
    """Dates and commit hashes in a document, links to docs/results/ files left out."""
    text = RESULTS_LINK.sub("", text)
    return DATE.findall(text) + [h for h in COMMIT.findall(text) if h not in NOT_COMMITS]


def test_the_checker_sees_dates_and_commits_but_not_results_links() -> None:
    assert notebook_marks("main at 0505109 (2026-11-26), old = b24cb9f") == ["2026-11-26", "0505109", "b24cb9f"]
    assert notebook_marks("see docs/results/2026-11-26-datagrams.md; ed25519, blake2b-128, 0xE1") == []


def test_spec_documents_hold_no_dated_measurements() -> None:
    for name in SPECS:
        marks = notebook_marks((ROOT / name).read_text())
        assert marks == [], f"{name} quotes {marks}: move the measurement to docs/results/ (one dated file per study)"
