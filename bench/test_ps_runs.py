"""Tests of bench/ps_runs.py, the parser both PS experiment scripts share (CTest Bench.PsRuns).

The metrics lines below are in the format chorus writes (run/training_loop.cc: `start`, `step`,
`target`, `final`), trimmed to the fields the parser reads plus a few it must ignore. One run
is also written in the older format (`clock` events, `clocks` in the final line) that the
scripts read before the modes shared the name `step`.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import ps_runs  # noqa: E402


def step(t, k, bytes_sent, name="step", acc=None):
    e = {"event": name, "time": t, name: k, "loss": 1.0, "lr": 0.05, "compute_s": 0.01,
         "wait_s": 0.002, "bytes_sent": bytes_sent, "bytes_received": 10, "cache_hit_rate": 0}
    if acc is not None:
        e["test_accuracy"] = acc
    return e


def final(steps, seconds, wait, ttt, legacy=False, **more):
    e = {"event": "final", "time": seconds + 0.5, "test_loss": 0.3, "test_accuracy": 0.97,
         "seconds": seconds, "wait_s": wait, "time_to_target": ttt, "finished_peers": [1],
         "departed_peers": [], "cache_hit_rate": 0.25, "owner_accuracy": 0.96}
    e["clocks" if legacy else "steps"] = steps
    e.update(more)
    return e


def write(path, events, tail=""):
    with open(path, "w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
        f.write(tail)


def two_node_run(folder, legacy=False, reached=True):
    """Node 0: steps at 1..4 s, evaluated at steps 1 and 3 (0.90, then 0.97 >= target at 3.9 s);
    node 1: steps at 1.5, 2.5, 3.5, 4.5 s. Every step sends 1 MB."""
    os.makedirs(folder)
    name = "clock" if legacy else "step"
    start = {"event": "start", "time": 0.0001, "mode": "ps", "node": 0, "steps": 4}
    node0 = [start, step(1.0, 0, 1e6, name), step(2.0, 1, 1e6, name, acc=0.90),
             step(3.0, 2, 1e6, name)]
    if reached:
        node0.append({"event": "target", "time": 3.9, "step": 3, "test_accuracy": 0.97,
                      "seconds": 3.8})
    node0.append(step(4.0, 3, 1e6, name, acc=0.97 if reached else 0.95))
    node0.append(final(4, 4.0, 1.0, 3.8 if reached else -1.0, legacy, managed_bytes=2e6))
    node1 = [dict(start, node=1)] + [step(t, k, 1e6, name) for k, t in enumerate([1.5, 2.5, 3.5, 4.5])]
    node1.append(final(4, 5.0, 2.0, -1.0, legacy, managed_bytes=1e6))
    write(os.path.join(folder, "node-0.jsonl"), node0)
    # A node killed while writing leaves its last line cut short: it is skipped.
    write(os.path.join(folder, "node-1.jsonl"), node1, tail='{"event":"step","ti')


class SummarizeRun(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.dir)

    def check_reached(self, s):
        self.assertTrue(s["reached"])
        self.assertAlmostEqual(s["time_to_target"], 3.8)
        # Steps up to node 0's target line (3.9 s in its file): node 0's at 1, 2, 3 s and node
        # 1's at 1.5, 2.5, 3.5 s.
        self.assertEqual(s["updates"], 6)
        self.assertAlmostEqual(s["mbytes"], 6.0)
        self.assertAlmostEqual(s["clocks_per_s"], 1.0)
        self.assertAlmostEqual(s["wait_share"], 0.25)
        self.assertAlmostEqual(s["span"], 5.0)
        self.assertAlmostEqual(s["managed_mb"], 3.0)
        self.assertAlmostEqual(s["cache_hit_rate"], 0.25)
        self.assertAlmostEqual(s["owner_accuracy"], 0.96)
        self.assertEqual(s["curve"], [(2.0, 0.90), (4.0, 0.97)])

    def test_step_events(self):
        run = os.path.join(self.dir, "seed-1")
        two_node_run(run)
        self.check_reached(ps_runs.summarize_run(run, nodes=2))

    def test_older_clock_events(self):
        run = os.path.join(self.dir, "seed-1")
        two_node_run(run, legacy=True)
        self.check_reached(ps_runs.summarize_run(run, nodes=2))

    def test_missed_target(self):
        run = os.path.join(self.dir, "seed-1")
        two_node_run(run, reached=False)
        s = ps_runs.summarize_run(run, nodes=2)
        self.assertFalse(s["reached"])
        self.assertIsNone(s["time_to_target"])
        self.assertIsNone(s["updates"])
        self.assertIsNone(s["mbytes"])

    def test_incomplete_runs_are_left_out(self):
        run = os.path.join(self.dir, "seed-1")
        two_node_run(run)
        self.assertIsNone(ps_runs.summarize_run(run, nodes=3))  # a node's file is missing
        with open(os.path.join(run, "node-0.jsonl")) as f:
            lines = [line for line in f if '"final"' not in line]
        with open(os.path.join(run, "node-0.jsonl"), "w") as f:
            f.writelines(lines)
        ps_runs.load.__defaults__[0].clear()  # the loader caches files by path
        self.assertIsNone(ps_runs.summarize_run(run, nodes=2))  # node 0 never finished


class SummarizeVariant(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        ps_runs.load.__defaults__[0].clear()

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_medians_and_a_missed_seed(self):
        two_node_run(os.path.join(self.dir, "seed-1"))
        two_node_run(os.path.join(self.dir, "seed-2"), reached=False)
        two_node_run(os.path.join(self.dir, "seed-10"))
        v = ps_runs.summarize_variant(self.dir, nodes=2)
        self.assertEqual((v["runs"], v["reached"]), (3, 2))
        self.assertEqual([seed for seed, _ in v["seeds"]], ["seed-1", "seed-2", "seed-10"])
        self.assertEqual(ps_runs.per_seed_times(v), "3.8 / — / 3.8")
        self.assertAlmostEqual(v["time_to_target"], 3.8)
        self.assertEqual(v["updates"], 6)

    def test_median_time_counts_a_miss_as_slowest(self):
        self.assertIsNone(ps_runs.median_time([1.0, None, None]))
        self.assertEqual(ps_runs.median_time([1.0, 2.0, None]), 2.0)
        self.assertIsNone(ps_runs.median_time([]))


@unittest.skipUnless(shutil.which("gnuplot"), "gnuplot is not installed")
class SummarizeSparseRun(unittest.TestCase):
    """A sparse PS run (ps/sparse_ps_peer.cc's `epoch` and `summary` lines), two nodes."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.run = os.path.join(self.dir, "seed-1")
        os.makedirs(self.run)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def epoch(self, k, seconds, bytes_out, rmse=None):
        e = {"event": "epoch", "time": seconds + 1, "epoch": k, "step": 10 * k,
             "train_seconds": seconds, "bytes_out": bytes_out}
        if rmse is not None:
            e["test_rmse"] = rmse
        return e

    def write_run(self, rmse0, rmse1, final_rmse):
        write(os.path.join(self.run, "node-0.jsonl"), [
            {"event": "start", "time": 0},
            self.epoch(1, 2.0, 1e6, rmse0), self.epoch(2, 4.5, 2e6, rmse1), self.epoch(3, 7.0, 3e6),
            {"event": "summary", "time": 9, "train_seconds": 7.0, "wait_seconds": 3.5, "steps": 30,
             "test_rmse": final_rmse, "cache_hit_rate": 0.8, "managed_bytes": 5e6}])
        write(os.path.join(self.run, "node-1.jsonl"), [
            self.epoch(1, 2.1, 1.5e6), self.epoch(2, 4.4, 2.5e6), self.epoch(3, 7.1, 3.5e6),
            {"event": "summary", "time": 9, "train_seconds": 7.1, "steps": 30,
             "managed_bytes": 4e6}])

    def test_target_at_an_epoch(self):
        self.write_run(0.5, 0.36, 0.34)
        r = ps_runs.summarize_sparse_run(self.run, 2, "rmse", 0.37)
        self.assertTrue(r["reached"])
        self.assertEqual(r["time_to_target"], 4.5)
        self.assertEqual(r["updates"], 40)
        self.assertAlmostEqual(r["mbytes"], 4.5)
        self.assertAlmostEqual(r["clocks_per_s"], 30 / 7.0)
        self.assertAlmostEqual(r["wait_share"], 0.5)
        self.assertAlmostEqual(r["managed_mb"], 9.0)
        self.assertEqual(r["curve"], [(2.0, 0.5), (4.5, 0.36), (7.0, 0.34)])

    def test_target_at_the_last_epoch_and_missed(self):
        self.write_run(0.5, 0.4, 0.36)
        r = ps_runs.summarize_sparse_run(self.run, 2, "rmse", 0.37)
        self.assertEqual(r["time_to_target"], 7.0)
        self.assertEqual(r["updates"], 60)
        # A second run folder (metrics_lines.load reads each file once).
        self.run = os.path.join(self.dir, "seed-2")
        os.makedirs(self.run)
        self.write_run(0.5, 0.4, 0.38)
        r = ps_runs.summarize_sparse_run(self.run, 2, "rmse", 0.37)
        self.assertFalse(r["reached"])
        self.assertIsNone(r["updates"])
        v = ps_runs.summarize_sparse_variant(self.dir, 2, "rmse", 0.37)
        # One seed reached it, one missed: a miss counts as slowest, so the median is a miss.
        self.assertEqual((v["runs"], v["reached"], v["time_to_target"]), (2, 1, None))
        self.assertIsNone(ps_runs.summarize_sparse_run(self.run, 3, "rmse", 0.37))


class Scripts(unittest.TestCase):
    """Both scripts summarize a folder of runs through the parser (--summarize-only)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.dir)

    def summarize(self, script, folder, variants):
        for v in variants:
            two_node_run(os.path.join(self.dir, folder + v, "seed-1"))
        out = subprocess.run(
            [os.path.join(HERE, script), "--summarize-only", "--out", self.dir, "--nodes", "2",
             "--variants", " ".join(variants), "--target", "0.97", "--chorus", "/bin/true"],
            capture_output=True, text=True, check=True).stdout
        with open(os.path.join(self.dir, "table.md")) as f:
            table = f.read()
        self.assertIn(table.strip(), out)
        return table

    def test_ps_experiment(self):
        table = self.summarize("ps_experiment.sh", "s-", ["0", "inf"])
        self.assertIn("| BSP (s=0) | 1/1 | 3.8 s | 3.8 s | 6 |", table)
        self.assertIn("| async (s=inf) | 1/1 | 3.8 s | 3.8 s | 6 |", table)

    def test_managed_comm(self):
        table = self.summarize("managed_comm.sh", "v-", ["3m"])
        self.assertIn("| SSP s=3 + managed | 1/1 | 3.8 s | 3.8 s | 6 | 6 | 25% | 1.00 | 25% | 3 |",
                      table)

    def test_managed_comm_mf(self):
        run = os.path.join(self.dir, "v-3m", "seed-1")
        os.makedirs(run)
        for node in (0, 1):
            epochs = [{"event": "epoch", "time": 3 * k, "epoch": k, "step": 10 * k,
                       "train_seconds": 2.0 * k, "bytes_out": 1e6 * k} for k in (1, 2)]
            if node == 0:
                epochs[0]["test_rmse"] = 0.45
            write(os.path.join(run, f"node-{node}.jsonl"), epochs + [
                {"event": "summary", "time": 7, "train_seconds": 4.0, "wait_seconds": 1.0,
                 "steps": 20, "test_rmse": 0.39, "cache_hit_rate": 0.9, "managed_bytes": 2e6}])
        out = subprocess.run(
            [os.path.join(HERE, "managed_comm.sh"), "--workload", "mf", "--summarize-only",
             "--out", self.dir, "--nodes", "2", "--variants", "3m", "--target-rmse", "0.4",
             "--chorus", "/bin/true"], capture_output=True, text=True, check=True).stdout
        self.assertIn("| SSP s=3 + managed | 1/1 | 4.0 s | 4.0 s | 40 | 4 | 0.3900 | 90% | 5.00 | "
                      "25% | 4 |", out)


if __name__ == "__main__":
    unittest.main()
