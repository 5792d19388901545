"""The one entry point: ``python -m student_src.run_glue`` (or ``python run_glue.py``).

Single node (Task 1)::

    python -m student_src.run_glue --task 1 --model_name_or_path minilm --output_dir runs/task1

Four local ranks on this machine::

    python -m student_src.run_glue --task 2b --world_size 4 --spawn --output_dir runs/task2b

One process per node (the course's contract; ``--local_rank`` is this node's rank)::

    python run_glue.py --task 2a --master_ip 10.10.1.1 --master_port 6585 --world_size 4 --local_rank 0

or ``torchrun --nnodes 4 --node_rank R --master_addr 10.10.1.1 --master_port 6585 run_glue.py --task 3``.
"""

import os
import sys

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # c10d's C++ retry chatter hides the real error
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def summary(metrics: dict) -> str:
    """A few lines a student can paste into the report."""
    lines = [f"== Task {metrics['task']} ({metrics['title']}) on {metrics['world_size']} rank(s), "
             f"model {metrics['model']['name']} ({metrics['model']['parameters'] / 1e6:.1f} M parameters)"]
    if metrics.get("losses"):
        first = ", ".join(f"{x:.4f}" for x in metrics["losses"][:5])
        lines.append(f"   first losses: {first}   final loss: {metrics['losses'][-1]:.4f}")
        t = metrics.get("timing") or {}
        if t.get("mean_s") is not None:
            lines.append(f"   time per iteration: {t['mean_s']:.4f} s (mean of {t['iterations']}, first dropped)"
                         f"   {metrics.get('examples_per_second', 0):.1f} examples/s")
    for e in metrics.get("eval", []):
        lines.append(f"   epoch {e['epoch']}: dev accuracy {e['accuracy']:.4f}  dev loss {e['loss']:.4f}")
    comm = metrics.get("comm") or {}
    if comm.get("collectives_per_step"):
        lines.append(f"   all_reduce per step: {comm['collectives_per_step']} tensors, {comm['bytes_per_step'] / 1e6:.2f} MB")
    traffic = metrics.get("traffic")
    if traffic and traffic.get("expected_bytes"):
        lines.append(f"   traffic on {traffic['interface']}: measured {traffic['measured_bytes'] / 1e6:.2f} MB, "
                     f"expected {traffic['expected_bytes'] / 1e6:.2f} MB (ratio {traffic['measured_bytes'] / traffic['expected_bytes']:.3f})")
    out = metrics["config"].get("output_dir")
    if out:
        lines.append(f"   metrics: {os.path.join(out, 'metrics.json')}")
    return "\n".join(lines)


def main(argv=None, defaults=None) -> int:
    from student_src.kit.core.config import parse_config
    from student_src.kit.errors import KitError

    try:
        from student_src.kit.train.start import run  # imports the parallelisms, whose flag checks parse_config runs

        cfg = parse_config(argv, defaults)
        metrics = run(cfg)
    except KitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if metrics is not None:
        print(summary(metrics))
        if cfg.timing_iters:
            from student_src.kit.core.timing import format_timing_table

            print(format_timing_table([{"task": metrics["task"], "world_size": metrics["world_size"], **metrics["timing"]}]))
    return 0


if __name__ == "__main__":
    from student_src.kit.ranks.process_group import exit_process

    exit_process(main())  # a rank ends without the interpreter's teardown (see exit_process)
