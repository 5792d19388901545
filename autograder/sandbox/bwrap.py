"""The bubblewrap level's command line: what a rank may read (the system, Python, the grader package,
the submission), bound read-only, and the probe that says whether bubblewrap works on this host.

Apart from ``sandbox.py`` (which chooses a level and runs the sandbox) to keep each file short; the
names are imported back there, so ``sandbox.bwrap_argv`` and friends keep working.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

from ..task_table import table_path

SCRATCH_BYTES = 1 << 30   # the sandbox's /tmp (memory-backed): a submission cannot fill the RAM with files
GRADER_PACKAGE = Path(__file__).resolve().parents[1]


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


SYSTEM_DIRS = ["/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin"]


def _readonly_roots() -> list[str]:
    """What a rank must read: system libraries, Python, its packages, the grader package."""
    roots = [p for p in SYSTEM_DIRS if not os.path.islink(p)]
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths = set(filter(None, sysconfig.get_paths().values()))
    try:
        paths.update(site.getsitepackages())
    except AttributeError:  # pragma: no cover
        pass
    paths.update(p for p in sys.path if p and os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p))
    for p in sorted(prefixes | paths):
        if p and os.path.exists(p):
            roots.append(os.path.realpath(p))
    exe = os.path.realpath(sys.executable)
    roots.append(os.path.dirname(exe))
    return _minimal(roots)


def _interpreter_aliases(roots: list[str]) -> list[tuple[str, str]]:
    """``(real, apparent)`` pairs: the interpreter's folders by the paths the grader runs it
    from, where those differ from their real paths and nothing bound shows them.

    The sandbox runs ``sys.executable`` as the grader sees it, and Python finds its prefix (a
    venv's ``pyvenv.cfg``, its ``site-packages``) from that path. ``_readonly_roots`` binds real
    paths only, so an interpreter reached through a symlinked folder (``/tmp/env -> /opt/py``)
    was not there at all when that path lies where the sandbox has its own folder (its private
    ``/tmp``): bubblewrap could not start it, and grading fell back to a weaker level. Binding
    each real folder at its apparent path as well keeps the interpreter where the grader runs it."""
    pairs = []
    for apparent in (os.path.dirname(os.path.abspath(sys.executable)), sys.prefix, sys.exec_prefix,
                     sys.base_prefix, sys.base_exec_prefix):
        apparent = os.path.abspath(apparent)
        real = os.path.realpath(apparent)
        if real == apparent or not os.path.isdir(real):
            continue
        if any(apparent == r or apparent.startswith(r.rstrip("/") + "/") for r in roots):
            continue  # inside a bound folder: its symlinks resolve there (their targets are roots too)
        pairs.append((real, apparent))
    out, seen = [], set()
    for real, apparent in sorted(pairs, key=lambda p: len(p[1])):
        if apparent in seen or any(apparent.startswith(a.rstrip("/") + "/") for _, a in out):
            continue  # a folder whose parent is already bound at its apparent path
        seen.add(apparent)
        out.append((real, apparent))
    return out


def _minimal(paths) -> list[str]:
    """Existing paths, without those inside another one of the list."""
    out: list[str] = []
    for p in sorted({os.path.realpath(p) for p in paths if os.path.exists(p)}, key=len):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


ETC_FILES = ["/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd",
             "/etc/group", "/etc/nsswitch.conf", "/etc/hosts", "/etc/host.conf", "/etc/ssl", "/etc/alternatives",
             "/etc/mime.types", "/etc/python3", "/etc/python3.11", "/etc/os-release"]


def hidden_student_src() -> list[str]:
    """Installed copies of ``student_src`` (a non-editable kit install) that must not be importable."""
    out = []
    for base in set(site.getsitepackages() if hasattr(site, "getsitepackages") else []) | {
            p for p in sys.path if "site-packages" in p or "dist-packages" in p}:
        cand = os.path.join(base, "student_src")
        if os.path.isdir(cand):
            out.append(os.path.realpath(cand))
    return sorted(set(out))


def bwrap_argv(scratch: str, readable: list[str]) -> list[str]:
    """The bubblewrap command line (the command to run follows it)."""
    argv = [bwrap_path() or "bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL",
            "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev",
            "--size", str(256 << 20), "--tmpfs", "/dev/shm", "--size", str(SCRATCH_BYTES), "--tmpfs", "/tmp"]
    roots = _readonly_roots()
    for root in roots:
        argv += ["--ro-bind", root, root]
    for real, apparent in _interpreter_aliases(roots):  # after the private /tmp: bound on top of it
        argv += ["--ro-bind", real, apparent]
    for link in SYSTEM_DIRS:  # usr-merged systems: /bin -> usr/bin and so on
        if os.path.islink(link):
            argv += ["--symlink", os.readlink(link), link]
    for f in ETC_FILES:
        if os.path.exists(f):
            argv += ["--ro-bind", f, f]
    argv += ["--ro-bind", str(GRADER_PACKAGE), str(GRADER_PACKAGE)]
    for path in _minimal(readable):
        argv += ["--ro-bind", path, path]
    for path in hidden_student_src():
        argv += ["--tmpfs", path]
    table = str(table_path())  # the kit's task table, one stdlib-only file (autograder/task_table.py)
    argv += ["--ro-bind", table, table]
    argv += ["--dir", scratch, "--chdir", scratch, "--setenv", "HOME", scratch, "--setenv", "TMPDIR", scratch]
    return argv


@lru_cache(maxsize=None)
def _bwrap_works() -> str:
    """'' if bubblewrap can make its namespaces here, else why not."""
    if not bwrap_path():
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        probe = subprocess.run(bwrap_argv("/tmp/probe", []) + [sys.executable, "-c", "print('ok')"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap did not run: {exc}"
    if probe.returncode != 0 or "ok" not in probe.stdout:
        lines = (probe.stderr or probe.stdout).strip().splitlines()
        last = lines[-1] if lines else str(probe.returncode)
        if "execvp" in last:  # bubblewrap ran, but the interpreter is not where the sandbox looks
            return (f"bubblewrap could not run this Python inside its sandbox ({last}); run the grader "
                    f"with an interpreter outside {os.path.dirname(os.path.abspath(sys.executable))}")
        return f"bubblewrap cannot create namespaces here ({last})"
    return ""
