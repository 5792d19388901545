"""Task 10's traffic terms: what one step of tensor parallelism sends (``tp_calls``: the
activation all_reduces of Megatron's f and g per TP group and layer, or with sequence parallelism
their all_gather / reduce_scatter halves; the clip; the DP groups' gradient all_reduces), and
``traffic_of``, the ``--measure_traffic`` callable the setup hands the traffic meter."""

from __future__ import annotations

from student_src.kit.errors import KitError
from student_src.kit.parallel.tensor.provided import encoder_layers


def tp_calls(world_size: int, tp_size: int, layers: int, activation_nbytes: int, grad_nbytes: list[int],
             clip: bool = True, sequence_parallel: bool = False, sp_grad_nbytes: list[int] = (),
             vocab_parallel: bool = False) -> list[tuple]:
    """What one step of tensor parallelism (Task 10, ``student_src/tensor_parallel.py``) sends on
    ``world_size`` ranks as ``tp_size`` T ranks per TP group x D = world / T replicas (rank =
    replica * T + tp_rank), as ``(op, nbytes, ranks)``:

    * per TP group, per encoder layer: 2 all_reduces of activations forward (the g after the
      attention's output and after the MLP) and 2 backward (the f before Q, K, V and before the
      MLP), each of ``activation_nbytes`` (a replica's b rows x s tokens x hidden x 4 bytes): every
      layer, whatever its parameters;
    * per TP group, the clip's all_reduce of one float32 (the shards' squares; ``clip``);
    * with replicas, per DP group, each gradient of a rank's model all_reduced once (Task 2b's
      ``allreduce_average``): ``grad_nbytes``, the shards (1/T of each cut weight) and the
      replicated parameters.

    With ``sequence_parallel`` (Megatron-SP) each activation all_reduce becomes its two halves, per TP
    group and layer: forward 2 all_gathers of this rank's chunk (``activation_nbytes / T`` each: before
    Q, K, V and before the MLP) and 2 reduce_scatters of the whole ``activation_nbytes`` (after the two
    row-parallel layers), backward the same (the conjugates); at the encoder's edges 2 all_gathers of a
    chunk (the pooler's input forward, the embeddings' gradient backward); then the student's grad sync,
    one all_reduce per parameter used on a chunk only (``sp_grad_nbytes``: the LayerNorms, the
    row-parallel biases). On a ring an all_reduce is a reduce_scatter plus an all_gather, so the bytes
    per layer would be TP's; gloo carries a reduce_scatter as a whole all_reduce
    (``reduce_scatter_traffic``), so on gloo SP sends TP's bytes plus the all_gathers.

    With ``vocab_parallel`` (the word embeddings cut by rows, Megatron's VocabParallelEmbedding), per TP
    group one more all_reduce of ``activation_nbytes`` forward (the embedding's g, on the whole sequence,
    with or without ``sequence_parallel``) and nothing backward; the shard of the table travels in
    ``grad_nbytes`` like every other shard. Measured on the isolated loopback (tiny, TP 2 x DP 2, 2 steps,
    batch 16 x 32 tokens): 38.82 MB vs this model's 38.86 MB (plain TP 69.58 MB: the DP gradients shrink
    by half the table), with ``sequence_parallel`` 41.73 MB vs 41.67 MB.

    With T = 1 nothing crosses a TP group (DDP by Task 2b); with D = 1 nothing is averaged."""
    replicas = world_size // tp_size
    calls: list[tuple] = []
    for d in range(replicas if tp_size > 1 else 0):
        ranks = tuple(d * tp_size + t for t in range(tp_size))
        if sequence_parallel:
            chunk = int(activation_nbytes) // tp_size
            calls += [("all_gather", chunk, ranks), ("reduce_scatter", int(activation_nbytes), ranks)] * (4 * layers)
            calls += [("all_gather", chunk, ranks)] * 2
            calls += [("all_reduce", int(nbytes), ranks) for nbytes in sp_grad_nbytes]
        else:
            calls += [("all_reduce", int(activation_nbytes), ranks)] * (4 * layers)
        calls += [("all_reduce", int(activation_nbytes), ranks)] if vocab_parallel else []
        calls += [("all_reduce", 4, ranks)] if clip else []
    for t in range(tp_size if replicas > 1 else 0):
        group = tuple(d * tp_size + t for d in range(replicas))
        calls += [("all_reduce", int(nbytes), group) for nbytes in grad_nbytes]
    return calls


def traffic_of(tp_model, world_size: int, tp_size: int, rows: int, seq_len: int, clip: bool,
               sequence_parallel: bool = False, vocab_parallel: bool = False):
    """``() -> (calls, extra)`` for ``--measure_traffic``: the collectives of one step
    (``tp_calls``) of ``tp_model`` on ``world_size`` ranks as TP ``tp_size`` x DP, each
    replica's batch ``rows`` x ``seq_len`` tokens; ``extra``: the bytes of one activation all_reduce
    and of the DP gradients, for metrics.json."""
    def of():
        hidden = getattr(getattr(tp_model, "config", None), "hidden_size", None)
        if hidden is None:
            raise KitError(f"--measure_traffic models TP from the model's config.hidden_size: {type(tp_model).__name__} "
                           "has none")
        layers = len(encoder_layers(tp_model))
        activation = rows * seq_len * hidden * next(tp_model.parameters()).element_size()
        grads = [p.numel() * p.element_size() for p in tp_model.parameters() if p.requires_grad]
        marked = [p.numel() * p.element_size() for p in tp_model.parameters()
                  if p.requires_grad and getattr(p, "sequence_parallel", False)] if sequence_parallel else []
        calls = tp_calls(world_size, tp_size, layers, activation, grads, clip,
                                       sequence_parallel=sequence_parallel, sp_grad_nbytes=marked,
                                       vocab_parallel=vocab_parallel)
        replicas = world_size // tp_size
        extra = {"tensor_parallel": {"tp_size": tp_size, "replicas": replicas, "layers": layers,
                                     "activation_all_reduce_bytes": activation, "all_reduces_per_layer_per_step": 4,
                                     "dp_gradient_bytes_per_step": sum(grads) if replicas > 1 else 0}}
        if sequence_parallel:
            extra["tensor_parallel"].update(
                sequence_parallel=True, all_reduces_per_layer_per_step=0,
                all_gathers_per_layer_per_step=4, reduce_scatters_per_layer_per_step=4,
                sequence_parallel_gradient_bytes_per_step=sum(marked))
        if vocab_parallel:  # the embedding's g: one activation all_reduce forward per step
            extra["tensor_parallel"].update(vocab_parallel=True, vocab_parallel_all_reduces_per_step=1)
        return calls, extra

    return of
