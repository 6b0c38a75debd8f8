#!/usr/bin/python3
"""PyTorch reference of chorus's KGE training: the same models (DistMult, ComplEx with rows laid
out [real | imaginary]), losses (logistic with optional self-adversarial weights, softmax
cross-entropy), negative sampling (N uniform negatives per positive, drawn afresh for the tail
and for the head, the true entity at candidate 0; or 'all' for 1-N scoring), regularizers (L2,
N3 over the three rows of each triple), optimizers (torch.optim.Adagrad / SGD: sparse gradients
with sampled negatives, dense ones with 1-N, as chorus), initialization N(0, init_scale^2) and
filtered evaluation (mean rank on ties, both directions). One thread.

Prints one line per epoch and a final line `RESULT triples_per_s=... valid_mrr=... test_mrr=...`
that bench/kge_reference.sh reads.

Run with Debian's interpreter: /usr/bin/python3 bench/kge_reference.py --data-dir DIR ...
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F


def read_graph(folder):
    def read_dict(name):
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            return None
        ids = {}
        with open(path) as f:
            for line in f:
                index, key = line.rstrip("\n").split("\t")
                ids[key] = int(index)
        return ids

    entities = read_dict("entities.dict") or {}
    relations = read_dict("relations.dict") or {}
    fixed_e, fixed_r = bool(entities), bool(relations)
    splits = {}
    for split in ("train", "valid", "test"):
        rows = []
        with open(os.path.join(folder, split + ".txt")) as f:
            for line in f:
                line = line.rstrip("\r\n")
                if not line:
                    continue
                h, r, t = line.split("\t")
                for key, table, fixed in ((h, entities, fixed_e), (t, entities, fixed_e)):
                    if key not in table:
                        if fixed:
                            sys.exit(f"{split}.txt: {key} not in entities.dict")
                        table[key] = len(table)
                if r not in relations:
                    if fixed_r:
                        sys.exit(f"{split}.txt: {r} not in relations.dict")
                    relations[r] = len(relations)
                rows.append((entities[h], relations[r], entities[t]))
        splits[split] = torch.tensor(rows, dtype=torch.long)
    return len(entities), len(relations), splits


class Kge(torch.nn.Module):
    def __init__(self, model, entities, relations, dim, init_scale, sparse):
        super().__init__()
        self.model, self.dim = model, dim
        self.ent = torch.nn.Embedding(entities, dim, sparse=sparse)
        self.rel = torch.nn.Embedding(relations, dim, sparse=sparse)
        with torch.no_grad():
            self.ent.weight.normal_(0.0, init_scale)
            self.rel.weight.normal_(0.0, init_scale)

    def tail_query(self, h, r):
        if self.model == "distmult":
            return h * r
        k = self.dim // 2
        hr, hi, rr, ri = h[..., :k], h[..., k:], r[..., :k], r[..., k:]
        return torch.cat([hr * rr - hi * ri, hr * ri + hi * rr], dim=-1)

    def head_query(self, r, t):
        if self.model == "distmult":
            return r * t
        k = self.dim // 2
        rr, ri, tr, ti = r[..., :k], r[..., k:], t[..., :k], t[..., k:]
        return torch.cat([rr * tr + ri * ti, rr * ti - ri * tr], dim=-1)

    def regularizer(self, kind, rows):
        if kind == "l2":
            return (rows * rows).sum(-1)
        if self.model == "distmult":
            return rows.abs().pow(3).sum(-1)
        k = self.dim // 2
        modulus = torch.sqrt(rows[..., :k] ** 2 + rows[..., k:] ** 2)
        return modulus.pow(3).sum(-1)


def candidate_loss(scores, true_index, args):
    """Per-query loss; scores is B x C, true_index the column of the true entity (a tensor)."""
    if args.loss == "ce":
        return F.cross_entropy(scores, true_index, reduction="none")
    rows = torch.arange(scores.shape[0])
    positive = scores[rows, true_index]
    negative_mask = torch.ones_like(scores, dtype=torch.bool)
    negative_mask[rows, true_index] = False
    negatives = scores.shape[1] - 1
    if args.adversarial_temperature > 0:
        logits = (args.adversarial_temperature * scores).masked_fill(~negative_mask, -math.inf)
        weights = torch.softmax(logits, dim=1).detach()
    else:
        weights = negative_mask.float() / negatives
    negative_loss = (weights * F.softplus(scores)).sum(1)
    return 0.5 * (F.softplus(-positive) + negative_loss)


def step_loss(model, batch, args, entities, generator):
    h_idx, r_idx, t_idx = batch[:, 0], batch[:, 1], batch[:, 2]
    h, r, t = model.ent(h_idx), model.rel(r_idx), model.ent(t_idx)
    total = 0.0
    for tail in (True, False):
        query = model.tail_query(h, r) if tail else model.head_query(r, t)
        truth = t_idx if tail else h_idx
        if args.negatives == "all":
            scores = query @ model.ent.weight.t()
            total = total + candidate_loss(scores, truth, args)
        else:
            n = int(args.negatives)
            sampled = torch.randint(entities, (batch.shape[0], n), generator=generator)
            candidates = torch.cat([truth[:, None], sampled], dim=1)
            rows = model.ent(candidates)  # B x (N+1) x D
            scores = torch.bmm(rows, query[:, :, None]).squeeze(2)
            zeros = torch.zeros(batch.shape[0], dtype=torch.long)
            total = total + candidate_loss(scores, zeros, args)
    loss = total.mean()
    if args.reg != "none" and args.reg_weight > 0:
        reg = model.regularizer(args.reg, h) + model.regularizer(args.reg, r) + \
            model.regularizer(args.reg, t)
        loss = loss + args.reg_weight * reg.mean()
    return loss


@torch.no_grad()
def evaluate(model, split, known_tails, known_heads, block=256):
    ranks = []
    weight = model.ent.weight
    for tail in (True, False):
        for begin in range(0, split.shape[0], block):
            b = split[begin:begin + block]
            h, r, t = weight[b[:, 0]], model.rel.weight[b[:, 1]], weight[b[:, 2]]
            query = model.tail_query(h, r) if tail else model.head_query(r, t)
            scores = query @ weight.t()
            for j in range(b.shape[0]):
                hh, rr, tt = (int(x) for x in b[j])
                truth = tt if tail else hh
                known = known_tails.get((hh, rr), ()) if tail else known_heads.get((rr, tt), ())
                row = scores[j]
                target = row[truth].item()
                higher = int((row > target).sum())
                equal = int((row == target).sum()) - 1
                others = torch.tensor([e for e in known if e != truth], dtype=torch.long)
                if others.numel():
                    higher -= int((row[others] > target).sum())
                    equal -= int((row[others] == target).sum())
                ranks.append(1.0 + higher + 0.5 * equal)
    ranks = torch.tensor(ranks, dtype=torch.float64)
    return {"mrr": float((1.0 / ranks).mean()), "hits@1": float((ranks <= 1).double().mean()),
            "hits@3": float((ranks <= 3).double().mean()),
            "hits@10": float((ranks <= 10).double().mean())}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--model", choices=["complex", "distmult"], default="complex")
    p.add_argument("--dim", type=int, default=400)
    p.add_argument("--negatives", default="256", help="count or 'all'")
    p.add_argument("--loss", choices=["logistic", "ce"], default="logistic")
    p.add_argument("--adversarial-temperature", type=float, default=0.0)
    p.add_argument("--reg", choices=["none", "l2", "n3"], default="n3")
    p.add_argument("--reg-weight", type=float, default=0.0)
    p.add_argument("--optimizer", choices=["adagrad", "sgd"], default="adagrad")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--init-scale", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: none)")
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--log-every", type=int, default=0, help="print the loss every N steps")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed + 1)

    entities, relations, splits = read_graph(args.data_dir)
    sparse = args.negatives != "all"
    model = Kge(args.model, entities, relations, args.dim, args.init_scale, sparse)
    if args.optimizer == "adagrad":
        optimizer = torch.optim.Adagrad(model.parameters(), lr=args.lr, eps=1e-10)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    train = splits["train"]
    print(f"data: {entities} entities, {relations} relations, {train.shape[0]} training triples; "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)", flush=True)

    train_seconds, seen, steps = 0.0, 0, 0
    for epoch in range(args.epochs):
        order = torch.randperm(train.shape[0], generator=generator)
        start = time.perf_counter()
        epoch_loss, epoch_points = 0.0, 0
        for begin in range(0, train.shape[0], args.batch):
            batch = train[order[begin:begin + args.batch]]
            optimizer.zero_grad(set_to_none=True)
            loss = step_loss(model, batch, args, entities, generator)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item() * batch.shape[0]
            epoch_points += batch.shape[0]
            steps += 1
            if args.log_every and steps % args.log_every == 0:
                print(f"step {steps} loss {loss.item():.4f} "
                      f"{epoch_points / (time.perf_counter() - start):.0f} triples/s", flush=True)
            if args.max_steps and steps >= args.max_steps:
                break
        seconds = time.perf_counter() - start
        train_seconds += seconds
        seen += epoch_points
        print(f"epoch {epoch + 1}/{args.epochs}: train loss {epoch_loss / epoch_points:.4f} | "
              f"{seconds:.1f} s, {epoch_points / seconds:.0f} triples/s", flush=True)
        if args.max_steps and steps >= args.max_steps:
            break

    result = {"triples_per_s": seen / train_seconds, "train_seconds": train_seconds,
              "epochs": epoch + 1, "steps": steps}
    if not args.no_eval:
        known_tails, known_heads = {}, {}
        for split in splits.values():
            for h, r, t in split.tolist():
                known_tails.setdefault((h, r), set()).add(t)
                known_heads.setdefault((r, t), set()).add(h)
        for name in ("valid", "test"):
            start = time.perf_counter()
            metrics = evaluate(model, splits[name], known_tails, known_heads)
            print(f"{name} (filtered, both directions): " +
                  " ".join(f"{k} {v:.4f}" for k, v in metrics.items()) +
                  f" ({time.perf_counter() - start:.1f} s)", flush=True)
            result[f"{name}_mrr"] = metrics["mrr"]
    print("RESULT " + " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in result.items()), flush=True)


if __name__ == "__main__":
    main()
