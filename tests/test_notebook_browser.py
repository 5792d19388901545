"""One course notebook run the way a student runs it: JupyterLab in a headless Chromium (Playwright).

``test_notebooks.py`` executes every notebook with nbclient, which checks the kernel side (no error, the
widget state stored) but not what a browser draws: whether JupyterLab loads the widget extension, draws
each progress bar and the live loss curve, and shows the plots. Here JupyterLab serves a copy of
notebook 1 (the fastest with a progress bar, a live curve and plots: Task 1 on one rank, quick mode),
the browser opens it and runs all cells from the Run menu, and the test reads the page: no error output,
no "Error displaying widget", a finished progress bar, a drawn loss curve, at least one plot. The saved
notebook then shows every code cell executed and no error output.

Needs the ``playwright`` package (the ``dev`` extra) and a Chromium: Debian's (``make browser-tools``
installs it as root with apt-get, as ``make test`` does in CI), another named by ``KIT_CHROMIUM``, or
Playwright's own; skipped with the reason where there is none. Costs one JupyterLab start and one
notebook run: about 30-60 s.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "1_single_node"
TOKEN = "kit-browser-test"
#: deadlines (hang guards, not timings): JupyterLab's start, the page's load, the whole run
START_S, LOAD_S, RUN_S = 120, 120, 420


def _chromium() -> str | None:
    """A Chromium to drive: ``KIT_CHROMIUM``, Debian's, or the one ``playwright install`` put in its cache."""
    given = os.environ.get("KIT_CHROMIUM")
    if given:
        return given if Path(given).exists() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def browser_tools():
    """Playwright's sync API and a Chromium to drive, or the test skips saying which is missing (before
    JupyterLab starts)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="no playwright: pip install -e '.[dev]'")
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no Chromium to drive: `make browser-tools` installs Debian's (root, apt-get), "
                    "or set KIT_CHROMIUM=/path/to/chromium")
    return sync_api, chromium


@pytest.fixture
def lab(browser_tools, tmp_path, small_rte):
    """JupyterLab on a folder holding a copy of the notebook (autosave never touches notebooks/), in quick
    mode on the small synthetic RTE, its settings in the test's folder; stopped (its process group) after."""
    work = tmp_path / "lab"
    (work / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / "notebooks" / f"{NOTEBOOK}.ipynb", work / "notebooks")
    settings = tmp_path / "settings"
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))  # every cell in the page, not only those in view
    port = _free_port()
    env = dict(os.environ, KIT_ROOT=str(ROOT), KIT_NOTEBOOK_QUICK="1", KIT_RUNS_DIR=str(tmp_path / "runs"),
               KIT_DATA_DIR=str(small_rte), JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env.pop("NBGRADER_EXECUTION", None)
    log = (tmp_path / "lab.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
                             f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={work}", "--allow-root"],
                            cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_S
    try:
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=5).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start: {(tmp_path / 'lab.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield url, work / "notebooks" / f"{NOTEBOOK}.ipynb", tmp_path / "lab.log"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


def test_notebook_runs_in_jupyterlab_in_a_browser(browser_tools, lab):
    sync_api, chromium = browser_tools
    url, saved, lab_log = lab
    with sync_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=chromium, headless=True,
                                        args=["--no-sandbox", "--disable-dev-shm-usage"])
        except sync_api.Error as exc:
            pytest.skip(f"Chromium at {chromium} does not start headless here: {str(exc).splitlines()[0]}")
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(LOAD_S * 1000)
            page.goto(f"{url}/lab/tree/notebooks/{NOTEBOOK}.ipynb?token={TOKEN}")
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').first.wait_for()  # the kernel is up
            _run_all_cells(page)
            _wait_until_run(page, lab_log)
            page.wait_for_timeout(1000)  # the last outputs' widgets draw
            text = page.locator(".jp-Notebook").inner_text()
            errors = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]').count()
            assert errors == 0, text[-3000:]
            assert "Error displaying widget" not in text and "Loading widget" not in text, text[-3000:]
            # ipywidgets' progress bar: its inner bar's width is the fraction done, green when the run finished
            bars = page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea .widget-hprogress .progress-bar')]
                                          .map(b => [b.style.width, b.classList.contains('progress-bar-success')])""")
            assert bars, "no progress bar drawn (is the ipywidgets extension loaded?)"
            assert any(width == "100%" and success for width, success in bars), f"no finished progress bar: {bars}"
            images = page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea img')]
                                            .map(i => [i.closest('.widget-image') !== null, i.naturalWidth])""")
            assert any(widget and width > 0 for widget, width in images), f"the live loss curve was not drawn: {images}"
            assert any(not widget and width > 0 for widget, width in images), f"no plot drawn: {images}"
            assert "passed" in text and "Time per iteration" in text
            page.keyboard.press("Control+s")
            page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=30_000)
        finally:
            browser.close()
    nb = nbformat.read(saved, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), [c.source[:40] for c in code if not c.execution_count]
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]


#: how long a click on "Run All Cells" may take to start the first cell before the test clicks again
STARTED_S = 30


def _run_all_cells(page) -> None:
    """Run > Run All Cells, until a cell has started. Under load the notebook may not be the current widget
    yet when the page first draws: the menu item is then disabled and a click on it does nothing (seen in
    CI: every prompt still "[ ]:" after 420 s). So focus the notebook, click the item only once it is
    enabled, and click again if no cell has started after ``STARTED_S``."""
    for _ in range(3):
        page.locator(".jp-Notebook .jp-Cell").first.click()
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        deadline = time.monotonic() + STARTED_S
        while time.monotonic() < deadline:
            if any(p != "[ ]:" for p in page.evaluate(STATE_JS)["prompts"]):
                return
            page.wait_for_timeout(500)
        page.keyboard.press("Escape")  # a menu left open
    pytest.fail(f"Run > Run All Cells started no cell in 3 tries of {STARTED_S} s")


#: the page's state: each code cell's prompt ("[3]:" run, "[*]:" running or queued, "[ ]:" never run) and
#: whether an error output is shown
STATE_JS = """() => ({
    prompts: [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim()),
    errors: document.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]').length,
})"""


def _wait_until_run(page, lab_log: Path) -> None:
    """Until every code cell has run (a number in its prompt); fails at once on an error output (Run All stops
    there), and with the prompts, the page's end and the server's log after ``RUN_S``."""
    deadline = time.monotonic() + RUN_S
    while True:
        state = page.evaluate(STATE_JS)
        if state["errors"] or (state["prompts"] and all(p[1:-2].isdigit() for p in state["prompts"])):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"the notebook did not finish in {RUN_S} s: prompts {state['prompts']}\n"
                        f"{page.locator('.jp-Notebook').inner_text()[-2000:]}\n--- JupyterLab:\n{lab_log.read_text()[-2000:]}")
        page.wait_for_timeout(1000)
