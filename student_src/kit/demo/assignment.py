"""``make demo``: the whole assignment in a few minutes on the embedded default.

1. Task 1: fine-tune the pretrained MiniLM on the synthetic RTE for two epochs and report dev
   accuracy after each (dropout off, so the next step can compare losses exactly), with the
   model's own learning rate and warm-up (``kit/core/models.py`` ``MODEL_DEFAULTS``).
2. Tasks 2a, 2b and 3 on 4 local ranks (global batch 64 = 4 x 16) for a few steps each:
   their per-step global loss must equal Task 1's to floating-point error, and their time per
   iteration shows what each way of synchronising costs.

Why the distributed runs can be compared with Task 1's own first steps (no separate short
Task 1 run): during the linear warm-up the learning rate of step k is ``lr * k / warmup``
whatever the run's length, so a 4-step run with the same warm-up takes exactly Task 1's first
4 steps. (Without a warm-up long enough, the demo runs a short Task 1 reference instead.)

Flags let an instructor lengthen it (``--steps``, ``--dist_steps``, ``--model``); ``--quick``
(or ``KIT_DEMO_QUICK=1``) runs the same pipeline on the ``tiny`` model in seconds, for tests.
"""

import argparse
import os
import sys
import time

from student_src.kit import tasks as task_table
from student_src.kit.core.config import parse_config
from student_src.kit.core.models import check_model_available, model_defaults
from student_src.kit.core.progress import ConsoleEvents
from student_src.kit.errors import KitError
from student_src.kit.ranks import launch as klaunch

#: the single-node task, and the required multi-rank tasks whose losses must equal its own (2a, 2b, 3)
REFERENCE = task_table.reference()
DISTRIBUTED = tuple(task_table.ids(lambda t: t.single_node_equivalence and not t.extra_credit))
#: --quick: the same four runs on the tiny model, 2 ranks, a few steps (tests use it)
QUICK = {"model": "tiny", "steps": 6, "dist_steps": 3, "world_size": 2, "max_seq_length": 32,
         "global_batch_size": 16, "learning_rate": 1e-3, "warmup_steps": 4}


def _run(argv):
    # here, not at the top: it imports torch, heavy for a module that may never need it
    from student_src.kit.train.start import run

    return run(parse_config(argv))


def _tasks_in_one_world(ctx, cfgs):
    """What each rank runs: the distributed tasks one after another in the same process group.

    Exactly what ``run_glue --spawn`` would train, once per task; only the start-up (4 processes
    importing torch and transformers on 2 cores, about 15 s) is paid once instead of three times.
    """
    # here, not at the top: it imports torch, heavy for a module that may never need it
    from student_src.kit.train.trainer import train

    return [train(cfg, ctx) for cfg in cfgs]


def _run_distributed(argvs):
    """Launch the configurations of ``argvs`` (same world size) in one set of local ranks."""
    # here, not at the top: it imports torch, heavy for a module that may never need it
    from student_src.kit.ranks import process_group
    from student_src.kit.train.start import check_data, check_output_dir

    cfgs = [parse_config(argv) for argv in argvs]
    for cfg in cfgs:
        check_output_dir(cfg)
        check_data(cfg)
    check_model_available(cfgs[0].model_name_or_path)
    for cfg in cfgs:  # --backend nccl it cannot honour is refused here, before any rank starts
        process_group.pick_device(cfg, 0)
    # one group for all: its device is chosen for cfgs[0] (Task 2a: gather/scatter, the most demanding)
    stall = max(cfgs[0].dist_timeout, process_group.MIN_COLLECTIVE_TIMEOUT_S)
    results = klaunch.launch(_tasks_in_one_world, cfgs[0].world_size, args=(cfgs,), cfg=cfgs[0],
                             stall_timeout=stall, on_event=ConsoleEvents(cfgs[0]))
    return results[0]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m student_src.kit.demo", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="minilm")
    p.add_argument("--steps", type=int, default=76, help="Task 1 steps (38 = one epoch of the synthetic RTE)")
    p.add_argument("--warmup_steps", type=int, default=None, help="Task 1 linear warm-up steps (default: the model's, minilm 10)")
    p.add_argument("--dist_steps", type=int, default=4, help="steps of each distributed task")
    p.add_argument("--world_size", type=int, default=4)
    p.add_argument("--max_seq_length", type=int, default=72, help="shorter than the assignment's 128: every synthetic pair fits in 72 tokens")
    p.add_argument("--global_batch_size", type=int, default=64)
    p.add_argument("--learning_rate", type=float, default=None,
                   help="default: the model's (minilm 1e-4: the assignment's 2e-5 is for BERT-base, see kit/core/models.py)")
    p.add_argument("--output_dir", default="runs/demo")
    p.add_argument("--data_dir", default=None, help="default: data/glue_data/RTE (make data)")
    p.add_argument("--quick", action="store_true", default=os.environ.get("KIT_DEMO_QUICK", "0") not in ("", "0"),
                   help="tiny model, 2 ranks, a few steps: checks the pipeline in seconds (also KIT_DEMO_QUICK=1)")
    args = p.parse_args(argv)
    if args.quick:
        given = {a.split("=")[0].lstrip("-") for a in (argv if argv is not None else sys.argv[1:]) if a.startswith("--")}
        for key, value in QUICK.items():
            if key not in given:
                setattr(args, key, value)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    defaults = model_defaults(args.model)
    lr = args.learning_rate if args.learning_rate is not None else defaults.get("learning_rate")
    warmup = args.warmup_steps if args.warmup_steps is not None else defaults.get("warmup_steps", 0)
    common = ["--model_name_or_path", args.model, "--dropout", "0", "--max_seq_length", str(args.max_seq_length),
              "--global_batch_size", str(args.global_batch_size), "--warmup_steps", str(warmup),
              "--no_progress", "--logging_steps", "10", "--overwrite_output_dir"]
    if lr is not None:
        common += ["--learning_rate", str(lr)]
    if args.data_dir:
        common += ["--data_dir", args.data_dir]
    # Up to step warmup + 1 the losses do not depend on the run's length (see the docstring).
    same_schedule = args.dist_steps <= warmup + 1 and args.dist_steps <= args.steps
    start = time.perf_counter()
    phases = []
    try:
        print(f"=== Task 1: {args.model} on one process, {args.steps} steps, then dev accuracy")
        t0 = time.perf_counter()
        t1 = _run(["--task", REFERENCE, "--max_steps", str(args.steps), "--output_dir", f"{args.output_dir}/task1", *common])
        phases.append(("task 1", time.perf_counter() - t0))
        ref = t1
        if not same_schedule:
            print(f"\n=== Task 1 reference: {args.dist_steps} steps, the schedule the distributed runs use")
            t0 = time.perf_counter()
            ref = _run(["--task", REFERENCE, "--do_train", "--max_steps", str(args.dist_steps),
                        "--output_dir", f"{args.output_dir}/task1_ref", *common])
            phases.append(("task 1 reference", time.perf_counter() - t0))
        rows = [(REFERENCE, 1, t1)]
        tasks = DISTRIBUTED
        print(f"\n=== Tasks {', '.join(tasks)}: {args.world_size} local ranks (started once for all three), "
              f"{args.dist_steps} steps each")
        t0 = time.perf_counter()
        results = _run_distributed([["--task", task, "--world_size", str(args.world_size), "--spawn", "--do_train",
                                     "--max_steps", str(args.dist_steps), "--output_dir", f"{args.output_dir}/task{task}",
                                     *common] for task in tasks])
        phases.append(("tasks " + "/".join(tasks), time.perf_counter() - t0))
        rows += [(task, args.world_size, m) for task, m in zip(tasks, results)]
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n=== Summary")
    acc = t1["eval"][-1]["accuracy"] if t1.get("eval") else float("nan")
    print(f"Task 1 dev accuracy after {args.steps} steps: {acc:.3f} (majority baseline about 0.5)")
    print(agreement_table(rows, ref["losses"][:args.dist_steps]))
    print(f"(s/iter: mean over the steps after the first; losses compared over the first {args.dist_steps} steps; "
          f"whole demo {time.perf_counter() - start:.0f} s: " + ", ".join(f"{n} {s:.0f} s" for n, s in phases)
          + f"; metrics in {args.output_dir}/)")
    return 0


def agreement_table(rows, ref_losses) -> str:
    """Each task's time per iteration and its largest loss difference from Task 1's."""
    lines = [f"{'task':<5}{'ranks':>6}{'s/iter':>9}{'max |loss - task 1|':>22}"]
    for task, ws, m in rows:
        n = min(len(ref_losses), len(m["losses"]))
        diff = max(abs(a - b) for a, b in zip(ref_losses[:n], m["losses"][:n]))
        lines.append(f"{task:<5}{ws:>6}{m['timing']['mean_s']:>9.3f}{diff:>22.2e}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
