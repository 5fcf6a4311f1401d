"""Report plots (matplotlib, Agg backend): embedding projection and training curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def projection_plot(real_x: np.ndarray, real_y: np.ndarray, syn_x: np.ndarray, syn_y: np.ndarray,
                    class_names: list[str], path: Path, max_points: int = 1500, seed: int = 0) -> Path:
    """2-D PCA (fit on the real held-out set) of real vs synthetic embeddings, one colour per class.

    Inputs are unit-normalised float arrays [N, D]; labels int [N].
    """
    from sklearn.decomposition import PCA

    plt = _plt()
    rng = np.random.default_rng(seed)
    ri = rng.permutation(len(real_x))[:max_points]
    si = rng.permutation(len(syn_x))[:max_points]
    pca = PCA(n_components=2, random_state=seed).fit(real_x)
    r2, s2 = pca.transform(real_x[ri]), pca.transform(syn_x[si])
    fig, axes = plt.subplots(1, 2, figsize=(11, 5), sharex=True, sharey=True)
    cmap = plt.get_cmap("tab10" if len(class_names) <= 10 else "tab20")
    for ax, pts, lab, title in ((axes[0], r2, real_y[ri], "real (held-out test)"), (axes[1], s2, syn_y[si], "synthetic")):
        for c, name in enumerate(class_names):
            m = lab == c
            ax.scatter(pts[m, 0], pts[m, 1], s=6, alpha=0.6, color=cmap(c % cmap.N), label=name)
        ax.set_title(title)
        ax.set_xlabel("PC1 (fit on real)")
    axes[0].set_ylabel("PC2")
    axes[1].legend(markerscale=3, fontsize=7, loc="best", ncol=2)
    fig.suptitle("Real vs synthetic embeddings per class (PCA of the real test set)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def training_plot(metrics: list[dict], path: Path, *, release_epsilon: float | None = None,
                  target_epsilon: float | None = None) -> Path:
    """ε after the release and after each round (accountant, worst client) beside the target, and the
    held-out diagnostics (−ELBO, MMD²; not covered by DP)."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    plt = _plt()
    rounds = [m["round"] + 1 for m in metrics]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    eps = [m.get("epsilon") for m in metrics]
    ax = axes[0]
    if any(e is not None for e in eps) or release_epsilon is not None:
        xs = ([0] if release_epsilon is not None else []) + rounds
        ys = ([release_epsilon] if release_epsilon is not None else []) + [e if e is not None else np.nan for e in eps]
        ax.plot(xs, ys, marker="o", label="ε spent")
        if target_epsilon is not None:
            ax.axhline(target_epsilon, color="tab:red", linestyle="--", linewidth=1, label=f"target ε = {target_epsilon:g}")
        if len(xs) <= 16:
            ax.set_xticks(xs, [("release" if x == 0 else str(x)) for x in xs])
        top = max([v for v in ys if v == v] + [target_epsilon or 0.0])
        ax.set_ylim(0, 1.15 * top if top > 0 else 1)
        ax.legend(loc="lower right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "non-private run: no ε", ha="center", va="center", transform=ax.transAxes)
    ax.set_title("ε spent so far (worst client)")
    for ax, key, title in ((axes[1], "val_neg_elbo", "validation −ELBO"), (axes[2], "val_mmd2", "validation MMD² (fixed kernel)")):
        vals = [m.get("diagnostics_not_dp", {}).get(key, np.nan) for m in metrics]
        ax.plot(rounds, vals, marker="o", color="tab:orange")
        ax.set_title(title + "\n(held-out diagnostics, not DP)", fontsize=9)
        fmt = ScalarFormatter(useOffset=False)
        fmt.set_powerlimits((-3, 4))
        ax.yaxis.set_major_formatter(fmt)
    axes[0].set_xlabel("round (release: the DP statistics before round 1)")
    for ax in axes[1:]:
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def code_domain_plot(matrix: dict, path: Path) -> Path:
    """Heat map of the code × domain MMD² matrix (:func:`fedhype.eval.domains.code_domain_matrix`), row minimum marked."""
    plt = _plt()
    m = np.asarray(matrix["mmd2"], dtype=float)
    fig, ax = plt.subplots(figsize=(1.2 * m.shape[1] + 2.5, 0.5 * m.shape[0] + 1.8))
    im = ax.imshow(m, cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(m.shape[1]), matrix["domains"], rotation=30, ha="right")
    ax.set_yticks(range(m.shape[0]), matrix["codes"])
    for i in range(m.shape[0]):
        j = int(np.argmin(m[i]))
        ax.text(j, i, "●", ha="center", va="center", color="white", fontsize=9)
    ax.set_xlabel("real test split (domain)")
    ax.set_title("MMD² of each code's samples (● row minimum)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
