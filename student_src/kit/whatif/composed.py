"""The parallelisms composed, on paper: memory per rank, bytes per axis and the step's time of one layout
(DP x TP x PP x CP x EP, a ZeRO stage, micro-batches, virtual stages, recomputation) of a model shape on a
cluster (``shapes.py``). The planner (``plan.py``) evaluates many; each axis divides what it divides:

* **memory per rank** (the busiest: the first stage, which holds the most micro-batches in flight, or the
  last, which holds the head and the logits). Parameters: a stage's share of the layers (``stage_layers``:
  the last takes fewer when its head weighs), TP cutting every matrix (``/ tp``; the norms whole), EP the
  experts (``/ ep``, and TP cuts them too, as Megatron's expert tensor parallelism does by default), the
  embeddings on the first stage and the head on the last (vocabulary-parallel, ``/ tp``, unless
  ``Layout.vocab_parallel`` is off; a tied head copied there when PP parts it from the embeddings). Their gradients and optimizer state come
  from ``measure/memory_model.per_rank``: ZeRO stage 0/1/2/3 = ``ddp``/``zero1``/``zero2``/``fsdp`` over the
  replicas of that shard, DP x CP ranks (CP ranks hold equal weights; Megatron's distributed optimizer
  shards over both), the experts over DP x CP / EP; ZeRO-3 adds one layer gathered whole. Activations:
  per token and layer the tensors autograd keeps (``activation_elements``), ``/ tp`` (sequence
  parallelism keeps even the norms' inputs cut), for ``s / cp`` tokens a rank, times the micro-batches a
  stage holds at once (``parallel/pipeline/memory.pipeline_held``: 1F1B's first stage ``min(pp, m)``;
  interleaved with ``v`` virtual stages ``x (1 + (pp - 1) / (pp v))``, Korthikanti et al. 2022, §4.2.3);
  without flash attention what ``parallel/context/memory.attention_bytes`` says attention keeps (plain
  attention's ``s x s`` probabilities; ring attention's output and statistics); the last stage the
  logits (fp32, and their gradient: 8 bytes each, ``/ tp``).
* **bytes per axis** one rank sends per step: TP 4 all_reduces of ``b (s / cp) h`` per layer and
  micro-batch (``parallel/tensor/traffic.tp_calls``; Megatron-SP's all_gather + reduce_scatter move the
  same on a ring), 2 more with full recomputation; CP ring attention's blocks
  (``parallel/context/traffic.sent``, K and V of the key/value heads on this TP rank; with
  ``cp_attention="allgather"`` its all-gathers and reduce-scatters); EP the all-to-alls
  (``parallel/expert/traffic.uniform_layer_bytes``: a uniform router); PP a micro-batch's hidden states
  across each boundary and their gradient back (``/ tp``: each TP rank sends its sequence chunk); DP the
  gradients' reduce-scatter and the parameters' all-gather (ZeRO 1/2; an all_reduce for ZeRO-0; ZeRO-2/3 keep
  1/n of the gradients, so they reduce-scatter each micro-batch's; ZeRO-3 also gathers the parameters for
  each micro-batch's forward and backward). Ring collectives: an
  all_reduce sends ``2 (n - 1) / n`` of the bytes, a reduce-scatter or all-gather half that.
* **the step**: a micro-batch's forward on the busiest stage is its FLOPs (``2`` per parameter a token
  meets, ``4 s h`` per layer for attention, PaLM's count) ``/ (tp cp)`` at ``compute_efficiency`` of the
  GPU's peak, plus its memory-bound kernels (the norms, residual adds, rotary embeddings, the activation
  function, the loss over the vocabulary: ``elementwise.py``) at the GPU's memory bandwidth, plus the
  exposed TP (all of it: it sits on the critical path; Korthikanti et al. 2022's sequence parallelism
  swaps each all_reduce for an all-gather and a reduce-scatter of the same bytes and describes no overlap
  of them with the matmuls, and the Llama 3 paper names none), CP
  (block by block, what each of the ring's ``cp - 1`` transfers, at its link, lasts beyond the attention
  of one block) and EP communication; backward twice the FLOPs (three times with
  full recomputation; selective recomputation moves the norms' and the activation function's bytes
  again). The schedule is ``parallel/pipeline/whatif.pipeline_iteration``'s, the other axes
  inside each stage: interleaving ``v`` virtual stages is ``m v`` chunks of ``1 / v`` of a stage, so the
  bubble is ``(pp - 1) / v`` of a micro-batch's work. Its time with the PP link free is compute + exposed
  in-stage communication + the bubble; the rest is PP's. DP's reduce-scatter overlaps the last
  micro-batch's backward (ZeRO-2/3: each micro-batch's its own) and its all-gather the next step's first forward (Megatron's overlapped grad
  reduce and param gather): only what exceeds them is exposed. The optimizer reads and writes 28 bytes
  per parameter it owns at the GPU's memory bandwidth.
* **MFU**: the model's FLOPs (``6`` per parameter and token plus attention's ``12 L s h``, recomputation
  not counted) over the step time and the cluster's peak.
* **causal masking**: attention is priced unmasked (PaLM's ``4 s h`` per layer forward) on every rank.
  With CP this is a plain ring's pace: its last rank's blocks all lie at or below the diagonal, so it
  computes every block (the first rank one), and the step waits for it; a zig-zag ring would balance
  the ranks, as a masked kernel would halve attention at CP 1 too: neither is modelled.

Rank order: the kit's one mesh's (``parallel/mesh.ORDER``, Llama 3's [TP, CP, PP, DP], innermost first):
TP on the fastest link (its traffic is the largest and on the critical path), then CP, then PP, DP
outermost (one gradient average a step, overlapped with backward); EP splits DP, its inner part. A group
stays on a node's link when its extent (the stride of its outermost axis times that axis's size) fits a
node, else it crosses the network at the GPU's own NIC bandwidth.

Calibration, documented constants only: ``COMPUTE_EFFICIENCY`` (the fraction of peak the matmuls reach)
and the links' ``GLOO_EFFICIENCY`` (the kit's measured fraction of a link its collectives reach, reused
for NCCL as an assumption); nothing is fitted to a published layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from student_src.kit.errors import KitError
from student_src.kit.measure import memory_model
from student_src.kit.parallel.context.memory import attention_bytes
from student_src.kit.parallel.context.traffic import sent as cp_sent
from student_src.kit.parallel.expert.traffic import uniform_layer_bytes
from student_src.kit.parallel.mesh import ORDER as MESH_ORDER, ParallelDims
from student_src.kit.parallel.pipeline.memory import pipeline_held
from student_src.kit.parallel.pipeline.whatif import StageProfile, pipeline_iteration
from student_src.kit.parallel.tensor.traffic import tp_calls
from student_src.kit.whatif import elementwise
from student_src.kit.whatif.link import GLOO_EFFICIENCY, LinkModel
from student_src.kit.whatif.shapes import Cluster, ModelShape

#: the fraction of a GPU's dense peak the model's matmuls reach: FlashAttention-3 (Shah et al. 2024, the
#: abstract) reaches 740 TFLOP/s in FP16 on an H100, 75% of its 989 TFLOP/s, the best kernels' figure;
#: an assumption for every FLOP of the step (``--compute_efficiency`` changes it)
COMPUTE_EFFICIENCY = 0.75
#: what the allocator, the CUDA context and NCCL's buffers leave of a GPU's memory (an assumption)
USABLE_MEMORY = 0.9
#: bytes an AdamW step reads and writes per parameter it owns (gradient, master weight, two moments, the
#: 16-bit copy): at the GPU's memory bandwidth
OPTIMIZER_BYTES = 28
#: the fp32 logits and their gradient, per vocabulary entry and token, on the last stage
LOGIT_BYTES = 8
ZERO_STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")
RECOMPUTE = ("none", "selective", "full")
CP_ATTENTION = ("ring", "allgather")
#: rank order, innermost first: the kit's mesh's (``parallel/mesh.ORDER`` lists it outermost first)
ORDER = tuple(reversed(MESH_ORDER))


@dataclass(frozen=True)
class Layout:
    """One way to run: the degrees (``dp * tp * pp * cp`` GPUs; ``ep`` divides ``dp``), the ZeRO stage over
    DP x CP, ``micro_batch`` sequences per micro-batch, ``virtual`` stages per PP rank (interleaved 1F1B;
    1: plain 1F1B) and ``recompute`` (none, selective: the norms' and activation functions' outputs
    rebuilt in backward, and the scores without flash attention; full: only each layer's input kept);
    ``vocab_parallel``: TP cuts the embeddings and the head too (Megatron's; the kit's Task 10 with
    ``--vocab_parallel``), else every TP rank holds them whole; ``cp_attention``: CP as ring attention
    (blocks overlapped with attention, Megatron's) or ``allgather`` (K and V gathered before attention, dK
    and dV reduce-scattered after, exposed: the Llama 3 paper's CP, §3.3.2); ``sync_calls``: the collectives
    a rank's gradient sync is cut into, each paying its ring's latencies (1: one fused bucket, the planner's;
    the kit's Tasks 2b and 14 send one per parameter tensor: the busiest stage's tensors)."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 1
    micro_batch: int = 1
    virtual: int = 1
    recompute: str = "none"
    vocab_parallel: bool = True
    cp_attention: str = "ring"
    sync_calls: int = 1

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def mesh(self) -> tuple:
        return (self.dp, self.tp, self.pp, self.cp, self.ep)

    def label(self) -> str:
        parts = [f"TP {self.tp}", f"CP {self.cp}", f"PP {self.pp}", f"DP {self.dp}"]
        return " x ".join(parts) + (f" (EP {self.ep})" if self.ep > 1 else "")


@dataclass(frozen=True)
class Workload:
    """What one step trains: ``seq`` tokens a sequence, ``global_batch`` sequences; ``precision``
    ``mixed`` (bf16 compute, fp32 master weights and AdamW) or ``fp32``."""
    seq: int
    global_batch: int
    precision: str = "mixed"

    @property
    def tokens(self) -> int:
        return self.seq * self.global_batch

    @property
    def act_bytes(self) -> int:
        return memory_model.get_precision(self.precision).param_bytes


def check(shape: ModelShape, cluster: Cluster, layout: Layout, work: Workload) -> str:
    """Why ``layout`` cannot run at all ('' when it can): the mesh's refusal of the degrees, then the model's
    and the batch's divisibility rules."""
    L = layout
    try:  # the degrees themselves: the kit's mesh refuses them as it refuses a run's
        ParallelDims(cluster.gpus, L.dp, L.pp, L.cp, L.tp, L.ep)
    except KitError as exc:
        return str(exc)
    if min(L.micro_batch, L.virtual, L.sync_calls) < 1:
        return "the micro-batch, the virtual stages and the sync's calls must be at least 1"
    if shape.heads % L.tp:
        return f"TP {L.tp} does not divide the {shape.heads} attention heads"
    if L.pp > shape.layers:
        return f"PP {L.pp} is more stages than the {shape.layers} layers"
    if work.seq % L.cp:
        return f"CP {L.cp} does not divide the {work.seq}-token sequence"
    if L.ep > 1 and (not shape.experts or shape.experts % L.ep):
        return f"EP {L.ep} must divide the model's {shape.experts} experts"
    if work.global_batch % (L.dp * L.micro_batch):
        return f"the global batch of {work.global_batch} sequences does not split into DP {L.dp} x micro-batches of {L.micro_batch}"
    if L.virtual > 1 and (L.pp == 1 or math.ceil(shape.layers / L.pp) % L.virtual
                          or (work.global_batch // (L.dp * L.micro_batch)) % L.pp):
        return "interleaving needs PP > 1, virtual stages dividing a stage's layers and micro-batches a multiple of PP"
    if L.cp_attention not in CP_ATTENTION:
        return f"CP attention is one of {', '.join(CP_ATTENTION)}, got {L.cp_attention!r}"
    if L.zero not in range(4) or L.recompute not in RECOMPUTE:
        return f"ZeRO is 0-3 and recompute one of {', '.join(RECOMPUTE)}"
    return ""


@lru_cache(maxsize=None)
def stage_layers(shape: ModelShape, pp: int) -> tuple[int, int]:
    """(layers of the first / middle stages, layers of the last one): the last stage also runs the head,
    so it takes fewer layers when that balances them (Llama 3 moved a layer off its first and last
    stages for this); the heaviest stage sets the pace."""
    if pp == 1:
        return shape.layers, shape.layers
    head = (shape.vocab * shape.hidden if shape.lm_head else 0) / max(1, shape.dense_params_per_layer + shape.expert_params_per_layer)
    best = None
    for k in range(math.ceil(shape.layers / pp), shape.layers + 1):
        last = max(0, shape.layers - (pp - 1) * k)
        load = max(k, last + head)
        if best is None or load < best[0]:
            best = (load, k, last)
        if last + head <= k:
            break
    return best[1], best[2]


def group_links(cluster: Cluster, layout: Layout) -> dict:
    """Each axis's link (``LinkModel``): on a node's when its group fits in one (``ORDER``), else the network."""
    fast = LinkModel(cluster.intra_bytes_per_s * 8, cluster.intra_latency_s, GLOO_EFFICIENCY)
    slow = LinkModel(cluster.inter_bytes_per_s * 8, cluster.inter_latency_s, GLOO_EFFICIENCY)
    sizes = {"tp": layout.tp, "cp": layout.cp, "dp": layout.dp, "pp": layout.pp}
    extent, stride = {}, 1
    for axis in ORDER:
        stride *= sizes[axis]
        extent[axis] = stride
    # DP x CP (the gradients' group) reaches as far as its outer axis; EP is DP's inner part
    extent["dpcp"] = max(extent["dp"], extent["cp"]) if layout.dp > 1 else extent["cp"]
    extent["ep"] = extent["dp"] // layout.dp * layout.ep
    return {axis: fast if reach <= cluster.gpus_per_node else slow for axis, reach in extent.items()}


def activation_elements(shape: ModelShape, recompute: str) -> float:
    """Elements autograd keeps per token and layer, before TP cuts them: the two norms' inputs and outputs
    (4h), Q and the output (2h), K and V (2 kv), the MLP's gate, up, activation and product (4f; a plain
    MLP its input and activation, 2f), f the width times the experts a token meets. Selective: the
    norms' outputs and the activation functions' outputs rebuilt (2h and 2f, f for a plain MLP); full:
    the layer's input alone."""
    h, kv, f = shape.hidden, shape.kv_dim, shape.ffn * (shape.top_k if shape.experts else 1)
    mlp = 4 if shape.gated else 2
    if recompute == "none":
        return 6 * h + 2 * kv + mlp * f
    if recompute == "selective":
        return 4 * h + 2 * kv + mlp / 2 * f
    return h


def forward_flops_per_token(shape: ModelShape, layers: float, seq: int, head: bool) -> float:
    """2 per matmul parameter a token meets (the experts it is routed to) and ``4 s h`` per layer for
    attention's two products (PaLM's count: causal masking not subtracted), plus the head."""
    per_layer = 2 * (shape.attention_params + shape.mlp_params * (shape.top_k if shape.experts else 1)
                     + (shape.hidden * shape.experts if shape.experts else 0)) + 4 * seq * shape.hidden
    return layers * per_layer + (2 * shape.vocab * shape.hidden if head and shape.lm_head else 0)


def model_flops(shape: ModelShape, work: Workload) -> float:
    """The model's FLOPs per step for MFU: 3 x the forward, every token (recomputation not counted)."""
    return 3 * forward_flops_per_token(shape, shape.layers, work.seq, True) * work.tokens


def stage_params(shape: ModelShape, layout: Layout) -> tuple:
    """``(stage, layers, dense, experts)`` of the first and the last stage's ranks: the parameters one rank
    holds, TP cutting every matrix (the norms whole), EP the experts, the embeddings on the first stage,
    the head on the last (both vocabulary-parallel)."""
    return _stage_params(shape, layout.pp, layout.tp, layout.ep, layout.vocab_parallel)


@lru_cache(maxsize=None)
def _stage_params(shape: ModelShape, pp: int, tp: int, ep: int, vocab_parallel: bool) -> tuple:
    first, last = stage_layers(shape, pp)
    vocab_tp = tp if vocab_parallel else 1
    layer_dense = (shape.dense_params_per_layer - shape.norm_params) / tp + shape.norm_params
    layer_experts = shape.expert_params_per_layer / (ep * tp)
    out = []
    for stage, layers in ((0, first), (pp - 1, last)):
        dense = layers * layer_dense + ((shape.embedding_params / vocab_tp + shape.other_params) if stage == 0 else 0)
        # the head: its own matrix, or with tied embeddings a copy on the last stage when PP cuts them apart
        head = shape.head_params if not shape.tied else (shape.embedding_params if shape.lm_head and pp > 1 else 0)
        dense += head / vocab_tp + shape.hidden if stage == pp - 1 else 0  # and the final norm
        out.append((stage, layers, dense, layers * layer_experts))
    return tuple(out)


@lru_cache(maxsize=4096)
def _states(strategy: str, n: int, params: float, precision: str) -> dict:
    """``memory_model.per_rank``'s first rank (all equal: Ψ cut evenly); cached, as the planner asks the
    same shard on many layouts and ``per_rank`` builds a row for every one of ``n`` ranks."""
    row = memory_model.per_rank(strategy, n, params=params, precision=precision)[0]
    return {k: row[k] for k in ("params", "grads", "optimizer")}


def memory(shape: ModelShape, layout: Layout, work: Workload) -> dict:
    """Bytes on the busiest rank (the module docstring): ``params``, ``grads``, ``optimizer``, ``working_set``
    (ZeRO-3's gathered layer), ``activations``, ``peak``, and which ``stage`` it is."""
    L = layout
    micro_batches = work.global_batch // (L.dp * L.micro_batch)
    tokens = L.micro_batch * work.seq // L.cp
    strategy = ZERO_STRATEGIES[L.zero]
    prec = memory_model.get_precision(work.precision)
    rows = []
    for stage, layers, dense, experts in stage_params(shape, layout):
        states = _states(strategy, L.dp * L.cp, dense, prec.name)
        if experts:
            ex = _states(strategy, max(1, L.dp * L.cp // L.ep), experts, prec.name)
            states = {k: states[k] + ex[k] for k in ("params", "grads", "optimizer")}
        one_layer = (dense + experts) / max(1, layers)
        working = (prec.param_bytes + prec.grad_bytes) * one_layer if L.zero == 3 and L.dp * L.cp > 1 else 0
        held = pipeline_held("1f1b", stage, L.pp, micro_batches)
        if L.virtual > 1 and stage == 0:
            held *= 1 + (L.pp - 1) / (L.pp * L.virtual)
        per_layer = activation_elements(shape, L.recompute) / L.tp * tokens * work.act_bytes
        if not shape.flash and L.recompute == "none":
            per_layer += attention_bytes(L.micro_batch, max(1, shape.heads // L.tp), work.seq, shape.head_dim, L.cp,
                                         L.cp_attention if L.cp > 1 else "allgather", work.act_bytes)["saved"]
        acts = held * layers * per_layer
        if L.recompute == "full":  # one layer rebuilt whole at a time in backward
            acts += activation_elements(shape, "none") / L.tp * tokens * work.act_bytes
        if stage == L.pp - 1 and shape.lm_head:
            acts += LOGIT_BYTES * tokens * shape.vocab / (L.tp if L.vocab_parallel else 1)
        row = {"stage": stage, "params": states["params"], "grads": states["grads"], "optimizer": states["optimizer"],
               "working_set": working, "activations": acts}
        row["peak"] = row["params"] + row["grads"] + row["optimizer"] + working + acts
        rows.append(row)
    return max(rows, key=lambda r: r["peak"])


def _ring_half_s(link: LinkModel, nbytes: float, n: int) -> float:
    """A ring reduce-scatter or all-gather: half an all_reduce's rounds and bytes."""
    return link.allreduce_s(nbytes, n) / 2


def step(shape: ModelShape, cluster: Cluster, layout: Layout, work: Workload,
         compute_efficiency: float = COMPUTE_EFFICIENCY) -> dict:
    """One step's seconds split into ``compute_s`` (of which ``optimizer_s``, and ``memory_bound_s``: the
    memory-bound kernels' and the optimizer's), ``exposed_comm_s`` (per axis in ``comm_s_by_axis``),
    ``bubble_s``, their sum ``total_s``, the bytes one rank sends per axis (``bytes_by_axis``) and ``mfu``."""
    L, links = layout, group_links(cluster, layout)
    rate = cluster.flops * compute_efficiency
    first, last = stage_layers(shape, L.pp)
    m = work.global_batch // (L.dp * L.micro_batch)
    tokens = L.micro_batch * work.seq // L.cp
    a = work.act_bytes
    # the busiest stage's forward and backward per micro-batch: its FLOPs at the efficiency, its memory-bound
    # kernels at the memory's bandwidth (``elementwise.py``; TP and sequence parallelism cut their tokens)
    fwd_el, bwd_el = elementwise.forward_elements(shape, work.seq), elementwise.backward_elements(shape, work.seq)
    bwd_el += elementwise.recompute_elements(shape, L.recompute)
    vocab_tp = L.tp if L.vocab_parallel else 1

    def stage_s(n: int, head: bool) -> tuple:
        matmul = tokens * forward_flops_per_token(shape, n, work.seq, head) / L.tp / rate
        loss_f, loss_b = elementwise.loss_bytes(shape) if head else (0.0, 0.0)
        mem_f = tokens * (n * fwd_el * a / L.tp + loss_f / vocab_tp) / cluster.hbm_bytes_per_s
        mem_b = tokens * (n * bwd_el * a / L.tp + loss_b / vocab_tp) / cluster.hbm_bytes_per_s
        return matmul + mem_f, 2 * matmul + mem_b + (matmul + mem_f if L.recompute == "full" else 0.0), mem_f + mem_b

    f_c, b_c, mem_c = max(stage_s(first, L.pp == 1), stage_s(last, True), key=lambda t: t[0] + t[1])
    layers = max(first, last)
    if L.recompute == "selective" and not shape.flash:  # the scores rebuilt: attention's forward again
        b_c += tokens * layers * 4 * work.seq * shape.hidden / L.tp / rate
    # TP: the room's calls for one layer (4 all_reduces: 2 forward, 2 backward), 2 more with full recompute
    act = L.micro_batch * work.seq // L.cp * shape.hidden * a
    tp_layer = tp_calls(L.tp, L.tp, 1, act, [], clip=False) if L.tp > 1 else []
    tp_one = links["tp"].allreduce_s(act, L.tp)
    tp_f = layers * tp_one * len(tp_layer) / 2
    tp_b = tp_f * (2 if L.recompute == "full" else 1)
    tp_bytes = m * layers * (len(tp_layer) + (2 if L.recompute == "full" and tp_layer else 0)) * 2 * (L.tp - 1) / L.tp * act
    # CP: ring attention's blocks, overlapped with the attention they feed; or the all-gather's, exposed
    cp_f = cp_b = cp_bytes = 0.0
    if L.cp > 1 and L.cp_attention == "allgather":
        blocks = cp_sent(L.micro_batch, max(1, shape.kv_heads // L.tp), work.seq, shape.head_dim, L.cp, "allgather", a)
        link = links["cp"]
        gather_f = blocks["forward"] / link.bytes_per_s + (L.cp - 1) * link.latency_s
        cp_f = layers * gather_f
        cp_b = layers * (blocks["backward"] / link.bytes_per_s + (L.cp - 1) * link.latency_s
                         + (gather_f if L.recompute == "full" else 0.0))
        cp_bytes = m * layers * (blocks["forward"] + blocks["backward"])
    elif L.cp > 1:
        blocks = cp_sent(L.micro_batch, max(1, shape.kv_heads // L.tp), work.seq, shape.head_dim, L.cp, "ring", a)
        attn_f = tokens * 4 * work.seq * shape.hidden / L.tp / rate
        link = links["cp"]
        t_f = blocks["forward"] / link.bytes_per_s + (L.cp - 1) * link.latency_s
        t_b = blocks["backward"] / link.bytes_per_s + (2 * L.cp - 1) * link.latency_s
        # block by block: each of the cp - 1 transfers hides behind one block's attention (1 / cp of it) or
        # shows what it lasts beyond it; every block full, as the plain ring's last rank computes them
        steps, block_f = L.cp - 1, attn_f / L.cp
        ring_f = steps * max(0.0, t_f / steps - block_f)
        ring_b = steps * max(0.0, t_b / steps - 2 * block_f)
        cp_f = layers * ring_f
        cp_b = layers * (ring_b + (ring_f if L.recompute == "full" else 0.0))
        cp_bytes = m * layers * (blocks["forward"] + blocks["backward"])
    # EP: the all-to-alls of every MoE layer, on the critical path
    ep_f = ep_b = ep_bytes = 0.0
    if shape.experts and L.ep > 1:
        per_layer = uniform_layer_bytes(tokens // L.tp or 1, shape.top_k, L.ep, shape.hidden, shape.experts, a)
        ep_f = ep_b = layers * per_layer / 2 / links["ep"].bytes_per_s
        ep_bytes = m * layers * per_layer
    f, b = f_c + tp_f + cp_f + ep_f, b_c + tp_b + cp_b + ep_b
    # PP: the room's schedule, interleaving as m v chunks of 1/v of a stage
    v = L.virtual
    boundary = act / L.tp
    prof = StageProfile((f / v,) * L.pp, (b / v,) * L.pp, boundary, boundary, (0,) * L.pp, (0.0,) * L.pp)
    free = LinkModel(1e30, 0.0, 1.0)
    schedule = pipeline_iteration(prof, m * v, links["pp"])["schedule_s"]
    schedule_free = pipeline_iteration(prof, m * v, free)["schedule_s"]
    pp_bytes = 2 * m * v * boundary if L.pp > 1 else 0.0
    # DP x CP: the gradients of this rank's shard (and the experts' over their replicas): the slower stage's
    prec = memory_model.get_precision(work.precision)
    dense, expert_params = max((d, e) for _, _, d, e in stage_params(shape, layout))
    n, n_e = L.dp * L.cp, max(1, L.dp * L.cp // L.ep)
    grads, weights = dense * prec.grad_bytes, dense * prec.param_bytes
    link = links["dpcp"]
    rs = _ring_half_s(link, grads, n) + _ring_half_s(links["dp"], expert_params * prec.grad_bytes, n_e)
    ag = _ring_half_s(link, weights, n) + _ring_half_s(links["dp"], expert_params * prec.param_bytes, n_e)
    per_call = (L.sync_calls - 1) * (n - 1) * link.latency_s  # each further call its ring's rounds (ZeRO-0: twice)
    rs, ag = rs + per_call, ag + per_call
    syncs = m if L.zero >= 2 else 1  # accumulation_model's "every_micro_step": whole gradients are ZeRO-1's memory
    if L.zero == 0:
        dp_exposed = max(0.0, 2 * rs - b)
    else:
        dp_exposed = syncs * max(0.0, rs - b) + max(0.0, ag - f)
    rs_bytes = ((n - 1) / n * grads if n > 1 else 0.0) + ((n_e - 1) / n_e * expert_params * prec.grad_bytes if n_e > 1 else 0.0)
    dp_bytes = (1 + syncs) * rs_bytes  # the all-gather (or ZeRO-0's all_reduce's second half) moves as much again
    if L.zero == 3 and n > 1:  # every micro-batch gathers the weights for forward and again for backward
        dp_exposed += m * (max(0.0, ag - f) + max(0.0, ag - b))
        dp_bytes += 2 * m * (n - 1) / n * weights
    owned = (dense / (n if L.zero else 1)) + (expert_params / (n_e if L.zero else 1))
    optimizer = owned * OPTIMIZER_BYTES / cluster.hbm_bytes_per_s
    compute = m * (f_c + b_c) + optimizer
    memory_bound = m * mem_c + optimizer
    in_stage = m * (tp_f + tp_b + cp_f + cp_b + ep_f + ep_b)
    bubble = schedule_free - m * (f + b)
    pp_s = schedule - schedule_free
    total = schedule + dp_exposed + optimizer
    busy_fraction = m * (f + b) / schedule_free if schedule_free else 1.0
    return {
        "total_s": total, "compute_s": compute, "optimizer_s": optimizer, "memory_bound_s": memory_bound, "exposed_comm_s": in_stage + pp_s + dp_exposed, "bubble_s": bubble,
        "comm_s_by_axis": {"tp": m * (tp_f + tp_b), "cp": m * (cp_f + cp_b), "ep": m * (ep_f + ep_b), "pp": pp_s,
                           "dp": dp_exposed},
        "bytes_by_axis": {"tp": tp_bytes, "cp": cp_bytes, "ep": ep_bytes, "pp": pp_bytes, "dp": dp_bytes},
        "links": {axis: ("node" if links[axis].bandwidth_bps == cluster.intra_bytes_per_s * 8 else "network")
                  for axis in ("tp", "cp", "pp", "dpcp")},
        "micro_batches": m, "bubble_fraction": 1 - busy_fraction,
        "mfu": model_flops(shape, work) / (total * cluster.gpus * cluster.flops),
    }


def evaluate(shape: ModelShape, cluster: Cluster, layout: Layout, work: Workload,
             compute_efficiency: float = COMPUTE_EFFICIENCY, usable: float = USABLE_MEMORY) -> dict:
    """Everything about one layout: ``layout`` (its fields), ``memory`` (``memory()``), the ``step()``'s
    figures, ``feasible`` and, when not, ``why``."""
    why = check(shape, cluster, layout, work)
    if why:
        return {"layout": dict(vars(layout)), "feasible": False, "why": why}
    mem = memory(shape, layout, work)
    out = {"layout": dict(vars(layout)), "label": layout.label(), "memory": mem, "feasible": True, "why": ""}
    if mem["peak"] > usable * cluster.memory_bytes:
        out.update(feasible=False, why=f"needs {mem['peak'] / 1e9:.1f} GB per GPU, more than {usable:.0%} of "
                                       f"{cluster.memory_bytes / 1e9:.0f} GB")
        return out
    out.update(step(shape, cluster, layout, work, compute_efficiency))
    return out

