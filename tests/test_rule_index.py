"""The rule index (docs/protocol.md, "Rule index") is the one list of protocol rules, and it matches the code.

Code cites a rule by its label in a comment or a docstring: "rule F5c", "rules G6-G8", "(C4b)", "# G10:".
Every label cited in `inri/` and `simulations/` must be a row of the index, every row must be cited
somewhere (or say `spec only: <why>` in its "lives in" column), and every module a row says the rule lives
in must cite it. So a rule renamed in the code only, or in the docs only, fails here.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import inri.core.engine

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "docs" / "protocol.md"
CODE_DIRS = ("inri", "simulations")

# A rule label: its group's letter (G gossip, F forwarding, C custody, M membership, S scoring), a
# number and an optional lower-case letter (a rule refined later: F5b, F5c). Not preceded by a word
# character, a backslash or a dot (so "\xC1" and "x.S1" are not labels), not followed by one.
_LABEL = r"[GFCMS](?:1[0-9]|[1-9])[a-z]?"
LABEL = re.compile(rf"(?<![\w\\.])({_LABEL})(?!\w)")
# "G6-G8", "C1-C3": a range of plain labels of one group cites each rule in it.
RANGE = re.compile(r"(?<![\w\\.])([GFCMS])(1[0-9]|[1-9])[-–]\1(1[0-9]|[1-9])(?!\w)")
# ruff's rule codes in noqa comments (S608) share the shape of a label.
NOQA = re.compile(r"noqa\b:?[\w ,-]*")
ROW = re.compile(rf"^\|\s*({_LABEL})\s*\|(.*)\|(.*)\|\s*$")
SPEC_ONLY = "spec only:"


def labels_in(text: str) -> set[str]:
    """The rule labels one comment or string cites, ranges expanded."""
    text = NOQA.sub("", text)
    found = set(LABEL.findall(text))
    for group, first, last in RANGE.findall(text):
        found.update(f"{group}{n}" for n in range(int(first), int(last) + 1))
    return found


def citations(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """label -> the files (relative paths) whose comments or strings cite it."""
    cited: dict[str, set[str]] = defaultdict(set)
    for path, source in sources.items():
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING):
                for label in labels_in(tok.string):
                    cited[label].add(path)
    return cited


def code_sources() -> dict[str, str]:
    """Every Python file of the code that implements rules, by path relative to the repository."""
    return {str(p.relative_to(ROOT)): p.read_text()
            for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py"))}


def index_rows(markdown: str) -> dict[str, str]:
    """label -> its "lives in" cell, from the table under "## Rule index"."""
    section = markdown.split("\n## Rule index\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"rule {m.group(1)} has two rows in the index"
            rows[m.group(1)] = m.group(3).strip()
    return rows


def modules_named(lives_in: str) -> list[str]:
    """The modules a "lives in" cell says the rule lives in (`gossip.py`, `service.py`); helpers named in
    parentheses ("(buckets: `budget.py`)") hold a mechanism the rule uses and need not cite it."""
    return re.findall(r"`([\w/]+\.py)`", re.sub(r"\([^)]*\)", "", lives_in))


def index_problems(rows: Mapping[str, str], cited: Mapping[str, set[str]],
                   paths: Iterable[str]) -> list[str]:
    """What disagrees between the index and the code (empty: nothing)."""
    problems = [f"{label} is cited in {sorted(cited[label])} but is not in the rule index"
                for label in sorted(set(cited) - set(rows))]
    paths = list(paths)
    for label, lives_in in sorted(rows.items()):
        if lives_in.startswith(SPEC_ONLY):
            if len(lives_in) <= len(SPEC_ONLY) + 3:
                problems.append(f"{label} is spec only without a reason")
            if label in cited:
                problems.append(f"{label} is marked spec only but is cited in {sorted(cited[label])}")
            continue
        if label not in cited:
            problems.append(f"{label} is in the rule index but no code cites it")
        for name in modules_named(lives_in):
            files = [p for p in paths if p.endswith("/" + name)]
            if not files:
                problems.append(f"{label} lives in {name}, which does not exist")
            elif not set(files) & cited.get(label, set()):
                problems.append(f"{label} lives in {name}, which does not cite it")
    return problems


def test_the_scanner_finds_each_citation_form_and_no_lookalike() -> None:
    assert labels_in("# Rule F5c (home.py): see rules G6-G8, C1-C3; (C4b) and F1/F5/F7.") == {
        "F5c", "G6", "G7", "G8", "C1", "C2", "C3", "C4b", "F1", "F5", "F7"}
    assert labels_in("  # noqa: S608 - fixed names") == set()
    assert labels_in('b"\\xC1\\xF5" sha256 x.S1 G1xy F1a2 G0 G20 S1_') == set()
    cited = citations({"a.py": '"""G10: re-stem."""\nx = 1  # rule M7\ny = "F8b"\nG11 = 2\n'})
    assert dict(cited) == {"G10": {"a.py"}, "M7": {"a.py"}, "F8b": {"a.py"}}  # a name G11 is no citation


def test_the_index_and_the_code_cite_the_same_rules() -> None:
    sources = code_sources()
    rows = index_rows(PROTOCOL.read_text())
    assert {"G1", "F5c", "C3b", "M7", "S2"} <= set(rows), "the rule index table was not found"
    problems = index_problems(rows, citations(sources), sources)
    assert problems == [], "\n".join(problems)


def test_a_rule_renamed_in_the_code_only_is_caught() -> None:
    # The acceptance check of issue 38 on today's tree: rename one rule in the modules its row names.
    sources = code_sources()
    rows = index_rows(PROTOCOL.read_text())
    renamed = {p: re.sub(r"\bF5c\b", "F5d", s) for p, s in sources.items()}
    problems = index_problems(rows, citations(renamed), renamed)
    assert any(p.startswith("F5d is cited in") for p in problems)
    assert "F5c is in the rule index but no code cites it" in problems
    one_file = dict(sources, **{"inri/core/home.py": renamed["inri/core/home.py"]})
    assert "F5c lives in home.py, which does not cite it" in index_problems(
        rows, citations(one_file), one_file)


def test_the_engine_docstring_points_to_the_index_instead_of_repeating_it() -> None:
    doc = inri.core.engine.__doc__ or ""
    assert "docs/protocol.md" in doc and "Rule index" in doc
    repeated = re.findall(rf"^\s+({_LABEL})\. ", doc, re.MULTILINE)
    assert repeated == [], f"engine.py's docstring states rules {repeated}: state them in the index only"
