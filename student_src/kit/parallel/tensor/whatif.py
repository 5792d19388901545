"""What if: where tensor parallelism's ranks sit (Task 10), TP inside a node against TP across nodes.

TP x DP on T x D ranks sends two kinds of bytes per step (``traffic.tp_calls``):

* in each TP group, per encoder layer, 2 all_reduces of the activations forward and 2 of their
  gradients backward, b x s x h x 4 bytes each (b: a replica's rows), every one in the critical path;
* in each DP group, one all_reduce per gradient tensor of a rank's model (the embeddings whole, the
  cut layers' 1/T), after backward.

One of the two groups crosses the slow link between nodes, the other stays on a node's fast one (its
loopback, or NVLink): the placement decides which. Per step, with compute profiled on this machine
(``profile_tp``: one thread, the whole model, the encoder layers' part divided by T):

    step = (rest + layers / T) / share + 4 L c_tp(b s h 4) + sum_g c_dp(g) + optimizer / share

``c``: a ring all_reduce on the group's link (``LinkModel.allreduce_s``); ``flows``: how many groups
cross one node's link at once (2 ranks per node: 2), each getting its share of the bandwidth;
``share``: the fraction of a core a rank gets (C / ranks when the ranks share C cores, C / the load
average when other programs run too).

    from student_src.kit.parallel.tensor.whatif import profile_tp, compare

A ``link`` is a ``whatif/link.py`` ``LinkModel`` (the what-if command builds it; this room sits below
``whatif/`` and only reads its ``latency_s``, ``bytes_per_s``, ``bandwidth_bps`` and ``allreduce_s``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from student_src.kit.core.models import load_model
from student_src.kit.errors import KitError
from student_src.kit.parallel.tensor.provided import encoder_layers


@dataclass(frozen=True)
class TPProfile:
    """One replica's step on one core, uncut: the encoder layers' forward + backward, the rest's
    (embeddings, head, loss), AdamW over the whole model; the sizes TP's bytes follow from."""
    layers_s: float
    rest_s: float
    optimizer_s: float
    layers: int
    rows: int
    seq_len: int
    hidden: int
    cut_numel: int          # parameters TP cuts (Q, K, V, the MLP's first layer by rows, the outputs by columns)
    whole_numel: int        # parameters every TP rank holds whole
    tensors: int            # gradient tensors (one DP all_reduce each)

    def activation_bytes(self) -> int:
        return self.rows * self.seq_len * self.hidden * 4

    def grad_bytes(self, tp: int) -> float:
        return 4 * (self.whole_numel + self.cut_numel / tp)


def is_cut(name: str) -> bool:
    """A parameter TP cuts (layers.cut_dims finds them by shape; BERT names them so)."""
    return ".attention.self." in name or ".intermediate.dense." in name or name.endswith("output.dense.weight")


def profile_tp(model_name: str, rows: int, seq_len: int, repeats: int = 10) -> TPProfile:
    """Time ``model_name`` uncut on this machine, one thread, a batch of ``rows`` x ``seq_len``: the whole
    model's forward + backward, the encoder layers' alone (fed hidden states of that shape, backward
    from ones), the difference is the rest; and an AdamW step over all parameters. The fastest of
    ``repeats``: a core of its own (other programs' load goes into ``share``, not the profile)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = load_model(model_name, num_labels=2)
        model.train()
        g = torch.Generator().manual_seed(0)
        batch = {"input_ids": torch.randint(0, model.config.vocab_size, (rows, seq_len), generator=g),
                 "attention_mask": torch.ones(rows, seq_len, dtype=torch.long),
                 "token_type_ids": torch.zeros(rows, seq_len, dtype=torch.long),
                 "labels": torch.randint(0, 2, (rows,), generator=g)}
        layers = encoder_layers(model)
        hidden = model.config.hidden_size
        whole, part = [], []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            model(**batch).loss.backward()
            whole.append(time.perf_counter() - t0)
            x = torch.randn(rows, seq_len, hidden, generator=g, requires_grad=True)
            t0 = time.perf_counter()
            h = x
            for layer in layers:
                out = layer(h)
                h = out[0] if isinstance(out, tuple) else out
            h.backward(torch.ones_like(h))
            part.append(time.perf_counter() - t0)
        layers_s, whole_s = min(part[1:]), min(whole[1:])
        try:  # the kit's AdamW is the fused kernel where torch has it (train/optim.py)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        except (RuntimeError, TypeError):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        steps = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            opt.step()
            steps.append(time.perf_counter() - t0)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        cut = sum(p.numel() for n, p in named if is_cut(n))
        total = sum(p.numel() for _, p in named)
    finally:
        torch.set_num_threads(threads)
    return TPProfile(layers_s, max(0.0, whole_s - layers_s), min(steps[1:]), len(layers), rows, seq_len,
                     hidden, cut, total - cut, len(named))


def shared(link, flows: int):
    """``link`` as each of ``flows`` groups sending over it at once sees it."""
    return replace(link, bandwidth_bps=link.bandwidth_bps / max(1, flows))


def tp_step(profile: TPProfile, tp: int, dp: int, tp_link, dp_link, share: float = 1.0) -> dict:
    """Predicted seconds of one TP ``tp`` x DP ``dp`` step (the module docstring's model), with its
    parts; the links as each group sees them (``shared`` when several groups cross one link)."""
    if tp < 1 or dp < 1 or not 0 < share <= 1:
        raise KitError(f"tp and dp must be at least 1 and 0 < share <= 1, got {tp}, {dp}, {share}")
    cut_frac = profile.cut_numel / max(1, profile.cut_numel + profile.whole_numel)
    compute = (profile.rest_s + profile.layers_s / tp) / share
    optimizer = profile.optimizer_s * (1 - cut_frac + cut_frac / tp) / share
    tp_comm = 4 * profile.layers * tp_link.allreduce_s(profile.activation_bytes(), tp) + tp_link.allreduce_s(4, tp)
    grads = profile.grad_bytes(tp)
    dp_comm = 0.0 if dp <= 1 else (profile.tensors * 2 * (dp - 1) * dp_link.latency_s
                                   + 2 * (dp - 1) / dp * grads / dp_link.bytes_per_s)
    total = compute + tp_comm + dp_comm + optimizer
    return {"total_s": total, "compute_s": compute, "tp_comm_s": tp_comm, "dp_comm_s": dp_comm,
            "optimizer_s": optimizer, "tp_bytes_per_step": 4 * profile.layers * profile.activation_bytes(),
            "dp_bytes_per_step": grads if dp > 1 else 0.0}


def compare(profile: TPProfile, tp: int, dp: int, fast, slow, ranks_per_node: int = None,
            share: float = 1.0) -> dict:
    """TP ``tp`` x DP ``dp`` with ``ranks_per_node`` ranks on each node (default ``tp``): TP inside the
    nodes (TP on ``fast``, DP across on ``slow``) against TP across them (TP on ``slow``, DP inside on
    ``fast``): either way each of a node's ranks is in another group crossing the node's slow link at
    once (``shared``), while its fast link carries one group. ``best``: the faster placement."""
    slow = shared(slow, ranks_per_node or tp)
    rows = {"TP inside nodes": tp_step(profile, tp, dp, fast, slow, share),
            "TP across nodes": tp_step(profile, tp, dp, slow, fast, share)}
    return {"rows": rows, "best": min(rows, key=lambda k: rows[k]["total_s"])}
