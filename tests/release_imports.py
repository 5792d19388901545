"""Every module the release imports is the standard library's, the release's own, or comes from a
distribution the release declares (its dependencies with the ``notebooks`` extra, and theirs).

The student walk installs the release over the kit's packages (``walk_venv.py``) instead of
downloading every dependency again, so an import the release forgot to declare would be found
there all the same; this check is what still proves the release's ``pyproject.toml`` says what
it needs. Run with the walk's Python (whose ``dp-course-kit`` metadata is the release's):

    VENV/bin/python tests/release_imports.py RELEASE_DIR     # prints JSON: {"undeclared": {...}}

An import inside a ``try`` that catches ImportError (or any exception) is optional and not
counted. Stdlib only, plus ``packaging`` (pip's own dependency, in every venv pip works in).
"""

from __future__ import annotations

import ast
import json
import re
import sys
from importlib import metadata
from pathlib import Path

DIST = "dp-course-kit"
EXTRAS = ("notebooks",)


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(dist: str = DIST, extras=EXTRAS) -> set[str]:
    """The distribution and everything its requirements (with ``extras``) pull in, installed here."""
    from packaging.requirements import Requirement

    todo, seen = [(dist, frozenset(extras))], {}
    while todo:
        name, ex = todo.pop()
        key = _key(name)
        if key in seen and ex <= seen[key]:
            continue
        seen[key] = seen.get(key, frozenset()) | ex
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue  # a declared requirement that is not installed: pip's problem, reported by the install
        for text in requires:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (ex or {""})):
                todo.append((req.name, frozenset(req.extras)))
    return set(seen)


def _optional(tree) -> set[int]:
    """Nodes inside a ``try`` whose handlers catch ImportError, Exception or everything."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                h.type is None or re.search(r"ImportError|ModuleNotFoundError|Exception", ast.dump(h.type))
                for h in node.handlers):
            out.update(id(m) for n in node.body for m in ast.walk(n))
    return out


def imported(root: Path) -> dict[str, list[str]]:
    """Top-level module -> the release files that import it (absolute imports, not optional ones)."""
    out: dict[str, set] = {}
    envs = [p.parent for p in root.rglob("pyvenv.cfg")]  # a venv made inside the release is not the release
    for path in sorted(root.rglob("*.py")):
        if any(e in path.parents for e in envs):
            continue
        try:
            tree = ast.parse(path.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        optional = _optional(tree)
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                out.setdefault(name.split(".")[0], set()).add(str(path.relative_to(root)))
    return {k: sorted(v) for k, v in out.items()}


def undeclared(root: Path) -> dict[str, list[str]]:
    """Imports of the release at ``root`` that no declared distribution provides."""
    closure = declared()
    providers = metadata.packages_distributions()
    envs = [p.parent for p in root.rglob("pyvenv.cfg")]
    files = [p for p in root.rglob("*.py") if not any(e in p.parents for e in envs)]
    own = {p.stem for p in files} | {p.parent.name for p in files if p.name == "__init__.py"}
    bad = {}
    for module, files in imported(root).items():
        if module in sys.stdlib_module_names or module in own or module == "__future__":
            continue
        if not {_key(d) for d in providers.get(module, [])} & closure:
            bad[module] = files
    return bad


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python tests/release_imports.py RELEASE_DIR")
    print(json.dumps({"undeclared": undeclared(Path(sys.argv[1]))}))
