"""Hyper-prototypes (FedHPro, Wang et al., ICML 2026) for downstream classifiers on embeddings.

A small trainable adapter on frozen embeddings, a linear head and K × L learnable hyper-prototypes
matched to class-wise gradients with a whole-vector cosine distance (docs/method.md, decision 7):

* :class:`HyperPrototypeClassifier` — the scikit-learn estimator (fit / predict / save / load);
* :func:`fit_federated` — FedHPro rounds over in-process clients (FedAvg of adapter + head);
* :func:`prototypes_downstream` — the run pipeline's call: hyper-prototypes vs a linear probe,
  trained on a synthetic store, tested on held-out real embeddings;
* :func:`anchored_downstream` — hyper-prototypes as global anchors of each client's own local training
  (trained from the synthetic store; :func:`anchored_classifier` for one client), against the client alone
  and FedProto-style class means (:mod:`.anchored`);
* :func:`~fedhype.prototypes.dp_linear.dp_linear_downstream` — the reference trained directly on
  the clients' real embeddings: DP-SGD FedAvg logistic regression (:mod:`.dp_linear`, its own ε).
"""

from fedhype.prototypes.anchored import (ANCHORS, VARIANTS, anchored_classifier, anchored_downstream, class_mean_anchors,
                                        fit_local, synthetic_model)
from fedhype.prototypes.classifier import HEADS, MATCHING, HyperPrototypeClassifier
from fedhype.prototypes.downstream import prototypes_downstream
from fedhype.prototypes.dp_linear import DPLinearConfig, DPLinearModel, dp_linear_downstream, fit_dp_fedavg_linear
from fedhype.prototypes.federated import fedavg, fit_federated
from fedhype.prototypes.matching import gradient_distance

__all__ = ["ANCHORS", "VARIANTS", "anchored_classifier", "anchored_downstream", "class_mean_anchors", "fit_local",
           "synthetic_model", "DPLinearConfig", "DPLinearModel", "HEADS", "MATCHING", "HyperPrototypeClassifier", "dp_linear_downstream",
           "fedavg", "fit_dp_fedavg_linear", "fit_federated", "gradient_distance", "prototypes_downstream"]
