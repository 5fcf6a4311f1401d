"""Evaluation on real DINOv2 embeddings of real digits (the shared ``real_store`` fixture).

A measured domain shift (MNIST vs UCI optdigits) must show up in every fidelity metric, and two
random halves of one domain must look alike.
"""

import numpy as np

from fedhype.eval import evaluate


def test_domain_shift_is_detected_and_same_domain_is_not(real_store):
    dom = real_store.domains.numpy()
    names = real_store.domain_names
    mnist = np.flatnonzero(dom == names.index("mnist"))
    optdigits = np.flatnonzero(dom == names.index("optdigits"))
    rng = np.random.default_rng(0)
    mnist = rng.permutation(mnist)
    half = len(mnist) // 2
    real_test = real_store.subset(mnist[:half])
    same = real_store.subset(mnist[half:])
    shifted = real_store.subset(optdigits)
    a = evaluate(real_test, same, n_permutations=100, seed=0, per_domain=False)
    b = evaluate(real_test, shifted, n_permutations=100, seed=0, per_domain=False)
    assert a["mmd2_p_value"] > 0.05
    assert b["mmd2_p_value"] == 1 / 101 and b["mmd2"] > 20 * max(abs(a["mmd2"]), 1e-3)
    assert b["fd"] > 3 * a["fd"]
    assert b["coverage"] < 0.5 * a["coverage"] and b["precision"] < a["precision"]
    assert a["tstr_accuracy"] > b["tstr_accuracy"] + 0.2  # MNIST→optdigits transfer is poor
    assert a["fd_warning"] is not None  # 145 records per set, D = 384
