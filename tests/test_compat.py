"""The version switches of ``student_src/kit/core/compat.py`` (issue 37): BERT's layer mask without
a private transformers API, the agent-store environment of the student's init, the private
``_set_pg_timeout`` with its fallback, and the one-line refusals of flags a torch cannot run.
``make compat`` (noxfile.py) runs the kit itself on the other torch / transformers versions."""

import datetime
import os

import pytest
import torch
import torch.distributed as dist

from student_src.kit.core import compat
from student_src.kit.core.config import parse_config
from student_src.kit.errors import KitError
from student_src.kit.ranks import process_group
from student_src.kit.parallel.pipeline import provided as pipeline_helpers


# ------------------------------------------------------------------ the BERT layer mask
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_the_stage_with_the_kits_mask_gives_the_models_own_logits(impl):
    """A one-stage BertStage (embeddings, every layer with compat.bert_layer_mask, pooler,
    classifier) against BertForSequenceClassification's own forward, with padding in the batch."""
    from transformers import AutoModelForSequenceClassification, BertConfig

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=24, max_position_embeddings=32, num_labels=2,
                        initializer_range=0.5)  # large weights: padding changes the logits visibly
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation=impl).eval()
    ids = torch.randint(1, 50, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, 5:] = 0
    mask[2, 2:] = 0
    ids[mask == 0] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    stage = pipeline_helpers.BertStage(model, range(config.num_hidden_layers), first=True, last=True)
    with torch.no_grad():
        want = model(**batch).logits
        got = stage.run((), batch)
    assert compat.attn_implementation(model.config) == impl
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    # padding matters here: the same stage with no mask at all gives other logits
    with torch.no_grad():
        unmasked = stage.run((), {**batch, "attention_mask": torch.ones_like(mask)})
    assert not torch.allclose(unmasked, want, atol=1e-2)


def test_the_mask_is_additive_zero_for_tokens_and_the_dtype_minimum_for_padding():
    cfg = type("C", (), {"_attn_implementation": "sdpa"})()
    m = compat.bert_layer_mask(cfg, torch.tensor([[1, 1, 0]]), torch.float32)
    assert m.shape == (1, 1, 1, 3) and m.dtype == torch.float32
    assert m[0, 0, 0].tolist() == [0.0, 0.0, torch.finfo(torch.float32).min]
    flash = type("C", (), {"_attn_implementation": "flash_attention_2"})()
    two_d = torch.tensor([[1, 0]])
    assert compat.bert_layer_mask(flash, two_d, torch.float16) is two_d
    assert compat.attn_implementation(object()) == "eager"


def test_no_private_transformers_mask_api_is_called(monkeypatch):
    """pipeline_helpers no longer reaches for BertModel._create_attention_masks (5.24's signature)."""
    import inspect

    assert "_create_attention_masks" not in inspect.getsource(pipeline_helpers)


# ------------------------------------------------------------------ the agent store's environment
def test_agent_store_env_sets_master_addr_and_port_and_restores_them(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.9")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    with compat.agent_store_env("127.0.0.1", 29123):
        assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("127.0.0.1", "29123")
    assert os.environ["MASTER_ADDR"] == "10.0.0.9"
    assert "MASTER_PORT" not in os.environ and "TORCHELASTIC_USE_AGENT_STORE" not in os.environ


def test_agent_store_env_restores_after_an_error(monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "1234")
    with pytest.raises(RuntimeError):
        with compat.agent_store_env("127.0.0.1", 5678):
            raise RuntimeError("boom")
    assert os.environ["MASTER_PORT"] == "1234"


def test_the_students_init_sees_the_stores_address_during_the_call_only(monkeypatch):
    """student_init (spawn mode, agent_store=True): the student's init_distributed runs with
    TORCHELASTIC_USE_AGENT_STORE and MASTER_ADDR/MASTER_PORT naming the launcher's store (torch
    2.15 honours the flag only then), and the environment is as before afterwards."""
    seen = {}

    def init_distributed(host, port, world_size, rank, backend=None, timeout_s=60):
        seen.update({k: os.environ.get(k) for k in ("TORCHELASTIC_USE_AGENT_STORE", "MASTER_ADDR", "MASTER_PORT")})
        raise NotImplementedError("TODO(task 0)")

    monkeypatch.setattr(process_group.student_api, "init_distributed", lambda: init_distributed)
    monkeypatch.setattr(process_group, "note_task0_todo", lambda: None)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "7")
    before = dict(os.environ)
    assert process_group.student_init("127.0.0.1", 29555, 0, 2, "gloo", 5.0, agent_store=True) is False
    assert seen == {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    assert dict(os.environ) == before
    seen.clear()
    process_group.student_init("127.0.0.1", 29555, 0, 2, "gloo", 5.0, agent_store=False)
    assert seen == {"TORCHELASTIC_USE_AGENT_STORE": None, "MASTER_ADDR": None, "MASTER_PORT": "7"}


# ------------------------------------------------------------------ private torch API with a fallback
def test_set_pg_timeout_uses_torchs_private_setter_or_does_nothing(monkeypatch):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        monkeypatch.delattr(dist, "set_timeout", raising=False)  # torch < 2.14: the private setter
        assert compat.set_pg_timeout(datetime.timedelta(seconds=321)) is True
        monkeypatch.delattr(dist.distributed_c10d, "_set_pg_timeout", raising=False)
        assert compat.set_pg_timeout(datetime.timedelta(seconds=321)) is False  # torch without it: a no-op
    finally:
        dist.destroy_process_group()


def test_set_pg_timeout_prefers_the_public_set_timeout_where_torch_has_it(monkeypatch):
    """torch >= 2.14: ``dist.set_timeout``; the private setter (deprecated there, with a
    FutureWarning) is not called."""
    called = []
    monkeypatch.setattr(dist, "set_timeout", lambda timeout, group=None: called.append((timeout, group)),
                        raising=False)

    def private(*a, **kw):
        raise AssertionError("the deprecated private setter was called")

    monkeypatch.setattr(dist.distributed_c10d, "_set_pg_timeout", private, raising=False)
    t = datetime.timedelta(seconds=123)
    assert compat.set_pg_timeout(t) is True and called == [(t, None)]


def test_dcp_gets_no_dist_only_where_its_signature_takes_it():
    import torch.distributed.checkpoint as dcp

    def save_26(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None, process_group=None):
        pass  # torch 2.6's signature

    assert compat.dcp_no_dist(save_26, True) == {}
    assert compat.dcp_no_dist(lambda state_dict, *, checkpoint_id=None, no_dist=False: None, True) == {"no_dist": True}
    assert ("no_dist" in compat.dcp_no_dist(dcp.save, False)) == (compat.torch_version() >= (2, 7))  # 2.6: not yet


def test_torch_version_reads_local_builds(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    assert compat.torch_version() == (2, 6)
    monkeypatch.setattr(torch, "__version__", "2.15.0a0+git1234")
    assert compat.torch_version() == (2, 15)


# ------------------------------------------------------------------ one-line refusals
REFUSED = [
    (["--task", "7", "--torch_sharding"], "fsdp2", "--torch_sharding needs torch >= 2.7"),
    (["--task", "10", "--tp_size", "2", "--torch_tp"], "torch_tp", "--torch_tp needs torch >= 2.7"),
    (["--task", "9", "--torch_pipelining"], "torch_pipelining", "--torch_pipelining needs torch >= 2.13"),
    (["--task", "10", "--tp_size", "2", "--sequence_parallel"], "sequence_parallel", "--sequence_parallel needs torch >= 2.8"),
]


@pytest.mark.parametrize("argv,feature,line", REFUSED, ids=[r[1] for r in REFUSED])
def test_a_flag_this_torch_cannot_run_is_refused_in_one_line(monkeypatch, argv, feature, line):
    cfg = parse_config(argv + ["--world_size", "2", "--spawn"])
    if compat.features()[feature]:
        assert compat.refusal(cfg) is None  # this torch runs it
    monkeypatch.setattr(compat, "features", lambda device_type="cpu": {**dict.fromkeys(
        ("fsdp2", "torch_tp", "torch_pipelining", "sequence_parallel"), True), feature: False})
    said = compat.refusal(cfg)
    assert said.startswith(line) and "\n" not in said and torch.__version__ in said
    with pytest.raises(KitError, match=line):
        compat.check_flags(cfg)


def test_task6_torch_sharding_is_zero_and_never_refused(monkeypatch):
    monkeypatch.setattr(compat, "features", lambda device_type="cpu": dict.fromkeys(
        ("fsdp2", "torch_tp", "torch_pipelining", "sequence_parallel"), False))
    assert compat.refusal(parse_config(["--task", "6", "--torch_sharding", "--world_size", "2", "--spawn"])) is None
    assert compat.refusal(parse_config(["--task", "3", "--world_size", "2", "--spawn"])) is None


def test_run_refuses_before_any_rank_starts(monkeypatch, tmp_path):
    from student_src.kit.train import start

    monkeypatch.setattr(compat, "features", lambda device_type="cpu": dict.fromkeys(
        ("fsdp2", "torch_tp", "torch_pipelining", "sequence_parallel"), False))
    monkeypatch.setattr(start.klaunch, "launch", lambda *a, **k: pytest.fail("a rank was started"))
    cfg = parse_config(["--task", "10", "--tp_size", "2", "--torch_tp", "--world_size", "2", "--spawn",
                        "--model_name_or_path", "tiny", "--output_dir", str(tmp_path / "out")])
    with pytest.raises(KitError, match="--torch_tp needs torch >= 2.7"):
        start.run(cfg)


def test_fsdp2_on_a_gpu_does_not_need_the_cpu_streams_event(monkeypatch):
    compat.has_fsdp2.cache_clear()
    try:
        monkeypatch.delattr(torch.cpu.Stream, "record_event", raising=False)
        assert compat.has_fsdp2("cpu") is False and compat.has_fsdp2("cuda") is True
    finally:
        compat.has_fsdp2.cache_clear()


def test_init_optim_state_fallback_makes_adamws_entries_without_moving_anything(monkeypatch):
    import torch.distributed.checkpoint.state_dict as sd

    for private in (True, False):
        if not private:
            monkeypatch.delattr(sd, "_init_optim_state")
        lin = torch.nn.Linear(3, 2)
        before = [p.detach().clone() for p in lin.parameters()]
        opt = torch.optim.AdamW(lin.parameters(), lr=0.1, weight_decay=0.5)
        compat.init_optim_state(opt)
        assert all(set(opt.state[p]) >= {"exp_avg", "exp_avg_sq", "step"} for p in lin.parameters())
        assert all(torch.equal(a, b) for a, b in zip(before, lin.parameters()))
        assert opt.param_groups[0]["lr"] == 0.1 and all(p.grad is None for p in lin.parameters())
