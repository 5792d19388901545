"""Imported once by the sandbox's server (``zygote.py``) before it forks any rank: the slow
imports, done once.

Every rank is a fork of that server, so it starts with torch, torch.distributed, transformers'
BERT, the registered checks and the trusted kit already imported. Nothing here may import a student
module (the server must stay clean: it is the template of every rank).
"""

import torch  # noqa: F401
import torch.distributed  # noqa: F401
import torch.nn.parallel  # noqa: F401
# torch imports its compiler front end lazily, on the first optimizer.step() or backward hook of a
# process: ~1.2 s that every rank (a fresh fork) paid again in each check that trains. Measured:
# a Task 1 check took 1.1-1.7 s in the rank, 0.01 s with this import done once here.
import torch._dynamo  # noqa: F401

import os

# Only the loss-equivalence checks need transformers (5 s of imports); the runner says whether
# the tasks being graded include them. A kit without transformers still grades the rest.
if os.environ.get("AUTOGRADER_PRELOAD_TRANSFORMERS", "1") == "1":
    try:
        import transformers.models.bert.modeling_bert  # noqa: F401
        import transformers.models.auto.modeling_auto  # noqa: F401
    except Exception:  # pragma: no cover
        pass

from .. import registry  # noqa: E402
from . import worker# noqa: F401,E402

registry.discover()


def _import_trusted_kit(folder: str) -> None:
    """The grader's kit, from a folder that holds it alone (``grading/submission.trusted_kit_copy``: no
    student module there, so nothing a student wrote can be imported here). A rank imported these ~70
    modules itself before: ~70 ms of CPU each, ~400 ranks in a grading of the whole solution. Ranks
    keep them (``worker.Rank.enter_workspace``) and import the student's modules from their workspace.
    A kit that fails to import here is dropped whole: every rank then imports it itself, as before."""
    import importlib
    import sys
    sys.path.insert(0, folder)
    try:
        for name in ("student_src.kit.parallel", "student_src.kit.student_api", "student_src.kit.train.task_setup"):
            importlib.import_module(name)
    except Exception:  # noqa: BLE001 - not ours to fix here; the ranks report it where it matters
        for name in [n for n in sys.modules if n == worker.STUDENT_PACKAGE or n.startswith(worker.STUDENT_PACKAGE + ".")]:
            del sys.modules[name]
        os.environ.pop(worker.PRELOAD_KIT_ENV, None)
    finally:
        sys.path.remove(folder)


if os.environ.get(worker.PRELOAD_KIT_ENV):
    _import_trusted_kit(os.environ[worker.PRELOAD_KIT_ENV])
