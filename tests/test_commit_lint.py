"""`make lint`'s commit check (.ci/check_commits.py) through its command line, on a scratch repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "check_commits.py"

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")]


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "PATH": "/usr/bin:/bin", "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _check(repo: Path, since: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--repo", str(repo), "--since", since],
                          capture_output=True, text=True)


def test_commits_after_the_rule_are_judged_and_older_ones_are_not(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    base = _commit(tmp_path, "an old subject far longer than seventy-two characters, from before the rule began")
    _commit(tmp_path, "Add the commit check\n\nWhy: subjects were 151 characters on average.")
    assert _check(tmp_path, base).returncode == 0

    long = _commit(tmp_path, "x" * 73)
    wip = _commit(tmp_path, "wip routing")
    glued = _commit(tmp_path, "Fix the sweeper\nno blank line before this body")
    result = _check(tmp_path, base)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert any(line.startswith(long[:10]) and "73 characters" in line for line in lines), lines
    assert any(line.startswith(wip[:10]) and "work-in-progress" in line for line in lines), lines
    assert any(line.startswith(glued[:10]) and "blank line" in line for line in lines), lines
    assert len(lines) == 3, lines  # the good commit and the base are not listed


def test_a_subject_of_exactly_72_characters_passes(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    base = _commit(tmp_path, "base")
    _commit(tmp_path, "A" * 72)
    assert _check(tmp_path, base).returncode == 0
