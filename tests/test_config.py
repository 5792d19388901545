"""Flags: defaults, --config files, and a one-line error for every inconsistent combination."""

import json

import pytest

from student_src.kit import parallel, tasks  # noqa: F401  (parallel: its rooms register their flag checks)
from student_src.kit.core.config import parse_config, per_worker_batch_size
from student_src.kit.errors import KitError


def test_defaults_follow_the_assignment():
    cfg = parse_config([])
    assert (cfg.task, cfg.task_name, cfg.max_seq_length, cfg.global_batch_size) == ("1", "RTE", 128, 64)
    assert cfg.data_dir == "data/glue_data/RTE" and cfg.num_train_epochs == 3
    assert cfg.do_train and cfg.do_eval
    # the assignment's lr (for BERT-base) applies to every model without defaults of its own ...
    cfg = parse_config(["--model_name_or_path", "tiny"])
    assert (cfg.learning_rate, cfg.warmup_steps) == (2e-5, 0)


def test_the_small_default_model_brings_its_own_lr_and_warmup(tmp_path):
    """MiniLM learns nothing in 3 epochs at lr 2e-5 (benchmarks/task1/): it gets 1e-4 and 10
    warm-up steps, but only for the flags the user did not give."""
    assert (parse_config([]).learning_rate, parse_config([]).warmup_steps) == (1e-4, 10)
    cfg = parse_config(["--learning_rate", "2e-5"])
    assert (cfg.learning_rate, cfg.warmup_steps) == (2e-5, 10)
    cfg = parse_config(["--warmup_steps", "0"])
    assert (cfg.learning_rate, cfg.warmup_steps) == (1e-4, 0)
    conf = tmp_path / "c.json"
    conf.write_text('{"learning_rate": 3e-5}')
    assert parse_config(["--config", str(conf)]).learning_rate == 3e-5
    assert parse_config(["--config", str(conf), "--learning_rate", "5e-5"]).learning_rate == 5e-5


def test_old_flag_names_still_work():
    for flag in ("--per_device_train_batch_size", "--per_gpu_train_batch_size"):  # README: the alias and its name
        cfg = parse_config([flag, "8", "--task", "2a", "--world_size", "4", "--spawn"])
        assert cfg.per_device_train_batch_size == 8
        assert per_worker_batch_size(cfg, 4)[0] == 8  # 8 per worker, not the global 64 split four ways


def test_global_batch_is_split_over_workers():
    cfg = parse_config(["--task", "2b", "--world_size", "4", "--spawn"])
    per_worker, how = per_worker_batch_size(cfg, 4)
    assert per_worker == 16 and "64" in how
    with pytest.raises(KitError, match="not divisible"):
        per_worker_batch_size(parse_config(["--global_batch_size", "10"]), 4)


def test_config_file_with_command_line_winning(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"learning_rate": 1e-4, "seed": 3}))
    cfg = parse_config(["--config", str(path), "--seed", "5"])
    assert cfg.learning_rate == 1e-4 and cfg.seed == 5
    path.write_text(json.dumps({"learning_rat": 1}))
    with pytest.raises(KitError, match="unknown keys"):
        parse_config(["--config", str(path)])


@pytest.mark.parametrize("argv, message", [
    (["--task", "2b", "--world_size", "4", "--local_rank", "4"], "outside the world"),
    (["--task", "2b", "--world_size", "0"], "at least 1"),
    (["--task", "2b", "--world_size", "2", "--spawn", "--local_rank", "0"], "drop --local_rank"),
    (["--task", "2b", "--spawn"], "needs --world_size"),
    (["--task", "1", "--world_size", "2", "--spawn"], "single-node"),
    (["--master_ip", "10.10.1.1", "--world_size", "2", "--local_rank", "0"], "--master_port"),
    (["--timing_iters", "1"], "at least 2"),
    (["--task", "2b", "--world_size", "4", "--spawn", "--global_batch_size", "10"], "not divisible by --world_size 4"),
    (["--task", "2b", "--world_size", "2", "--spawn", "--master_ip", "127.0.0.1", "--master_port", "6585"], "drop --master_ip"),
    (["--task", "1", "--measure_traffic"], "between ranks"),
    (["--task", "2b", "--world_size", "2", "--spawn", "--grad_compression", "fp16"], "--task 3 or 5"),
])
def test_inconsistent_flags_are_refused(argv, message):
    with pytest.raises(KitError, match=message):
        parse_config(argv)


def test_unknown_task_is_an_argparse_error(capsys):
    unknown = str(max(int(t) for t in tasks.ids() if t.isdigit()) + 1)  # the next task, not in the table yet
    with pytest.raises(SystemExit):
        parse_config(["--task", unknown])
    assert "invalid choice" in capsys.readouterr().err


def test_torchrun_world_size_is_checked_against_the_global_batch(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(KitError, match="not divisible by --world_size 3"):
        parse_config(["--task", "3"])
    assert parse_config(["--task", "3", "--global_batch_size", "63"]).global_batch_size == 63


def test_torch_sharding_is_for_the_sharding_tasks_and_without_checkpoints():
    from student_src.kit.core.config import parse_config
    from student_src.kit.errors import KitError

    assert parse_config(["--task", "7", "--torch_sharding"]).torch_sharding
    for argv, says in ((["--task", "3"], "--task 6 or 7"), (["--task", "6", "--save_every", "2", "--output_dir", "x"], "checkpoint"),
                       (["--task", "7", "--measure_traffic"], "measure without --torch_sharding")):
        with pytest.raises(KitError, match=says):
            parse_config([*argv, "--torch_sharding"])


def test_pipeline_flags_are_checked_before_any_rank_starts(tmp_path):
    """Task 9: its flags only with a pipeline; stages that divide the ranks; replicas x micro-batches
    that divide the batch. Every stage loads the whole batch, so 3 stages take a batch of 16 (which
    3 data-parallel workers could not split)."""
    from student_src.kit.train.start import check_data

    for argv, says in ((["--task", "2b", "--micro_batches", "8"], "are for a pipeline"),
                       (["--task", "9", "--world_size", "4", "--pipeline_stages", "3"], "does not divide --world_size 4"),
                       (["--task", "9", "--micro_batches", "5"], "do not divide the batch of 64"),
                       (["--task", "9", "--world_size", "4", "--pipeline_stages", "2", "--global_batch_size", "12",
                         "--micro_batches", "4"], "2 replica"),
                       (["--task", "9", "--timeline", "2"], "not there yet for pipelines"),
                       (["--task", "9", "--torch_pipelining", "--measure_traffic"], "measure without --torch_pipelining"),
                       (["--task", "9", "--virtual_stages", "2"], "for --schedule interleaved"),
                       (["--task", "9", "--schedule", "interleaved"], "--virtual_stages 2 or more"),
                       (["--task", "9", "--world_size", "3", "--global_batch_size", "12", "--schedule", "interleaved",
                         "--virtual_stages", "2", "--micro_batches", "4"], "not a multiple of 3"),
                       (["--task", "2b", "--virtual_stages", "2"], "are for a")):
        with pytest.raises(KitError, match=says):
            parse_config(argv)
    cfg = parse_config(["--task", "9", "--world_size", "3", "--global_batch_size", "16", "--schedule", "afab"])
    for allowed in (["--measure_traffic"], ["--save_every", "2", "--output_dir", str(tmp_path / "o")],
                    ["--schedule", "interleaved", "--virtual_stages", "2", "--measure_traffic"]):  # its model: chunks
        parse_config(["--task", "9", "--world_size", "2", "--global_batch_size", "16", *allowed])  # not refused
    assert (cfg.micro_batches, cfg.schedule, cfg.pipeline_stages) == (4, "afab", None)
    train = tmp_path / "train.tsv"
    train.write_text("index\tsentence1\tsentence2\tlabel\n" + "".join(f"{i}\ta\tb\tentailment\n" for i in range(20)))
    cfg.data_dir, cfg.do_eval = str(tmp_path), False
    check_data(cfg)  # one global batch of 16 fits in 20 examples: the stages do not multiply it


def test_tensor_parallel_flag_is_checked_up_front():
    """Task 10's --tp_size: only with a tensor-parallel task, dividing the ranks, without the flags
    tensor parallelism does not support yet; the default (None) puts every rank in one TP group."""
    for argv, says in ((["--task", "2b", "--tp_size", "2"], "are for tensor parallelism: use them with --task 10"),
                       (["--task", "10", "--torch_tp", "--measure_traffic"], "run --measure_traffic/--save_every"),
                       (["--task", "10", "--world_size", "4", "--tp_size", "3"], "does not divide --world_size 4"),
                       (["--task", "10", "--tp_size", "0"], "at least 1"),
                       (["--task", "10", "--timeline", "2"], "not there yet for tensor parallelism")):
        with pytest.raises(KitError, match=says):
            parse_config(argv)
    assert parse_config(["--task", "10", "--world_size", "4"]).tp_size is None
    assert parse_config(["--task", "10", "--world_size", "4", "--tp_size", "2"]).tp_size == 2
    assert parse_config(["--task", "10", "--world_size", "4", "--tp_size", "2", "--measure_traffic"]).measure_traffic
    # the batch is split over the replicas, not the ranks: 3 ranks in one TP group take a batch of 16
    assert parse_config(["--task", "10", "--world_size", "3", "--tp_size", "3", "--global_batch_size", "16"]).tp_size == 3
    with pytest.raises(KitError, match="not divisible by the 2 data-parallel replicas"):  # 15 rows do not split in 2
        parse_config(["--task", "10", "--world_size", "4", "--tp_size", "2", "--global_batch_size", "15"])


def test_sequence_parallel_flag_is_checked_up_front():
    """--sequence_parallel: only with a tensor-parallel task, not with --torch_tp, and a --max_seq_length
    that the TP size divides (one line each)."""
    for argv, says in ((["--task", "2b", "--sequence_parallel"], "are for tensor parallelism: use them with --task 10"),
                       (["--task", "10", "--sequence_parallel", "--torch_tp"], "without --torch_tp"),
                       (["--task", "10", "--world_size", "4", "--tp_size", "4", "--sequence_parallel",
                         "--max_seq_length", "30"], "--max_seq_length 30 does not divide by the tensor-parallel size 4")):
        with pytest.raises(KitError, match=says):
            parse_config(argv)
    assert parse_config(["--task", "10", "--world_size", "4", "--tp_size", "2", "--sequence_parallel",
                         "--max_seq_length", "30"]).sequence_parallel
    assert not parse_config(["--task", "10", "--world_size", "2"]).sequence_parallel


def test_vocab_parallel_flag_is_checked_up_front():
    """--vocab_parallel: only with a tensor-parallel task, not with --torch_tp, not with checkpoints (one line
    each); with --sequence_parallel and TP x DP it is accepted."""
    for argv, says in ((["--task", "2b", "--vocab_parallel"], "are for tensor parallelism: use them with --task 10"),
                       (["--task", "10", "--vocab_parallel", "--torch_tp"], "without --torch_tp"),
                       (["--task", "10", "--vocab_parallel", "--save_every", "2", "--output_dir", "o"], "without checkpoints"),
                       (["--task", "10", "--vocab_parallel", "--resume", "latest"], "without checkpoints")):
        with pytest.raises(KitError, match=says):
            parse_config(argv)
    cfg = parse_config(["--task", "10", "--world_size", "4", "--tp_size", "2", "--vocab_parallel", "--sequence_parallel"])
    assert cfg.vocab_parallel and cfg.sequence_parallel
    assert not parse_config(["--task", "10", "--world_size", "2"]).vocab_parallel


@pytest.mark.parametrize("argv, message", [
    (["--task", "12", "--model_name_or_path", "tiny-moe", "--world_size", "2", "--spawn", "--ep_size", "0"],
     "--ep_size must be at least 1"),
    (["--task", "12", "--model_name_or_path", "tiny-moe", "--world_size", "2", "--spawn", "--ep_size", "-2"],
     "--ep_size must be at least 1"),
    (["--task", "1", "--model_name_or_path", "tiny", "--num_experts", "8"], "--num_experts .*tiny-moe or minilm-moe"),
    (["--task", "1", "--top_k", "2"], "--top_k .*--model_name_or_path minilm is not"),
    (["--task", "1", "--model_name_or_path", "tiny", "--capacity_factor", "0"], "--capacity_factor "),
    (["--task", "2b", "--world_size", "2", "--spawn", "--model_name_or_path", "tiny", "--aux_loss_coef", "0"],
     "--aux_loss_coef "),
    (["--task", "12", "--model_name_or_path", "tiny", "--world_size", "2", "--spawn"], "routes tokens to experts"),
])
def test_moe_flags_are_refused_where_they_mean_nothing(argv, message):
    with pytest.raises(KitError, match=message) as err:
        parse_config(argv)
    assert "\n" not in str(err.value)


def test_moe_flags_are_taken_with_a_moe_model_and_their_defaults_with_any():
    cfg = parse_config(["--task", "1", "--model_name_or_path", "tiny-moe", "--num_experts", "8", "--top_k", "2",
                        "--capacity_factor", "0", "--aux_loss_coef", "0"])
    assert (cfg.num_experts, cfg.top_k, cfg.capacity_factor, cfg.aux_loss_coef) == (8, 2, 0.0, 0.0)
    # the defaults, given or not, say nothing about the model: a plain BERT takes them
    parse_config(["--task", "1", "--model_name_or_path", "tiny", "--num_experts", "4", "--top_k", "1"])
    cfg = parse_config(["--task", "12", "--model_name_or_path", "tiny-moe", "--world_size", "4", "--spawn",
                        "--ep_size", "2"])
    assert cfg.ep_size == 2
