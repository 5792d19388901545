"""run_glue --task 11 against Task 1 on the tiny BERT (fp32, dropout 0, 4 steps, 16 x 32 tokens): the largest
difference of the logged loss for each layout and attention (a markdown row each).

    python benchmarks/context/equivalence.py [MODE ...]   # only these attentions (default: all)
"""
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "data_scripts")]
from make_synthetic_rte import generate  # noqa: E402

from student_src.kit import tasks  # noqa: E402
from student_src.kit.core.config import parse_config  # noqa: E402
from student_src.kit.train.start import run  # noqa: E402

CP = tasks.ids(lambda t: t.sync == "context_parallel")[0]
D = [None]


def losses(task, *extra, ws=None):
    d = D[0]
    argv = [*extra, "--task", task, "--model_name_or_path", "tiny", "--dropout", "0", "--max_steps", "4",
            "--global_batch_size", "16", "--max_seq_length", "32", "--data_dir", d + "/RTE", "--do_train", "--no_progress",
            "--output_dir", d + "/o" + task + "".join(extra) + str(ws)]
    if ws:
        argv += ["--world_size", str(ws), "--spawn", "--num_threads", "1"]
    return run(parse_config(argv))["losses"]


if __name__ == "__main__":
    d = D[0] = tempfile.mkdtemp()
    generate(d + "/RTE", seed=7, n_train=256, n_dev=64, n_test=32)
    ref = losses(tasks.reference())
    only = set(sys.argv[1:])
    for ws, c, m in ((2, 2, "allgather"), (2, 2, "ring"), (4, 2, "allgather"), (4, 2, "ring"), (4, 4, "ring"), (4, 4, "allgather"),
                     (2, 2, "ulysses"), (4, 2, "ulysses")):  # tiny has 2 heads: Ulysses up to C = 2
        if only and m not in only:
            continue
        got = losses(CP, "--cp_size", str(c), "--cp_attention", m, ws=ws)
        print(f"| {ws} | {c} | {m} | {max(abs(a - b) for a, b in zip(ref, got)):.2e} |")
