"""Synthesis defaults that the configuration and the CLI read without importing torch (their one source)."""

#: Whether synthesis anchors each code's class means to the statistics release's (:mod:`fedhype.synthesis.anchor`).
#: Off: on the validation split it halves the class-mean error and brings MMD² below the release alone's, but costs
#: TSTR (ours, all 70,000 Fashion-MNIST images, ε = 4: −0.003 in each of 3 seeds); an option, as
#: ``model.located_share`` is (benchmarks/results/class_anchor.md, docs/method.md decision 18)
DEFAULT_ANCHOR = False

#: The largest ``temperature`` (the factor on the prior's standard deviation) synthesis takes: far beyond any use
#: (1 is the model's distribution), and below the float32 overflow that made a probe's 1e20 write all-zero vectors
MAX_TEMPERATURE = 100.0

#: The kinds of a synthetic store's ``meta["notes"]`` (:func:`fedhype.synthesis.synthesize`) that are warnings, not
#: notes: samples of classes the release cannot tell from absent (DP noise, not data), classes left without a
#: sample, a model whose ε and its run ledger's differ. ``fedhype synthesize`` and ``fedhype run`` print them so.
WARNING_NOTES = ("absent", "empty", "epsilon")
