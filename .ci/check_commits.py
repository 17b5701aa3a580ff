#!/usr/bin/env python3
"""Check the messages of the commits made since the history rule began (issue 38, item 4).

Every commit after RULE_SINCE must have a subject of at most 72 characters, no "wip"/"fixup!"/"squash!"
subject, no trailing period, and (when it has a body) a blank line between subject and body. Older
commits are history and are not judged. Run by `make lint`; exit 1 lists each offending commit.

Usage: check_commits.py [--since REV] [--repo DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

RULE_SINCE = "53a3677"  # main when the rule was adopted (2026-11-29): commits after it are checked
SUBJECT_MAX = 72
_BAD_STARTS = ("wip", "fixup!", "squash!", "amend!")


def problems(message: str) -> list[str]:
    """What is wrong with one commit message (empty: nothing)."""
    lines = message.splitlines()
    subject = lines[0].strip() if lines else ""
    found = []
    if not subject:
        found.append("empty subject")
    if len(subject) > SUBJECT_MAX:
        found.append(f"subject is {len(subject)} characters (at most {SUBJECT_MAX})")
    if subject.lower().startswith(_BAD_STARTS):
        found.append("a work-in-progress or fixup subject")
    if subject.endswith("."):
        found.append("subject ends with a period")
    if len(lines) > 1 and lines[1].strip():
        found.append("no blank line between subject and body")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", default=RULE_SINCE, help="check commits after this revision")
    parser.add_argument("--repo", default=".", help="the repository (default: here)")
    args = parser.parse_args(argv)
    git = ["git", "-C", args.repo]
    if subprocess.run([*git, "rev-parse", "--git-dir"], capture_output=True).returncode != 0:
        print("check_commits: not a git checkout; nothing to check", file=sys.stderr)
        return 0
    if subprocess.run([*git, "cat-file", "-e", f"{args.since}^{{commit}}"], capture_output=True).returncode != 0:
        print(f"check_commits: {args.since} is not in this clone (shallow?); nothing to check", file=sys.stderr)
        return 0
    out = subprocess.run([*git, "log", "--no-merges", "--format=%H%x00%B%x01", f"{args.since}..HEAD"],
                         capture_output=True, text=True, check=True).stdout
    bad = 0
    for record in out.split("\x01"):
        record = record.strip("\n")
        if not record:
            continue
        sha, _, message = record.partition("\x00")
        for problem in problems(message):
            bad += 1
            print(f"{sha[:10]} {message.splitlines()[0][:60]!r}: {problem}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
