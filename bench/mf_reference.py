"""The PyTorch reference of chorus's matrix factorization (ml/mf.cc), for bench/mf_reference.sh.

Same model (mean + dot(U_i, V_j), the mean of the training ratings fixed), same loss (summed over
the minibatch: (e^2 + reg * (|U_i|^2 + |V_j|^2)) / 2 per rating), same optimizer
(torch.optim.Adagrad or SGD on sparse gradients of nn.Embedding(sparse=True): AdaGrad's
s += g^2, w -= lr * g / (sqrt(s) + 1e-10) on the touched rows only), same initialization
(N(0, init_std^2)), minibatch size, learning rate and epochs, a fresh shuffle every epoch, test
RMSE after every epoch. The random streams differ from chorus's (another RNG), so the two runs
agree in distribution, not bit for bit.

Reads train.csv and test.csv as chorus train --write-data writes them (header user,item,rating;
ids 0..n-1). Prints one JSON object: test_rmse, train_seconds (the training loop only, like
chorus's), samples_per_s, epochs and the per-epoch test RMSE. Run it with Debian's Python and
python3-torch: /usr/bin/python3 bench/mf_reference.py --data DIR ...
"""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch


def read(path):
    data = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    if data.shape[0] == 0 or data.shape[1] != 3:
        sys.exit(f"{path}: expected rows of user,item,rating")
    return (torch.from_numpy(data[:, 0].astype(np.int64)),
            torch.from_numpy(data[:, 1].astype(np.int64)),
            torch.from_numpy(data[:, 2].astype(np.float32)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="folder with train.csv and test.csv")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--reg", type=float, default=0.001)
    p.add_argument("--optimizer", choices=["adagrad", "sgd"], default="adagrad")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--init-std", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1, as chorus trains on one thread)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    load_start = time.monotonic()
    rows, cols, values = read(f"{a.data}/train.csv")
    test_rows, test_cols, test_values = read(f"{a.data}/test.csv")
    n_rows = int(max(rows.max(), test_rows.max())) + 1
    n_cols = int(max(cols.max(), test_cols.max())) + 1
    print(f"reference: {rows.numel()} training, {test_rows.numel()} test ratings, "
          f"{n_rows} x {n_cols}, read in {time.monotonic() - load_start:.1f} s", file=sys.stderr)

    mean = float(values.double().mean())
    U = torch.nn.Embedding(n_rows, a.rank, sparse=True)
    V = torch.nn.Embedding(n_cols, a.rank, sparse=True)
    with torch.no_grad():
        U.weight.normal_(0.0, a.init_std)
        V.weight.normal_(0.0, a.init_std)
    params = list(U.parameters()) + list(V.parameters())
    if a.optimizer == "adagrad":
        opt = torch.optim.Adagrad(params, lr=a.lr, eps=1e-10, initial_accumulator_value=0.0)
    else:
        opt = torch.optim.SGD(params, lr=a.lr)

    def test_rmse():
        with torch.no_grad():
            se = 0.0
            for first in range(0, test_rows.numel(), 1 << 20):
                r, c = test_rows[first:first + (1 << 20)], test_cols[first:first + (1 << 20)]
                pred = mean + (U.weight[r] * V.weight[c]).sum(1)
                se += float(((pred - test_values[first:first + (1 << 20)]) ** 2).double().sum())
            return math.sqrt(se / test_rows.numel())

    n = rows.numel()
    train_seconds = 0.0
    cpu_seconds = 0.0  # this process's CPU time: robust on a machine shared with other jobs
    epoch_rmse = []
    for epoch in range(a.epochs):
        start = time.monotonic()
        cpu_start = time.process_time()
        order = torch.randperm(n)
        squared = 0.0
        for first in range(0, n, a.batch):
            idx = order[first:first + a.batch]
            u = U(rows[idx])
            v = V(cols[idx])
            e = mean + (u * v).sum(1) - values[idx]
            loss = 0.5 * (e * e).sum() + 0.5 * a.reg * ((u * u).sum() + (v * v).sum())
            opt.zero_grad()
            loss.backward()
            opt.step()
            squared += float((e.detach() ** 2).sum())
        seconds = time.monotonic() - start
        train_seconds += seconds
        cpu_seconds += time.process_time() - cpu_start
        rmse = test_rmse()
        epoch_rmse.append(rmse)
        print(f"reference epoch {epoch + 1}/{a.epochs}: train RMSE {math.sqrt(squared / n):.4f} "
              f"| test RMSE {rmse:.4f} | {seconds:.1f} s, {n / seconds:.0f} ratings/s",
              file=sys.stderr)
    print(json.dumps({"test_rmse": epoch_rmse[-1] if epoch_rmse else test_rmse(),
                      "train_seconds": train_seconds,
                      "samples_per_s": n * a.epochs / train_seconds if train_seconds else 0.0,
                      "train_cpu_seconds": cpu_seconds,
                      "samples_per_cpu_s": n * a.epochs / cpu_seconds if cpu_seconds else 0.0,
                      "epochs": a.epochs, "threads": a.threads, "torch": torch.__version__,
                      "epoch_test_rmse": epoch_rmse}))


if __name__ == "__main__":
    main()
