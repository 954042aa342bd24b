"""Train an MLP and a small CNN on scikit-learn's digits (8x8 images, no download) with eqgrad.

Each step -- forward, backward and the Adam update -- is one lazy graph planned as one program;
``@eqgrad.jit`` captures its kernels on the first calls and replays them.

    python examples/train_digits.py                 # both models (~15 s on 2 cores, mostly compiling)
    python examples/train_digits.py --models mlp --epochs 20
"""
import argparse
import time

import numpy as np
from sklearn.datasets import load_digits
from tqdm import tqdm

import eqgrad
from eqgrad import Tensor, nn, optim
import eqgrad.nn.functional as F


def load(seed: int = 0):
    """1797 digits, shuffled and split 80/20; pixels scaled to [0, 1]."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y, n = (x[order] / 16.0).astype(np.float32), y[order].astype(np.int32), int(len(x) * 0.8)
    return x[:n], y[:n], x[n:], y[n:]


class MLP(nn.Module):
    def __init__(self):
        self.l1, self.l2 = nn.Linear(64, 128), nn.Linear(128, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


class CNN(nn.Module):
    def __init__(self):
        self.c1, self.c2 = nn.Conv2d(1, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(self.c1(x.reshape(-1, 1, 8, 8)).relu(), 2)      # 16 x 4 x 4
        x = F.max_pool2d(self.c2(x).relu(), 2)                           # 32 x 2 x 2
        return self.fc(x.flatten(1))


def train(name: str, epochs: int, batch: int = 64, lr: float = 1e-2, seed: int = 0, progress: bool = True) -> dict:
    """Train "mlp" or "cnn"; returns the test accuracy and timings."""
    xtr, ytr, xte, yte = load(seed)
    eqgrad.manual_seed(seed)
    model = MLP() if name == "mlp" else CNN()
    opt = optim.Adam(nn.state.get_parameters(model), lr=lr)
    steps = len(xtr) // batch                       # a fixed batch shape: one capture for the JIT
    sched = optim.CosineAnnealingLR(opt, T_max=epochs * steps)

    @eqgrad.jit
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y, label_smoothing=0.05)
        loss.backward()
        opt.step(loss)                              # forward + backward + update: one program
        return loss

    rng, times = np.random.default_rng(seed), []
    with tqdm(total=epochs * steps, desc=name, disable=not progress) as bar:
        for _ in range(epochs):
            order = rng.permutation(len(xtr))
            for i in range(steps):
                idx = order[i * batch:(i + 1) * batch]
                t0 = time.perf_counter()
                loss = step(Tensor(xtr[idx]), Tensor(ytr[idx]))
                times.append(time.perf_counter() - t0)
                sched.step()                        # outside the jitted step: writes the lr buffer
                if i % 10 == 0:
                    bar.set_postfix(loss=f"{loss.item():.3f}", ms_per_step=f"{np.median(times[-10:]) * 1e3:.2f}")
                bar.update(1)
    model.eval()
    with eqgrad.no_grad():
        logits = model(Tensor(xte)).realize()       # realized first: argmax compares with its max
        acc = (logits.argmax(1) == Tensor(yte)).float().mean().item()
    return dict(model=name, accuracy=acc, steps=len(times), first_step_s=times[0],
                median_step_ms=float(np.median(times[2:]) * 1e3), final_loss=loss.item())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--epochs", type=int, default=0, help="default: 10 for the MLP, 6 for the CNN")
    args = ap.parse_args()
    for name in args.models.split(","):
        r = train(name, args.epochs or {"mlp": 10, "cnn": 6}[name])
        print(f"{name}: test accuracy {r['accuracy'] * 100:.1f}% after {r['steps']} steps; first step "
              f"(compile) {r['first_step_s']:.1f} s, then {r['median_step_ms']:.2f} ms per step (median, jitted)")
        assert r["accuracy"] >= 0.97, f"{name} reached only {r['accuracy']:.3f}"


if __name__ == "__main__":
    main()
