"""Data-parallel training with the framework-free API: a softmax classifier on the
8x8 digits that ship with scikit-learn, gradients averaged across ranks by horovodlike.

    horovodlikerun -np 2 python examples/numpy_digits.py
    mpirun -np 2 python examples/numpy_digits.py
    python examples/numpy_digits.py
"""
import argparse
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovodlike as hvd


def softmax_grad(w, b, x, y):
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return x.T @ p / len(y), p.mean(axis=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.5)
    args = ap.parse_args()

    hvd.init()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0)
    # Each rank trains on its own shard; the allreduce makes it one model.
    x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]

    rng = np.random.default_rng(hvd.rank())          # different on purpose...
    w = rng.normal(0, 0.01, (64, 10)).astype(np.float32)
    b = np.zeros(10, np.float32)
    w = hvd.broadcast(w, root_rank=0, name="w0")     # ...until rank 0's weights win
    b = hvd.broadcast(b, root_rank=0, name="b0")

    lr = args.lr * hvd.size()**0.5                   # scale the learning rate
    steps = len(x_train) // args.batch_size
    t0 = time.time()
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch * 100 + hvd.rank()).permutation(len(x_train))
        for s in range(steps):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            gw, gb = softmax_grad(w, b, x_train[idx], y_train[idx])
            hw = hvd.allreduce_async(gw.astype(np.float32), name="grad.w")
            hb = hvd.allreduce_async(gb.astype(np.float32), name="grad.b")
            w -= lr * hvd.synchronize(hw)
            b -= lr * hvd.synchronize(hb)
    elapsed = time.time() - t0

    acc = float(((x_test @ w + b).argmax(axis=1) == y_test).mean())
    mean_acc = hvd.allreduce(np.array([acc]), name="acc")[0]
    same = hvd.allreduce(w, op=hvd.Max, name="wmax") - hvd.allreduce(w, op=hvd.Min, name="wmin")
    if hvd.rank() == 0:
        print(f"trained a softmax classifier on {len(digits.target)} digits with "
              f"{hvd.size()} rank(s), {args.epochs} epochs of {steps} steps "
              f"({2 * steps * args.epochs} allreduces) in {elapsed:.2f} s")
        print(f"test accuracy {mean_acc:.3f} (averaged over ranks); weights identical on "
              f"every rank: {bool(np.all(same == 0))}")


if __name__ == "__main__":
    main()
