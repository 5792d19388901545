"""What every course notebook is made of: the cell kinds (with their nbgrader metadata) and the
set-up, parameters, check and results cells the notebooks share.

Every cell carries nbgrader metadata (the notebooks are nbgrader *source* notebooks):

* instructions: markdown, read-only (``locked``);
* the ``parameters`` cell (papermill's tag): editable, no nbgrader metadata;
* set-up and run cells: read-only code;
* checks: autograded test cells (``grade``) that call ``autograder.notebook.check``: the public
  checks for students (the cell raises when a point is lost); in nbgrader's autograde a hidden-tests
  region (``TRUSTED_PRELUDE``) loads the instructor's grader first and the cell's value is the
  points that task earns with every check, hidden ones included (nbgrader's partial credit). The
  cell's maximum is the task's points in ``autograder/points.toml``;
* report questions: manually graded markdown answer cells holding a model answer between
  solution markers; the student release shows "YOUR ANSWER HERE" instead.

The markers are spelled without being written on a line of their own (``SOL_BEGIN`` below) so
that nothing here is mistaken for one by the release's stripper.
"""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from autograder.notebook import ENV_TRUSTED, task_points

SOL_BEGIN, SOL_END = "### " + "BEGIN SOLUTION", "### " + "END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### " + "BEGIN HIDDEN TESTS", "### " + "END HIDDEN TESTS"
ANSWER_POINTS = 2


# --------------------------------------------------------------------------- cell kinds
def _meta(grade_id: str, *, grade=False, solution=False, locked=True, points=None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


class NB:
    """Collects the cells of one notebook; grade ids are numbered so they stay unique."""

    def __init__(self, stem: str):
        self.stem, self.cells, self.n = stem, [], 0

    def _id(self, kind: str) -> str:
        self.n += 1
        return f"{kind}_{self.n:02d}"

    def _add(self, cell, grade_id: str | None = None) -> "NB":
        cell.id = grade_id or f"cell-{len(self.cells) + 1:02d}"  # fixed ids: rebuilding gives the same bytes
        self.cells.append(cell)
        return self

    def md(self, text: str) -> "NB":
        gid = self._id("md")
        return self._add(new_markdown_cell(text.strip("\n"), metadata=_meta(gid)), gid)

    def code(self, src: str) -> "NB":
        gid = self._id("code")
        return self._add(new_code_cell(src.strip("\n"), metadata=_meta(gid)), gid)

    def params(self, src: str) -> "NB":
        return self._add(new_code_cell(src.strip("\n"), metadata={"tags": ["parameters"]}), "parameters")

    def check(self, src: str, points: float) -> "NB":
        gid = self._id("check")
        return self._add(new_code_cell(src.strip("\n"), metadata=_meta(gid, grade=True, points=points)), gid)

    def question(self, prompt: str, answer: str, points: int = ANSWER_POINTS) -> "NB":
        """A read-only prompt, then the student's (manually graded) answer cell."""
        self.md(prompt)
        body = f"{SOL_BEGIN}\n{answer.strip()}\n{SOL_END}"
        gid = self._id("answer")
        return self._add(new_markdown_cell(body, metadata=_meta(gid, grade=True, solution=True, locked=False, points=points)), gid)

    def notebook(self):
        nb = new_notebook(cells=self.cells)
        nb.metadata.update({
            "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
            "language_info": {"name": "python"},
        })
        return nb


# --------------------------------------------------------------------------- shared cells
PARAMS = '''
QUICK = True      # True: tiny model, 3 steps (measured: 17-55 s a notebook on 2 busy cores). False: MiniLM, the assignment's settings (report numbers)
WORLD_SIZE = 4    # local ranks for Tasks 2a, 2b, 3, 5
MAX_STEPS = None  # None: 3 steps in quick mode, 3 epochs in full mode
'''

SETUP = '''
import os, sys
from pathlib import Path
ROOT = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "student_src" / "kit").is_dir()), Path(os.environ.get("KIT_ROOT", "..")))
sys.path.insert(0, str(ROOT))
from student_src.kit import notebook as kit, plots

S = kit.start(quick=QUICK, world_size=WORLD_SIZE, steps=MAX_STEPS)
'''

RUN_INTRO = """
## Run it

The cell below starts the ranks with the kit's launcher (separate processes, so a bug in your
code cannot crash this notebook). Watch one progress bar per rank and the loss curve grow; the
black line is the global loss (mean over ranks), the one Task 1 should match.
"""

RESULTS_INTRO = """
## Results

Losses against Task 1 (the same examples each step: with dropout off they should agree to
rounding error), and the time per iteration of every task you have run in this mode: the
assignment's protocol is the mean over 40 iterations with the first dropped (full mode).
"""


def header(nb: NB, title: str, idea: str, todo: str, params: str = "") -> None:
    nb.md(f"# {title}\n\n{idea.strip()}\n\n**Your TODO:** {todo.strip()}")
    nb.md("## Parameters\n\nStart with `QUICK = True` to see everything work; switch to `QUICK = False` "
          "for the numbers in your report. (CI and graders force quick mode with `KIT_NOTEBOOK_QUICK=1`.)")
    nb.params(PARAMS.strip("\n") + ("\n" + params.strip("\n") if params else ""))
    nb.code(SETUP)


#: the hidden-tests region of every check cell: nbgrader removes it from the students' notebooks and
#: restores it at autograde, where it makes the cell import the instructor's autograder (with the
#: hidden checks), never a copy that came with the submission, and forget any the kernel imported
TRUSTED_PRELUDE = f'''
{HIDDEN_BEGIN}
import os, sys  # grading (nbgrader autograde): the instructor's autograder, with its hidden checks
if os.environ.get("{ENV_TRUSTED}"):
    sys.path.insert(0, os.environ["{ENV_TRUSTED}"])
    for _name in [m for m in sys.modules if m.split(".")[0] == "autograder"]:
        del sys.modules[_name]
{HIDDEN_END}
'''


def check_cells(nb: NB, tasks: str, what: str) -> None:
    names = tasks.split(",")
    args = ", ".join(f'"{t}"' for t in names)
    nb.md(f"## Check your code\n\n{what.strip()}\n\nThis runs the autograder's public checks "
          "(the same ones `python -m autograder check` runs). A failure prints what went wrong.")
    nb.check(TRUSTED_PRELUDE.strip("\n") + f"\nfrom autograder.notebook import check\ncheck({args}, root=S.root)",
             points=task_points(names))


def memory_cell(var: str, compare: tuple[str, ...]) -> str:
    """A code cell: the bytes each rank of run ``var`` (a metrics dict) holds after the first step,
    measured (metrics.json's "memory", ``memory_meter.py``) beside the memory model's prediction,
    one row per rank; then the busiest rank of this run and of the ``compare`` tasks' runs so far
    as bars (``memory_plot.py``). Notebooks 6 and 7 show it."""
    task = var.lstrip("m")
    runs = ", ".join(f'"task{t}": kit.load_metrics("{t}")' for t in compare) + f', "task{task}": {var}'
    return f'''
from IPython.display import Image, Markdown, display
from student_src.kit.plots import memory as memory_plot

if {var} and {var}.get("memory"):
    mem = {var}["memory"]
    lines = ["| rank | parameters MB | gradients MB | optimizer state MB (measured / predicted) | total MB (measured / predicted) |",
             "|---|---|---|---|---|"]
    for r, (got, want) in enumerate(zip(mem["per_rank"], mem["predicted"]["per_rank"])):
        lines.append(f"| {{r}} | {{got['params'] / 1e6:.2f}} | {{got['grads'] / 1e6:.2f}} | "
                     f"{{got['optimizer'] / 1e6:.2f}} / {{want['optimizer'] / 1e6:.2f}} | {{got['total'] / 1e6:.2f}} / {{want['states'] / 1e6:.2f}} |")
    display(Markdown("### Bytes each rank holds after the first step\\n\\n" + "\\n".join(lines)))
    runs = {{n: m for n, m in {{{runs}}}.items() if m and m.get("memory")}}
    rows = memory_plot.memory_rows(runs)
    display(Markdown(memory_plot.memory_markdown(rows)))
    display(Image(plots.to_png(memory_plot.memory_bars(rows))))
else:
    print("no memory recorded: run the cell above first")
'''
