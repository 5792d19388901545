"""Imports run one way, and you can see it.

Every module of the kit (``student_src/kit``) and of the grader (``autograder``) is parsed with
``ast``: imports at the top and inside functions, relative ones resolved. The tests fail on

* an import loop (a cycle of modules that import each other, however deep the import sits);
* in the kit, an arrow against the order of rooms: a room imports only the rooms below it
  (``ROOMS``, the same order as the map in ``student_src/kit/__init__.py``);
* in the kit, an import of a kit module inside a function without a comment that says why
  (such imports are kept only to keep a heavy or optional dependency out of a light module:
  torch, transformers, matplotlib, IPython widgets).

The checker itself is tested on a planted loop, so a green run means something.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "student_src" / "kit"

#: the kit's rooms from the ground floor up; "contract" = the modules at the top of the kit
#: (errors, tasks, student_api, compression). A room may import itself and the rooms before it.
ROOMS = ("contract", "plots", "core", "ranks", "measure", "resume", "parallel", "train", "whatif", "report",
         "cluster", "notebook", "demo")
#: the parallelisms of ``parallel/``, each a room of its own: none imports another (they share ``registry``)
PARALLELISMS = ("pipeline", "tensor", "context", "expert")


@dataclass(frozen=True)
class Import:
    source: str        # the importing module
    target: str        # the imported module (a module of the same package)
    line: int
    in_function: bool
    commented: bool    # a comment on the import's line(s) or the line above

    def __str__(self):
        where = "inside a function" if self.in_function else "at the top"
        return f"{self.source} -> {self.target} (line {self.line}, {where})"


def modules(folder: Path, package: str) -> dict[str, Path]:
    """``{dotted name: file}`` of every module below ``folder`` (the package ``package``)."""
    out = {}
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join((package, *parts))] = path
    return out


def _resolve(module: str, is_package: bool, node) -> list[str]:
    """The dotted names an import statement may load (``from a import b``: ``a.b`` and ``a``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module or ""
    return [f"{origin}.{alias.name}" for alias in node.names] + [origin]


def imports(folder: Path, package: str) -> list[Import]:
    """Every import of one module of the package by another, at the top or inside a function."""
    mods = modules(folder, package)
    found = []
    for name, path in mods.items():
        text = path.read_text()
        lines = text.splitlines()
        is_package = path.name == "__init__.py"

        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    said = any("#" in line for line in lines[child.lineno - 1:child.end_lineno])
                    above = child.lineno - 2  # a run of imports shares the comment above it
                    while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
                        above -= 1
                    said = said or (above >= 0 and lines[above].strip().startswith("#"))
                    targets = set()
                    for dotted in _resolve(name, is_package, child):
                        # the longest prefix that is one of our modules (``import a.b.c`` loads a.b.c)
                        parts = dotted.split(".")
                        while parts and ".".join(parts) not in mods:
                            parts.pop()
                        if parts:
                            targets.add(".".join(parts))
                    # ``from pkg import mod``: the module, not also the package's face
                    if isinstance(child, ast.ImportFrom):
                        origin = _resolve(name, is_package, child)[-1]
                        if any(t != origin for t in targets):
                            targets.discard(origin)
                    for target in sorted(targets - {name}):
                        found.append(Import(name, target, child.lineno, in_function, said))
                visit(child, inner)

        visit(ast.parse(text), False)
    return found


def cycles(edges: list[Import]) -> list[list[str]]:
    """The import loops: strongly connected groups of two or more modules (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def describe(loop: list[str], edges: list[Import]) -> str:
    inside = set(loop)
    return "loop: " + "; ".join(str(e) for e in edges if e.source in inside and e.target in inside)


def rooms_of(folder: Path, package: str) -> dict[str, str]:
    """``{module: room}``: a module in a subfolder is in that room, a module at the top in the contract."""
    out = {}
    for name, path in modules(folder, package).items():
        rel = path.relative_to(folder).parts
        out[name] = rel[0] if len(rel) > 1 else "contract"
    return out


def against_order(edges: list[Import], folder: Path, package: str, order=ROOMS) -> list[Import]:
    """Imports from a lower room into a higher one (or into a room the order does not name)."""
    where = rooms_of(folder, package)
    rank = {r: i for i, r in enumerate(order)}
    return [e for e in edges if rank.get(where[e.target], len(order)) > rank.get(where[e.source], -1)]


# --------------------------------------------------------------------------- the kit and the grader
def test_the_kit_has_no_import_loop():
    edges = imports(KIT, "student_src.kit")
    assert len(edges) > 100, "the checker found too few imports to be reading the kit"
    loops = cycles(edges)
    assert not loops, "\n".join(describe(loop, edges) for loop in loops)


def test_the_grader_has_no_import_loop():
    edges = imports(ROOT / "autograder", "autograder")
    assert len(edges) > 50, "the checker found too few imports to be reading the grader"
    loops = cycles(edges)
    assert not loops, "\n".join(describe(loop, edges) for loop in loops)


#: the grader's rooms from the ground floor up (autograder/README.md, "Files"): at the top of autograder/ the
#: contract (GRADER_CONTRACT), the notebooks' entry point, and the commands; the rest are its subpackages.
#: Rooms on one floor (a tuple) may not import each other.
GRADER_ROOMS = ("contract", ("sandbox", "judging", "results"), "grading", "public", "checks", "notebook", "course",
                "commands")
GRADER_CONTRACT = {"registry", "points", "task_table"}


def grader_rooms() -> dict[str, str]:
    """``{module: room}`` of the grader: a subpackage is a room; at the top, the contract, ``notebook`` and
    the commands (``cli``, ``__main__``, ``costs``, the package's ``__init__``)."""
    out = {}
    for name, room in rooms_of(ROOT / "autograder", "autograder").items():
        if room == "contract":
            top = name.split(".")[-1]
            room = "contract" if top in GRADER_CONTRACT else "notebook" if top == "notebook" else "commands"
        out[name] = room
    return out


def grader_against_order(edges: list[Import], where: dict[str, str]) -> list[Import]:
    floor = {r: i for i, f in enumerate(GRADER_ROOMS) for r in (f if isinstance(f, tuple) else (f,))}
    return [e for e in edges if where[e.source] != where[e.target]
            and floor.get(where[e.target], len(GRADER_ROOMS)) >= floor.get(where[e.source], -1)]


def test_grader_imports_run_down_the_rooms():
    """Every room of the grader says in its ``__init__`` which rooms it may import; the order here is that map."""
    where = grader_rooms()
    folders = {p.name for p in (ROOT / "autograder").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    named = {r for f in GRADER_ROOMS for r in (f if isinstance(f, tuple) else (f,))}
    assert folders == named - {"contract", "notebook", "commands"}
    for r in folders:
        doc = ast.get_docstring(ast.parse((ROOT / "autograder" / r / "__init__.py").read_text())) or ""
        assert r in ("public", "checks") or "may import" in doc, f"autograder/{r}/__init__.py does not say what it may import"
    wrong = grader_against_order(imports(ROOT / "autograder", "autograder"), where)
    assert not wrong, "imports against the grader's rooms " + str(GRADER_ROOMS) + ":\n" + "\n".join(map(str, wrong))


def test_the_grader_order_checker_sees_an_upward_and_a_sideways_arrow(tmp_path):
    copy = tmp_path / "autograder"
    shutil.copytree(ROOT / "autograder", copy, ignore=shutil.ignore_patterns("__pycache__"))
    spy = copy / "sandbox" / "spy.py"
    spy.write_text(spy.read_text() + "\n\ndef _planted():\n    from ..judging import fixtures# planted\n"
                   "    from ..grading import runner  # planted\n    return fixtures, runner\n")
    where = {n: r for n, r in grader_rooms().items()}
    wrong = grader_against_order(imports(copy, "autograder"), where)
    assert sorted((e.source, e.target) for e in wrong) == [("autograder.sandbox.spy", "autograder.grading.runner"),
                                                          ("autograder.sandbox.spy", "autograder.judging.fixtures")]


def test_every_room_is_in_the_order_and_the_map():
    """A new folder in the kit needs its place in ``ROOMS`` and on the map (kit/__init__.py)."""
    folders = {p.name for p in KIT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(ROOMS) - {"contract"}
    kit_map = (KIT / "__init__.py").read_text()
    assert [r for r in ROOMS[1:] if f"  {r}/" not in kit_map] == []
    for r in folders:
        assert ast.get_docstring(ast.parse((KIT / r / "__init__.py").read_text())), f"{r}/__init__.py says nothing"


def test_kit_imports_run_down_the_rooms():
    wrong = against_order(imports(KIT, "student_src.kit"), KIT, "student_src.kit")
    assert not wrong, "imports against the order of rooms " + str(ROOMS) + ":\n" + "\n".join(map(str, wrong))


def test_each_parallelism_is_a_room_of_its_own():
    """``parallel/pipeline`` and ``parallel/tensor`` (and the next ones) import neither each other nor the
    package's face (``parallel/__init__.py``, which imports them all): only ``parallel.registry``."""
    folders = {p.name for p in (KIT / "parallel").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(PARALLELISMS)
    face = "student_src.kit.parallel"

    def parallelism(module):
        parts = module.split(".")
        return parts[3] if module.startswith(face + ".") and len(parts) > 3 and parts[3] in PARALLELISMS else None

    wrong = [e for e in imports(KIT, "student_src.kit") if parallelism(e.source)
             and (e.target == face or parallelism(e.target) not in (None, parallelism(e.source)))]
    assert not wrong, "a parallelism imports another one, or parallel/__init__:\n" + "\n".join(map(str, wrong))


#: the layers that name no parallelism (``core/`` below ``parallel/``; ``train/``, ``measure/``, ``resume/``)
GENERIC = ("core", "train", "measure", "resume")
#: the sync kinds of the parallelisms (``tasks.py``): what a generic layer must not compare with
PARALLEL_SYNCS = ("pipeline", "tensor_parallel", "context_parallel", "expert_parallel", "composed")


def parallelism_named(folder: Path) -> list[str]:
    """``room/file:line`` of every comparison with a parallelism's ``sync`` kind in ``folder``'s modules."""
    named = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                    isinstance(c, ast.Constant) and c.value in PARALLEL_SYNCS for c in [node.left, *node.comparators]):
                named.append(f"{path.relative_to(folder.parent)}:{node.lineno}")
    return named


def test_the_generic_layers_name_no_parallelism():
    """``core/``, ``train/``, ``measure/`` and ``resume/`` compare no ``sync`` kind with a parallelism's
    (``"pipeline"``, ``"tensor_parallel"``, ...): they look the task up in what the rooms register
    (``core/config.py``'s flag checks and data-rank rules, ``parallel/registry.py``'s setups)."""
    named = [hit for room in GENERIC for hit in parallelism_named(KIT / room)]
    assert not named, named
    assert not (KIT / "core" / "parallel_flags.py").exists(), "each parallelism's flags are its room's (flags.py)"


def test_the_no_parallelism_checker_sees_a_planted_name(tmp_path):
    core = tmp_path / "core"
    core.mkdir()
    (core / "flags.py").write_text("def f(task):\n    return task.sync == 'expert_parallel'\n")
    assert parallelism_named(core) == ["core/flags.py:2"]


def test_kit_imports_inside_functions_say_why():
    """One kit module imports another inside a function only to keep a heavy or optional
    dependency (torch, transformers, matplotlib, IPython) out of a light module, and says so."""
    silent = [e for e in imports(KIT, "student_src.kit") if e.in_function and not e.commented]
    assert not silent, "import at the top, or say why not:\n" + "\n".join(map(str, silent))


# --------------------------------------------------------------------------- the checker itself
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / "pkg"
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def test_the_checker_finds_a_loop_through_a_function_level_import(tmp_path):
    folder = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.b import g\n",
        "b.py": "def g():\n    from . import a# planted\n    return a\n",
        "c.py": "from .a import g\n",
    })
    edges = imports(folder, "pkg")
    assert {(e.source, e.target, e.in_function) for e in edges} == {
        ("pkg.a", "pkg.b", False), ("pkg.b", "pkg.a", True), ("pkg.c", "pkg.a", False)}
    assert cycles(edges) == [["pkg.a", "pkg.b"]]


def test_the_checker_finds_a_planted_loop_and_an_upward_arrow_in_a_copy_of_the_kit(tmp_path):
    copy = tmp_path / "kit"
    shutil.copytree(KIT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert not cycles(imports(copy, "student_src.kit"))
    timing = copy / "core" / "timing.py"
    timing.write_text(timing.read_text() + "\n\ndef _planted():\n    from student_src.kit.core import metrics  # planted\n"
                      "    from student_src.kit.train import trainer  # planted\n    return metrics, trainer\n")
    edges = imports(copy, "student_src.kit")
    loops = cycles(edges)
    assert any({"student_src.kit.core.timing", "student_src.kit.core.metrics"} <= set(loop) for loop in loops)
    wrong = against_order(edges, copy, "student_src.kit")
    assert [(e.source, e.target) for e in wrong] == [("student_src.kit.core.timing", "student_src.kit.train.trainer")]
    silent = [e for e in edges if e.in_function and not e.commented]
    assert not [e for e in silent if e.source == "student_src.kit.core.timing"]
    timing.write_text(timing.read_text().replace("  # planted", ""))
    silent = [e for e in imports(copy, "student_src.kit") if e.in_function and not e.commented]
    assert {e.target for e in silent if e.source == "student_src.kit.core.timing"} == {
        "student_src.kit.core.metrics", "student_src.kit.train.trainer"}


# --------------------------------------------------------------------------- small files
MAX_LINES = 450


def test_no_source_file_over_450_lines():
    """A file a reader takes in at once: split by what the parts do, not by line count alone."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    long = sorted((n, rel) for rel in listed if not rel.startswith("tests/") and (ROOT / rel).is_file()
                  and (n := len((ROOT / rel).read_text().splitlines())) > MAX_LINES)
    assert not long, long
