"""kit/measure/traffic_model.py and traffic_meter.py: the traffic models, the meter, the sampler, and one real 4-rank run."""
import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from student_src.kit.ranks import network_interface as nif
from student_src.kit.measure import traffic_meter as meter
from student_src.kit.measure import traffic_model as model
from student_src.kit.parallel.pipeline import traffic as pipeline_traffic
from student_src.kit.errors import KitError


# ------------------------------------------------------------------------------- models
@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("nbytes", [4, 512, 4000, 4096, 1_000_004, 16 << 20])
def test_ring_allreduce_sums_to_textbook(nbytes, n):
    t = model.allreduce_traffic(nbytes, n)
    assert t.total_payload == 2 * (n - 1) * nbytes          # exact, over all ranks
    assert sum(t.recv) == t.total_payload
    per_rank = 2 * (n - 1) * nbytes / n
    if nbytes >= 4 * 2 * n * 16:                               # big enough that rounding is small
        assert all(abs(s - per_rank) <= 2 * 2 * (n - 1) * 4 for s in t.sent)
    assert t.total_msgs == sum(t.msgs_recv)


def test_ring_allreduce_small_tensor_uses_few_messages():
    t = model.allreduce_traffic(4, 4)                 # one element: one non-empty segment
    assert t.total_payload == 24 and t.total_msgs == 6
    assert model.allreduce_traffic(4096, 4).total_msgs == 48     # 8 segments, 6 sent per rank


def test_ring_allreduce_per_rank_schedule_with_empty_segments():
    """gloo's segment schedule, worked by hand: 40 bytes on 4 ranks make 8 segments of 8 bytes,
    the last 3 empty. Rank r sends segments (r+1)*2+i (reduce-scatter) and r*2+i (all-gather),
    i < 6, mod 8, skipping empty ones: rank 0 sends 2,3,4 then 0..4 = 8 segments, 64 bytes."""
    t = model.allreduce_traffic(40, 4)
    assert t.sent == [64, 48, 56, 72] and t.msgs_sent == [8, 6, 7, 9]
    assert t.recv == [48, 56, 72, 64] and t.msgs_recv == [6, 7, 9, 8]   # rank r sends to rank r-1
    assert model.allreduce_traffic(100, 3).sent == [140, 120, 140]


def test_world_size_one_sends_nothing():
    for f in (model.allreduce_traffic, model.gather_scatter_traffic, model.allgather_traffic, model.broadcast_traffic):
        t = f(1000, 1)
        assert t.total_payload == 0 and t.total_msgs == 0
    assert model.barrier_traffic(1).total_msgs == 0


def test_gather_scatter_root_versus_worker():
    s, n = 1000, 4
    t = model.gather_scatter_traffic(s, n)
    assert (t.sent[0], t.recv[0]) == ((n - 1) * s, (n - 1) * s)
    assert all((t.sent[r], t.recv[r]) == (s, s) for r in range(1, n))


def test_allgather_and_broadcast_and_barrier():
    g = model.allgather_traffic(16, 4)
    assert g.sent == g.recv == [48] * 4 and g.msgs_sent == g.msgs_recv == [3] * 4
    b = model.broadcast_traffic(100, 4)  # gloo's binomial tree, measured per node: 0 -> 1, 0 -> 2, 1 -> 3
    assert b.sent == [200, 100, 0, 0] and b.recv == [0, 100, 100, 100]
    assert model.broadcast_traffic(100, 4, root=2).sent == [0, 0, 200, 100]          # the same tree from rank 2
    assert model.broadcast_traffic(100, 3).sent == [200, 0, 0]                       # 3 ranks: the root sends both
    assert model.broadcast_traffic(100, 8).sent == [300, 200, 100, 100, 0, 0, 0, 0]  # N-1 messages, log2 N from the root
    assert model.barrier_traffic(4).total_msgs == 8 and model.barrier_traffic(5).total_msgs == 15
    # sequence parallelism's list reduce_scatter: gloo carries it as a whole all_reduce, as FSDP's reduce_scatter_single
    assert model.collective_traffic("reduce_scatter", 400, 4) == model.allreduce_traffic(400, 4)
    with pytest.raises(KitError):
        model.collective_traffic("scatter_reduce", 4, 4)  # no such collective: a clear error, not a zero


def test_step_traffic_per_task():
    sizes = [4000, 400]
    a = model.step_traffic("2a", 4, sizes, logging=None)
    b = model.step_traffic("2b", 4, sizes, logging=None)
    d = model.step_traffic("3", 4, sizes, bucket_nbytes=[4400], logging=None)
    assert a.sent[0] == 3 * 4400 and a.sent[1] == 4400
    assert b.total_payload == d.total_payload == 6 * 4400
    assert d.total_msgs < b.total_msgs                       # one bucket, fewer messages
    with_log = model.step_traffic("2b", 4, sizes)
    assert with_log.total_payload == b.total_payload + 4 * 3 * 24
    assert model.step_traffic("1", 4, sizes).total_payload == 4 * 3 * 24   # logging only


def test_wire_model_scopes_agree():
    t = model.allreduce_traffic(1 << 20, 4)
    w = model.WireModel()
    nodes = [w.node(t, r) for r in range(4)]
    # every byte sent by one node is received by another, so node totals = 2 x loopback total
    assert sum(x["total"] for x in nodes) == pytest.approx(2 * w.loopback_total(t))
    assert meter.header_fraction("x", mtu=1500) > 20 * meter.header_fraction("x", mtu=65536)


def test_gather_scatter_allgather_broadcast_edge_cases():
    """An empty tensor sends no message at all (not N empty ones); two ranks are a ring of two;
    any root works (the root is where the N-1 transfers meet); a barrier's messages are empty."""
    for f in (model.allreduce_traffic, model.gather_scatter_traffic, model.allgather_traffic, model.broadcast_traffic):
        t = f(0, 4)
        assert t.total_payload == 0 and t.total_msgs == 0 and sum(t.recv) == sum(t.msgs_recv) == 0, f.__name__
    g = model.allgather_traffic(16, 2)
    assert g.sent == g.recv == [16, 16] and g.msgs_sent == g.msgs_recv == [1, 1]
    assert model.broadcast_traffic(100, 2).sent == [100, 0] and model.gather_scatter_traffic(100, 2).sent == [100, 100]
    s = model.gather_scatter_traffic(10, 4, root=2)
    assert s.sent == s.recv == [10, 10, 30, 10] and s.msgs_sent == s.msgs_recv == [1, 1, 3, 1]
    b = model.broadcast_traffic(10, 3, root=1)
    assert b.sent == [0, 20, 0] and b.recv == [10, 0, 10]
    barrier = model.barrier_traffic(4)
    assert barrier.sent == barrier.recv == [0] * 4 and barrier.msgs_sent == barrier.msgs_recv == [2] * 4
    assert model.barrier_traffic(2).msgs_sent == [1, 1]                 # ceil(log2 2) = 1 round



def test_ring_allreduce_even_split_and_whole_bytes():
    """When S splits into 2N segments of whole elements, every rank sends exactly 2(N-1)/N x S in
    2(N-1) messages; byte counts stay integers (they go into metrics.json)."""
    even = model.allreduce_traffic(64, 4)                # 8 segments of 8 bytes
    assert even.sent == even.recv == [96] * 4 and even.msgs_sent == [12] * 4   # 2 x 3/4 x 64, 2 x 6 segments
    odd = model.allreduce_traffic(100, 3)
    assert all(type(v) is int for v in odd.sent + odd.recv + odd.msgs_sent + odd.msgs_recv)


def test_step_traffic_of_two_ranks_and_the_wire_split_of_an_odd_overhead():
    two = model.step_traffic("2b", 2, [4000])
    assert two == model.allreduce_traffic(4000, 2) + model.allgather_traffic(24, 2) and two.sent == [4024, 4024]
    t = model.Traffic.zero(2)
    t.message(0, 1, 0)
    assert model.WireModel(per_message=5, header_fraction=0.0).node(t, 0) == {"sent": 2.5, "recv": 2.5, "total": 5.0}
    # every task gets a textbook figure (the meter asks for one whatever the task)
    assert model.textbook_bytes("1", 1000, 4) == model.textbook_bytes("2b", 1000, 4) == 1500


def test_wire_model_overheads_are_the_measured_ones():
    """The protocol overheads benchmarks/traffic/README.md measured: ~340 bytes per gloo message,
    and a TCP/IP header (66 bytes, 1.5 per packet counting delayed ACKs) per MSS (MTU - 52) of
    payload, packets capped at 64 KiB."""
    assert model.PER_MESSAGE_BYTES == 340
    assert model.header_fraction_for_mtu(1500) == pytest.approx(1.5 * 66 / 1448, rel=1e-12)
    assert model.header_fraction_for_mtu(1 << 20) == model.header_fraction_for_mtu(65536) \
        == pytest.approx(1.5 * 66 / (65536 - 52), rel=1e-12)
    w = model.WireModel()
    assert w.header_fraction == model.header_fraction_for_mtu(65536) and w.per_message == 340
    t = model.Traffic.zero(2)
    t.message(0, 1, 1000)
    wire = 1000 * (1 + w.header_fraction)
    assert w.loopback_total(t) == pytest.approx(wire + 340, rel=1e-12)
    # a node's NIC: its payload and headers, and half of each message's overhead on each side
    assert w.node(t, 0) == pytest.approx({"sent": wire + 170, "recv": 170, "total": wire + 340}, rel=1e-12)
    assert w.node(t, 1) == pytest.approx({"sent": 170, "recv": wire + 170, "total": wire + 340}, rel=1e-12)


def test_traffic_adds_and_scales_per_rank():
    t = model.Traffic.zero(3)
    t.message(0, 2, 10, count=2)
    assert (t.sent, t.recv, t.msgs_sent, t.msgs_recv) == ([20, 0, 0], [0, 0, 20], [2, 0, 0], [0, 0, 2])
    u = model.Traffic([1, 2, 3], [4, 5, 6], [1, 1, 1], [0, 1, 2])
    both = (t + u).scaled(3)
    assert (both.sent, both.recv, both.msgs_sent, both.msgs_recv) == ([63, 6, 9], [12, 15, 78], [9, 3, 3], [0, 3, 12])
    assert both.total_payload == 78 and both.total_msgs == 15


def test_step_traffic_of_ddp_without_bucket_sizes_is_per_tensor():
    """Task 3 / 5 without the bucket sizes: modelled as one ring all_reduce per tensor (2b)."""
    sizes = [4000, 400]
    assert model.step_traffic("3", 4, sizes) == model.step_traffic("2b", 4, sizes)
    assert model.step_traffic("5", 4, sizes, bucket_nbytes=[]) == model.step_traffic("2b", 4, sizes)
    assert model.step_traffic("2b", 1, sizes).total_msgs == 0


# ------------------------------------------------------------------------------- interfaces
def test_loopback_and_address_lookup():
    lo = nif.loopback_interface()
    assert lo in ("lo", "lo0") or lo.startswith("lo")
    assert nif.interface_for_address("127.0.0.1") == lo
    assert meter.choose_interface(master_ip="127.0.0.1") == lo
    assert meter.choose_interface(master_ip="localhost") == lo
    with pytest.raises(KitError, match="resolve"):
        meter.choose_interface(master_ip="no-such-host.invalid")
    assert meter.choose_interface() == lo


@pytest.mark.parametrize("bad", ["203.0.113.77", "not-an-ip"])
def test_missing_interface_is_a_clear_error(bad):
    with pytest.raises(KitError, match="interface|address"):
        nif.interface_for_address(bad)


def test_unknown_interface_name():
    with pytest.raises(KitError, match="not found"):
        meter.TrafficMeter("no-such-nic0")
    with pytest.raises(KitError, match="not found"):
        meter.RunTrafficMeter("2b", 2, 0, interface="no-such-nic0")


def _blast(nbytes: int) -> None:
    """Send nbytes over a loopback TCP connection (both ends in this process)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = []

    def sink():
        c, _ = srv.accept()
        n = 0
        while True:
            b = c.recv(1 << 16)
            if not b:
                break
            n += len(b)
        got.append(n)
        c.close()

    th = threading.Thread(target=sink)
    th.start()
    cli = socket.create_connection(srv.getsockname())
    cli.sendall(b"x" * nbytes)
    cli.close()
    th.join(10)
    srv.close()
    assert got == [nbytes]


def test_meter_counts_running_spans_only():
    m = meter.TrafficMeter(nif.loopback_interface())
    m.start()
    _blast(2_000_000)
    m.pause()
    frozen = (m.sent, m.recv)
    _blast(1_000_000)                     # not counted: paused
    assert m.totals() == frozen
    m.resume()
    m.epoch_end(0)
    _blast(500_000)
    m.epoch_end(1)
    sent, recv = m.stop()
    assert sent >= 2_500_000 and recv >= 2_500_000          # others' loopback traffic may add
    assert m.per_epoch[0]["bytes_sent"] >= 2_000_000 and m.per_epoch[1]["bytes_sent"] >= 500_000


def test_sampler_writes_csv_and_stops(tmp_path):
    path = tmp_path / "traffic.csv"
    with meter.TrafficSampler(nif.loopback_interface(), str(path), interval=0.05) as s:
        _blast(1_000_000)
        deadline = time.monotonic() + 60  # a hang guard only: waits for two samples, however slow
        while len(path.read_text().splitlines()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert s._thread is None
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["time", "bytes_recv_per_s", "bytes_sent_per_s"]
    assert len(rows) >= 3 and all(len(r) == 3 for r in rows)
    assert not any(t.name == "traffic-sampler" for t in threading.enumerate())


def test_run_meter_single_process_block():
    m = meter.RunTrafficMeter("2b", 4, 0)
    m.start()
    m.pause(); m.resume(); m.epoch_end(0)
    block = m.finish(10, 1000, comm_records=[{"op": "all_reduce", "nbytes": 600},
                                             {"op": "all_reduce", "nbytes": 400}])
    for key in ("interface", "iterations", "expected_bytes", "measured_bytes", "per_rank", "per_epoch", "ratio"):
        assert key in block
    assert block["expected_payload_bytes"] == 10 * (6 * 1000 + 4 * 3 * 24)
    assert set(block["per_rank"]) == {"0", "1", "2", "3"}
    json.dumps(block)


# ------------------------------------------------------------------------------- the textbook figure
def test_textbook_bytes_per_rank():
    """The figure students compare their measurement with: 2(N-1)/N x S per tensor for a ring
    all_reduce (2b, and the buckets of 3 and 5), a worker's S for 2a's gather + scatter."""
    assert model.textbook_bytes("2b", 1000, 4) == 1500 and model.textbook_bytes("3", 1000, 4) == 1500
    assert model.textbook_bytes("2b", 1000, 2) == 1000 and model.textbook_bytes("5", 900, 3) == 1200
    assert model.textbook_bytes("2b", 1001, 4) == 1502           # rounded to the nearest byte
    assert model.textbook_bytes("2b", 1000, 1) == 0
    assert model.textbook_bytes("2a", 1000, 4) == 1000 and model.textbook_bytes("2a", 7, 2) == 7


def test_tensors_of_one_step():
    one_step = [{"op": "all_reduce", "nbytes": 600}, {"op": "all_reduce", "nbytes": 400}]
    assert model.tensors_of_one_step(one_step, 1000, 10) == [600, 400]
    assert model.tensors_of_one_step(one_step * 3, 1000, 3) == [600, 400]      # records of every step
    assert model.tensors_of_one_step(one_step * 2, 1000, 2) == [600, 400]
    assert model.tensors_of_one_step(one_step, 400, 2) == [600, 400]    # not a multiple of the step: one step
    # any collective but the loss counts (2a records its gathers and scatters)
    assert model.tensors_of_one_step([{"op": "gather", "nbytes": 8}, {"op": "scatter", "nbytes": 8}], 16, 1) == [8, 8]
    assert model.tensors_of_one_step(one_step + [{"op": "loss", "nbytes": 4}], 1000, 10) == [600, 400]
    assert model.tensors_of_one_step([], 1000, 10) == [1000] and model.tensors_of_one_step(None, 0, 10) == []


def test_meter_block_reports_the_textbook_figure():
    m = meter.RunTrafficMeter("2b", 4, 0)
    m.start()
    block = m.finish(10, 1000, comm_records=[{"op": "all_reduce", "nbytes": 600},
                                             {"op": "all_reduce", "nbytes": 400}])
    assert block["textbook_sent_per_rank_per_iter"] == 900 + 600
    ring = model.allreduce_traffic(600, 4) + model.allreduce_traffic(400, 4)
    assert sum(block["per_rank"][str(r)]["payload_sent"] for r in range(4)) == 10 * (ring.total_payload + 4 * 3 * 24)
    a = meter.RunTrafficMeter("2a", 2, 0)
    a.start()
    assert a.finish(5, 1000)["textbook_sent_per_rank_per_iter"] == 1000


# ------------------------------------------------------------------------------- a real run
def _in_private_netns() -> list:
    """Prefix that runs a command in a fresh namespace (its own quiet loopback), if we can."""
    if sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("ip"):
        return [], None
    ns = f"dpkt-lo{uuid.uuid4().hex[:6]}"
    if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode != 0:
        return [], None
    subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
    return ["ip", "netns", "exec", ns], ns


@pytest.mark.parametrize("task,n", [("2b", 4), ("2a", 2)])   # kept small: process start-up dominates
def test_local_ranks_measured_matches_expected(task, n):
    prefix, ns = _in_private_netns()
    try:
        cmd = prefix + [sys.executable, "-m", "student_src.kit.cluster.check", "--spawn", str(n),
                        "--task", task, "--sizes", "1000000,512,4", "--iters", "2", "--timeout", "60"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    finally:
        if ns:
            subprocess.run(["ip", "netns", "del", ns])
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in rows) == list(range(n))
    for r in rows:
        if ns:      # a private loopback: nothing else on it
            assert 0.98 <= r["ratio"] <= 1.05, r
        else:       # shared loopback: other programs can only add bytes
            assert r["ratio"] >= 0.98, r


# ------------------------------------------------------------------------------- Task 9: a pipeline's sends
def test_pipeline_calls_per_boundary_and_with_replicas():
    """Per boundary per step: m x (hidden + mask) forward, m x hidden back; the clip's and the
    loss's scalars in each pipeline; with replicas each stage's gradients all_reduced over them."""
    hidden, mask, m = 4 * 32 * 64 * 4, 4 * 32 * 8, 4
    calls = pipeline_traffic.pipeline_calls(2, 1, m, [hidden, mask], [hidden], [[100, 20], [30]])
    t = model.ranked_calls_traffic(calls, 2)
    assert pipeline_traffic.pipeline_boundary_bytes(m, [hidden, mask], [hidden]) == {"forward": m * (hidden + mask),
                                                                          "backward": m * hidden}
    clip, loss = model.allreduce_traffic(4, 2), model.broadcast_traffic(4, 2, root=1)
    assert t.sent[0] == m * (hidden + mask) + clip.sent[0] + loss.sent[0]
    assert t.sent[1] == m * hidden + clip.sent[1] + loss.sent[1]
    assert t.msgs_sent[0] == 2 * m + clip.msgs_sent[0] and t.msgs_sent[1] == m + clip.msgs_sent[1] + loss.msgs_sent[1]
    # 2 stages x 2 replicas: ranks 0-1 and 2-3 pipelines, {0, 2} and {1, 3} average their stage's gradients
    four = model.ranked_calls_traffic(pipeline_traffic.pipeline_calls(2, 2, m, [hidden, mask], [hidden], [[100, 20], [30]]), 4)
    dp0 = model.allreduce_traffic(100, 2) + model.allreduce_traffic(20, 2)
    assert four.sent[2] == t.sent[0] + dp0.sent[1] and four.sent[3] == t.sent[1] + model.allreduce_traffic(30, 2).sent[1]
    # one stage (Task 2b with micro-batches): no sends, no clip or loss in a pipeline
    one = pipeline_traffic.pipeline_calls(1, 2, m, [hidden, mask], [hidden], [[100]])
    assert one == [("all_reduce", 100, (0, 1))]
    # step_traffic takes them for a task without a gradient pattern, with the logging all_gather
    step = model.step_traffic("9", 2, [], calls=calls)
    assert step.total_payload == t.total_payload + 2 * model.LOGGING_COLLECTIVE[1]  # 2 ranks' all_gather for the log


def test_interleaved_pipeline_calls_cross_every_chunk_boundary():
    """Interleaved 1F1B (v chunks per rank, chunk c of rank r = model chunk c * p + r): a micro-batch crosses
    v * p - 1 chunk boundaries forward and as many back, 2 (v p - 1) transfers over the pipeline; the ranks'
    bytes per step, counted by hand for p = 2, v = 2 and p = 4, v = 2."""
    hidden, mask, m = 4 * 32 * 384 * 4, 4 * 32 * 8, 4
    assert pipeline_traffic.chunk_boundaries([0, 1], 2) == [(0, 1), (1, 0), (0, 1)]
    assert pipeline_traffic.chunk_boundaries([4, 5, 6], 1) == [(4, 5), (5, 6)]  # one chunk: the stages' boundaries
    t = model.ranked_calls_traffic(pipeline_traffic.pipeline_calls(2, 1, m, [hidden, mask], [hidden], [[100], [30]],
                                                                   clip=False, virtual_stages=2), 2)
    loss = model.broadcast_traffic(4, 2, root=1)
    # rank 0 sends chunks 0 -> 1 and 2 -> 3 forward, chunk 2's input gradient back to chunk 1 (rank 1);
    # rank 1 sends chunk 1 -> 2 forward, chunk 1's and chunk 3's input gradients back
    assert t.sent[0] == 2 * m * (hidden + mask) + m * hidden + loss.sent[0]
    assert t.sent[1] == m * (hidden + mask) + 2 * m * hidden + loss.sent[1]
    assert t.msgs_sent[0] == 2 * 2 * m + m and t.msgs_sent[1] == 2 * m + 2 * m + loss.msgs_sent[1]
    for p, v in ((2, 2), (4, 2), (3, 3)):
        calls = pipeline_traffic.pipeline_calls(p, 1, m, [hidden, mask], [hidden], [[1]] * p, clip=False,
                                                virtual_stages=v)
        sends = [c for c in calls if c[0] == "send"]
        assert len(sends) == m * (v * p - 1) * 3  # per micro-batch 2 (v p - 1) transfers, forward ones 2 tensors
        assert sum(c[1] for c in sends) == m * (v * p - 1) * (2 * hidden + mask)
        # rank p - 1 feeds rank 0 forward (the mask travels forward only) v - 1 times per micro-batch
        assert sum(c[2] == (p - 1, 0) and c[1] == mask for c in sends) == m * (v - 1)
    one = pipeline_traffic.pipeline_calls(2, 1, m, [hidden, mask], [hidden], [[100], [30]])
    assert one == pipeline_traffic.pipeline_calls(2, 1, m, [hidden, mask], [hidden], [[100], [30]], virtual_stages=1)


@pytest.mark.skipif(not (sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0
                         and shutil.which("ip")), reason="cluster isolate needs root, Linux and ip")
@pytest.mark.parametrize("world,stages", [(2, 2), (4, 2)])
def test_pipeline_measure_traffic_matches_the_model(small_rte, tmp_path, world, stages):
    """Task 9 with --measure_traffic on a private loopback: the bytes measured within 2% of the
    model (point-to-point activations and gradients, the clip's and the loss's scalars, with 2
    replicas each stage's gradients all_reduced), the payload per boundary reported."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "student_src.kit.cluster", "isolate", "--timeout", "400", "--",
                           sys.executable, "-m", "student_src.run_glue", "--task", "9", "--world_size", str(world),
                           "--pipeline_stages", str(stages), "--micro_batches", "4", "--spawn",
                           "--model_name_or_path", "tiny", "--data_dir", str(small_rte), "--max_seq_length", "32",
                           "--global_batch_size", "16", "--max_steps", "4", "--do_train", "--num_threads", "1",
                           "--no_progress", "--measure_traffic", "--output_dir", str(out)],
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), capture_output=True,
                          text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    traffic = json.loads((out / "metrics.json").read_text())["traffic"]
    assert 0.98 <= traffic["measured_bytes"] / traffic["expected_bytes"] <= 1.02, traffic
    rows, seq, hidden = 16 // (world // stages) // 4, 32, 64
    assert traffic["pipeline"] == {"boundaries": 1, "payload_per_boundary_per_step": {
        "forward": 4 * (rows * seq * hidden * 4 + rows * seq * 8), "backward": 4 * rows * seq * hidden * 4}}


@pytest.mark.skipif(not (sys.platform == "linux" and hasattr(os, "geteuid") and os.geteuid() == 0
                         and shutil.which("ip")), reason="cluster isolate needs root, Linux and ip")
def test_interleaved_pipeline_measure_traffic_matches_the_model(small_rte, tmp_path):
    """Task 9, interleaved 1F1B on 2 ranks x 2 chunks (MiniLM: the tiny model has 2 layers, 4 chunks need 4),
    --measure_traffic on a private loopback: the bytes measured within 2% of the model, which has every
    micro-batch cross the 3 chunk boundaries both ways (rank 1 -> rank 0 forward too)."""
    out = tmp_path / "out"
    steps, m, rows, seq, hidden = 1, 4, 4, 32, 384  # MiniLM on 2 busy cores: 1.5-3 minutes, more under load
    proc = subprocess.run([sys.executable, "-m", "student_src.kit.cluster", "isolate", "--timeout", "600", "--",
                           sys.executable, "-m", "student_src.run_glue", "--task", "9", "--world_size", "2",
                           "--micro_batches", str(m), "--schedule", "interleaved", "--virtual_stages", "2", "--spawn",
                           "--model_name_or_path", "minilm", "--data_dir", str(small_rte), "--max_seq_length", str(seq),
                           "--global_batch_size", "16", "--max_steps", str(steps), "--do_train", "--num_threads", "1",
                           "--no_progress", "--measure_traffic", "--output_dir", str(out)],
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), capture_output=True,
                          text=True, timeout=640)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    traffic = json.loads((out / "metrics.json").read_text())["traffic"]
    assert 0.98 <= traffic["measured_bytes"] / traffic["expected_bytes"] <= 1.02, traffic
    act, mask = rows * seq * hidden * 4, rows * seq * 8
    assert traffic["pipeline"] == {"boundaries": 3, "payload_per_boundary_per_step": {
        "forward": m * (act + mask), "backward": m * act}}
    # the activations are most of it: a model of one boundary (1F1B's) would be a third of the measured bytes
    assert traffic["expected_payload_bytes"] >= steps * 3 * (m * (act + mask) + m * act)
