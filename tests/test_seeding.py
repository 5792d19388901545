"""One submission, one grade: a check's secrets come from the grading key, the submission's files,
the check and the rank (``autograder/grading/seeding.py``), so a regrade repeats every input.

The end-to-end tests grade a submission whose ``expected_allreduce_bytes`` raises with the secret
its rank was given (found among the rank's objects, as a determined student would): the secrets
must repeat on a regrade, change when one byte of the submission changes, and change with the key.
A submission that reads the key file gets nothing where student code is isolated.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder.grading import runner, seeding  # noqa: E402
from test_sandbox import LEVELS, make_submission  # noqa: E402

#: appended to profiling.py: every Task 4 check that calls it fails with the rank's secret
SHOW_SECRET = '''
def expected_allreduce_bytes(nbytes, world_size):
    import gc
    ctx = [o for o in gc.get_objects() if type(o).__name__ == "RankContext"]
    raise RuntimeError(f"SECRET={ctx[0].secret}" if ctx else "SECRET=not found")
'''


def _secrets_seen(sub: Path) -> list[str]:
    res = runner.grade(str(sub), tasks={"4"})
    assert not res.grader_errors, res.grader_errors
    seen = [m for t in res.tests for m in re.findall(r"raised RuntimeError: SECRET=(\d+)", t.output)]
    assert seen, [t.output[:300] for t in res.tests]
    return seen


def test_secrets_follow_key_files_check_and_rank():
    one = seeding.check_secrets(b"k", "d" * 64, "2b.mean", 4)
    assert one == seeding.check_secrets(b"k", "d" * 64, "2b.mean", 4)
    assert len(set(one)) == 4 and all(1 <= s < 2**31 - 1 for s in one)
    for other in (seeding.check_secrets(b"K", "d" * 64, "2b.mean", 4), seeding.check_secrets(b"k", "e" * 64, "2b.mean", 4),
                  seeding.check_secrets(b"k", "d" * 64, "2b.sum", 4)):
        assert not set(other) & set(one)


def test_tree_digest_sees_every_name_and_byte(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("x = 1\n")
    (tmp_path / "y.py").write_text("y = 2\n")
    first = seeding.tree_digest(tmp_path)
    assert seeding.tree_digest(tmp_path) == first
    (tmp_path / "a" / "__pycache__").mkdir()
    (tmp_path / "a" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert seeding.tree_digest(tmp_path) == first  # compiled leftovers are not the submission
    (tmp_path / "y.py").write_text("y = 3\n")
    assert seeding.tree_digest(tmp_path) != first
    (tmp_path / "y.py").write_text("y = 2\n")
    (tmp_path / "y.py").rename(tmp_path / "z.py")
    assert seeding.tree_digest(tmp_path) != first


def test_key_file_is_made_once_private_and_kept(tmp_path, monkeypatch):
    monkeypatch.delenv(seeding.KEY_ENV, raising=False)
    monkeypatch.setenv(seeding.KEY_FILE_ENV, str(tmp_path / "cfg" / "grading-key"))
    key = seeding.grading_key()
    path = tmp_path / "cfg" / "grading-key"
    assert len(key) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert seeding.grading_key() == key  # kept, not redrawn
    assert [p.name for p in path.parent.iterdir()] == ["grading-key"]  # no temporary file left
    monkeypatch.setenv(seeding.KEY_ENV, "course-2026")
    assert seeding.grading_key() == b"course-2026"


def test_a_regrade_repeats_the_secrets_and_a_changed_submission_does_not(tmp_path, monkeypatch):
    monkeypatch.delenv(seeding.KEY_ENV, raising=False)
    monkeypatch.setenv(seeding.KEY_FILE_ENV, str(tmp_path / "grading-key"))
    sub = make_submission(tmp_path / "sub", profiling=SHOW_SECRET)
    first = _secrets_seen(sub)
    assert _secrets_seen(sub) == first, "a regrade of the same files drew other secrets"
    with open(sub / "student_src" / "profiling.py", "a") as fh:
        fh.write("# one more line\n")
    changed = _secrets_seen(sub)
    assert not set(changed) & set(first), "a changed submission must get new secrets"
    monkeypatch.setenv(seeding.KEY_ENV, "another course")
    assert not set(_secrets_seen(sub)) & set(changed), "another key must give other secrets"


@pytest.mark.parametrize("level", [lv for lv in LEVELS if getattr(lv, "values", [lv])[0] != "process"])
def test_student_code_cannot_read_the_grading_key(tmp_path, monkeypatch, level):
    """Where student code is isolated (bwrap: not mounted; user: ranks run as nobody, the key is
    0600). At the ``process`` level a rank runs as the grader's own user: no secret is safe there,
    which ``python -m autograder sandbox`` says."""
    key_file = tmp_path / "grading-key"
    monkeypatch.delenv(seeding.KEY_ENV, raising=False)
    monkeypatch.setenv(seeding.KEY_FILE_ENV, str(key_file))
    os.chmod(tmp_path, 0o755)  # the folder is not what protects the key (as ~/.config/dp-kit may not be)
    key = seeding.grading_key().decode()
    steal = f'''
def expected_allreduce_bytes(nbytes, world_size):
    try:
        got = open({str(key_file)!r}).read()
    except OSError as exc:
        got = "unreadable: " + type(exc).__name__
    raise RuntimeError("KEY=" + got)
'''
    res = runner.grade(str(make_submission(tmp_path / "sub", profiling=steal)), tasks={"4"}, sandbox=level)
    outputs = " ".join(t.output for t in res.tests)
    assert "KEY=unreadable" in outputs, outputs[:1000]
    assert key not in outputs


def test_a_key_that_cannot_be_kept_still_grades_and_says_so(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.delenv(seeding.KEY_ENV, raising=False)
    monkeypatch.setenv(seeding.KEY_FILE_ENV, str(blocker / "grading-key"))
    res = runner.grade(str(make_submission(tmp_path / "sub")), tasks={"4"})
    assert not res.grader_errors and res.tests and all(t.passed for t in res.tests)
    assert "the grading key could not be kept" in res.header and seeding.KEY_ENV in res.header


def test_the_public_checks_keep_no_key(tmp_path, monkeypatch):
    """A student's ``check`` grades nothing that counts: it writes no key into their home."""
    monkeypatch.delenv(seeding.KEY_ENV, raising=False)
    key_file = tmp_path / "cfg" / "grading-key"
    monkeypatch.setenv(seeding.KEY_FILE_ENV, str(key_file))
    res = runner.grade(str(make_submission(tmp_path / "sub")), tasks={"4"}, public_only=True)
    assert not res.grader_errors and res.tests and all(t.passed for t in res.tests)
    assert not key_file.parent.exists()
    assert seeding.public_key() != seeding.public_key()  # each run its own secrets
    monkeypatch.setenv(seeding.KEY_ENV, "reproduce")
    assert seeding.public_key() == b"reproduce"


def test_the_key_file_is_where_the_documents_say(tmp_path, monkeypatch):
    """autograder/README: `~/.config/dp-kit/grading-key` (XDG_CONFIG_HOME moves ~/.config)."""
    monkeypatch.delenv(seeding.KEY_FILE_ENV, raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert seeding.key_path() == tmp_path / ".config" / "dp-kit" / "grading-key"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert seeding.key_path() == tmp_path / "cfg" / "dp-kit" / "grading-key"
