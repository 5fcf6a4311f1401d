"""Wrong arguments to the Python API (fedhype.embed, partition, FedHypeVAE, evaluate) are refused at the boundary with a
ValidationError naming the argument, what was given and what to give — not a traceback from deep inside (a new-user
probe: AttributeError 'list' object has no attribute 'items', 'dim', numpy's SeedSequence TypeError, …)."""

from __future__ import annotations

import numpy as np
import pytest

import fedhype
from fedhype.errors import FedhypeWarning, ValidationError

#: the one tiny training run of this file (a model to sample from, a run folder to refuse)
TINY = dict(epsilon=4.0, rounds=1, train={"local_steps": 1, "batch_size": 16}, model={"hidden": 16, "latent": 4})


@pytest.fixture(scope="module")
def clients(real_store):
    return fedhype.partition(real_store, scheme="iid", clients=2)


@pytest.fixture(scope="module")
def tiny(real_store, clients, tmp_path_factory):
    """A FedHypeVAE fitted once (1 round, 1 step) into its own out= folder."""
    out = tmp_path_factory.mktemp("api-args") / "run"
    return fedhype.FedHypeVAE(**TINY, out=out).fit(real_store, clients)


# ---------------------------------------------------------------------------------------------------- FedHypeVAE(...)
@pytest.mark.parametrize("what, value, shown", [("train", [1, 2], "list"), ("model", "x", "'x'"),
                                                ("train", ("rounds", 2), "tuple")])
def test_train_and_model_must_be_dicts(what, value, shown):
    with pytest.raises(ValidationError, match=rf"FedHypeVAE: {what}= must be a dict of \[{what}\] keys, got {shown}"):
        fedhype.FedHypeVAE(**{what: value})


def test_out_must_be_a_path():
    with pytest.raises(ValidationError, match="FedHypeVAE: out= must be a folder path .* got 5"):
        fedhype.FedHypeVAE(out=5)
    for empty in ("", "  "):  # Path("") is the working directory: the run would be written there
        with pytest.raises(ValidationError, match="FedHypeVAE: out= is empty; give a folder for the run"):
            fedhype.FedHypeVAE(out=empty)


def test_a_keyword_and_the_same_train_key_with_different_values_are_refused():
    with pytest.raises(ValidationError, match=r"FedHypeVAE: epsilon=1 and train=\{'epsilon': 2\} both set "
                                              r"train.epsilon, to different values; give it once"):
        fedhype.FedHypeVAE(epsilon=1, train={"epsilon": 2})
    with pytest.raises(ValidationError, match=r"rounds=1 and train=\{'rounds': 2\} both set train.rounds"):
        fedhype.FedHypeVAE(rounds=1, train={"rounds": 2})
    with pytest.raises(ValidationError, match=r"no_dp=True and train=\{'no_dp': 1\}"):  # a bool is not the number 1
        fedhype.FedHypeVAE(no_dp=True, train={"no_dp": 1})
    # the same value twice is no conflict
    g = fedhype.FedHypeVAE(epsilon=2, rounds=3, train={"epsilon": 2.0, "rounds": 3})
    assert (g.train_config.epsilon, g.train_config.rounds) == (2.0, 3)


# ---------------------------------------------------------------------------------------------- fit(store, partition)
def test_fit_names_swapped_and_wrong_arguments(real_store, clients):
    g = fedhype.FedHypeVAE(**TINY)
    with pytest.raises(ValidationError, match=r"fit: the arguments are swapped: fit\(store, partition\) takes the "
                                              r"EmbeddingStore first .*fedhype.partition\(store\)"):
        g.fit(clients, real_store)
    with pytest.raises(ValidationError, match=r"fit: partition must be a Partition \(what fedhype.partition\(store\) "
                                              r"returns.*got None"):
        g.fit(real_store, None)
    with pytest.raises(ValidationError, match=r"fit: store must be an EmbeddingStore \(what fedhype.embed\(...\) "
                                              r"returns.*got 'digits-domains' \(a name or path"):
        g.fit("digits-domains", clients)
    with pytest.raises(ValidationError, match="fit: store must be an EmbeddingStore .* got Partition"):
        g.fit(clients, clients)
    with pytest.raises(ValidationError, match="fit: resume must be True or False, got 'yes'"):
        g.fit(real_store, clients, resume="yes")
    assert g.run_dir_ is None  # nothing was trained


def test_fit_speaks_of_resume_and_out_not_of_cli_flags(real_store, clients, tiny, tmp_path):
    used = tiny.run_dir_
    with pytest.raises(ValidationError, match=r"fit: the out= folder .* already holds a run; continue it with "
                                              r"fit\(store, partition, resume=True\).*another out= folder") as err:
        fedhype.FedHypeVAE(**TINY, out=used).fit(real_store, clients)
    assert "--" not in str(err.value)
    with pytest.raises(ValidationError, match=r"fit\(resume=True\): the out= folder .* holds no run to resume") as err:
        fedhype.FedHypeVAE(**TINY, out=tmp_path / "new").fit(real_store, clients, resume=True)
    assert "--" not in str(err.value) and not (tmp_path / "new").exists()
    with pytest.raises(ValidationError, match=r"fit\(resume=True\): this FedHypeVAE has no out= folder"):
        fedhype.FedHypeVAE(**TINY).fit(real_store, clients, resume=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValidationError, match="fit: out= .* is a file"):
        fedhype.FedHypeVAE(**TINY, out=tmp_path / "file").fit(real_store, clients)
    # the engine's resume refusal (other settings) in the API's words
    with pytest.raises(ValidationError, match=r"^fit\(resume=True\): the configuration differs .*train.rounds"):
        fedhype.FedHypeVAE(**{**TINY, "rounds": 2}, out=used).fit(real_store, clients, resume=True)


# ----------------------------------------------------------------------------------------------------- partition(...)
def test_partition_refuses_what_is_not_a_store():
    with pytest.raises(ValidationError, match=r"partition: store must be an EmbeddingStore \(what fedhype.embed"
                                              r"\(...\) returns\), got None"):
        fedhype.partition(None)
    with pytest.raises(ValidationError, match=r"partition: store must be an EmbeddingStore .*got 'digits-domains' "
                                              r"\(a name or path"):
        fedhype.partition("digits-domains")


def test_partition_checks_counts_fractions_and_seed(real_store):
    with pytest.raises(ValidationError, match=r"partition: clients must be a whole number ≥ 1 or None .* got 2.5"):
        fedhype.partition(real_store, scheme="iid", clients=2.5)
    with pytest.raises(ValidationError, match=r"partition: clients must be a whole number ≥ 1.* got True"):
        fedhype.partition(real_store, scheme="iid", clients=True)
    with pytest.raises(ValidationError, match=r"partition: seed must be a whole number ≥ 0, got 'x'"):
        fedhype.partition(real_store, seed="x")
    with pytest.raises(ValidationError, match=r"partition: seed must be a whole number ≥ 0, got -1"):
        fedhype.partition(real_store, seed=-1)
    with pytest.raises(ValidationError, match=r"partition: min_records must be a whole number ≥ 0"):
        fedhype.partition(real_store, min_records="20")
    with pytest.raises(ValidationError, match=r"partition: alpha must be a positive number"):
        fedhype.partition(real_store, scheme="dirichlet", clients=2, alpha="0.3")
    with pytest.raises(ValidationError, match=r"partition: scheme must be one of"):
        fedhype.partition(real_store, scheme=None)
    for bad in ("0.6;0.2;0.2", "0.6,0.2", "a,b,c", 0.6, (0.6, 0.2), (0.6, "0.2", 0.2), {"train": 0.6}):
        with pytest.raises(ValidationError, match=r"partition: fractions must be a sequence of three numbers, train, "
                                                  r"val and test, e.g. \(0.6, 0.2, 0.2\)"):
            fedhype.partition(real_store, scheme="iid", clients=2, fractions=bad)
    with pytest.warns(FutureWarning), pytest.raises(ValidationError, match="partition: split must be a sequence"):
        fedhype.partition(real_store, scheme="iid", clients=2, split="0.6")
    # the CLI's spelling is read strictly, and a sum other than 1 is still the partitioner's to refuse
    as_text = fedhype.partition(real_store, scheme="iid", clients=2, fractions=" 0.6, 0.2,0.2", seed=3)
    as_tuple = fedhype.partition(real_store, scheme="iid", clients=2.0, fractions=(0.6, 0.2, 0.2), seed=3)
    assert as_text.params == as_tuple.params and as_text.sizes() == as_tuple.sizes()
    with pytest.raises(ValidationError, match="summing to 1"):
        fedhype.partition(real_store, scheme="iid", clients=2, fractions="0.6,0.6,0.2")


# ------------------------------------------------------------------------------------------------------ evaluate(...)
def test_evaluate_takes_stores_or_store_files(real_store, clients, tmp_path):
    test = clients.split_store(real_store, "test")
    with pytest.raises(ValidationError, match=r"evaluate: real_test must be an EmbeddingStore \(the held-out real "
                                              r"embeddings.*got None"):
        fedhype.evaluate(None, test)
    with pytest.raises(ValidationError, match=r"evaluate: synthetic= 'syn.safetensors': no such store file"):
        fedhype.evaluate(test, "syn.safetensors")
    with pytest.raises(ValidationError, match=r"evaluate: real_train must be an EmbeddingStore .*got list"):
        fedhype.evaluate(test, test, real_train=[1])
    with pytest.raises(ValidationError, match=r"evaluate: k must be a whole number ≥ 1"):
        fedhype.evaluate(test, test, k="5")
    # a saved store's path is read with EmbeddingStore.load
    path = test.save(tmp_path / "test.safetensors")
    train = clients.split_store(real_store, "train")  # a real-vs-real reference (the test records themselves: refused)
    ev = fedhype.evaluate(str(path), train, permutations=0)
    assert ev.tstr_accuracy == fedhype.evaluate(test, train, permutations=0).tstr_accuracy


def test_evaluate_refuses_a_synthetic_store_as_the_real_one(real_store, clients):
    import dataclasses

    test, train = clients.split_store(real_store, "test"), clients.split_store(real_store, "train")
    syn = dataclasses.replace(train, meta={**train.meta, "kind": "synthetic"})
    assert syn.kind == "synthetic" and test.kind == "real"
    with pytest.raises(ValidationError, match=r"evaluate: the arguments are swapped: real_test= is a synthetic store "
                                              r"\(kind 'synthetic'\) and synthetic= a real one"):
        fedhype.evaluate(syn, test)
    with pytest.raises(ValidationError, match=r"evaluate: real_test= is a synthetic store"):
        fedhype.evaluate(syn, syn)
    with pytest.raises(ValidationError, match=r"evaluate: real_train= is a synthetic store"):
        fedhype.evaluate(test, syn, real_train=syn)


def test_evaluate_refuses_real_data_embedded_otherwise_and_warns_as_the_cli(real_store, clients, tiny):
    """A probe: fedhype.evaluate scored mean-pooled real records against a CLS run (TSTR 0.820 against 0.873) and a
    whole store as held-out data without a word, where `fedhype evaluate` refuses the one and warns of the other."""
    import dataclasses
    import warnings

    from fedhype.errors import ArtifactError, FedhypeWarning

    test = clients.split_store(real_store, "test")
    syn = tiny.sample(per_class=5, seed=0)
    pre = test.meta["preprocess"]
    mean_pooled = dataclasses.replace(test, meta={**test.meta, "pooling": "mean", "preprocess": {**pre, "pooling": "mean"}})
    for bad in ({"real_test": mean_pooled}, {"real_test": test, "real_train": mean_pooled}):
        which = "real_train" if "real_train" in bad else "real_test"
        with pytest.raises(ArtifactError, match=rf"evaluate: {which}= was embedded with pooling = 'mean', and the data of "
                                                 r"the run that made synthetic= with pooling = 'cls': the two are not "
                                                 r"comparable"):
            fedhype.evaluate(bad.pop("real_test"), syn, permutations=0, **bad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fedhype.evaluate(test, syn, permutations=0)  # a split: no warning
        fedhype.evaluate(real_store, syn, permutations=0)
        one = test.subset(np.flatnonzero(test.labels == 0))
        fedhype.evaluate(one, syn, permutations=0)
    said = [str(w.message) for w in caught if issubclass(w.category, FedhypeWarning)]
    assert len(said) == 2, said
    assert said[0].startswith(f"evaluate: real_test= holds all {len(real_store)} records of the store as embedded")
    assert said[1].startswith("evaluate: the real reference holds 1 class(es) (0): accuracy on it is the share of its "
                              "records predicted as that class")


# -------------------------------------------------------------------------------------------------------- sample(...)
def test_sample_checks_its_arguments_before_the_model():
    g = fedhype.FedHypeVAE()  # no model: each refusal below comes first
    from fedhype.synthesis.defaults import MAX_TEMPERATURE

    for t in (-1, 0, float("nan"), MAX_TEMPERATURE * 2, "1"):
        with pytest.raises(ValidationError,
                           match=rf"sample: temperature must be a number > 0 and ≤ {MAX_TEMPERATURE:g}"):
            g.sample(temperature=t)
    with pytest.raises(ValidationError, match="sample: anchor must be True or False .*got 'yes'"):
        g.sample(anchor="yes")
    for seed in ("x", 1.5, -1, 2 ** 70):
        with pytest.raises(ValidationError, match="sample: seed must be a whole number or None"):
            g.sample(seed=seed)
    with pytest.raises(ValidationError, match="sample: give per_class= .* or n= .*, not both"):
        g.sample(per_class=3, n=30)
    with pytest.raises(ValidationError, match="sample: per_class must be a whole number ≥ 1 or \"auto\""):
        g.sample(per_class=0)
    with pytest.raises(ValidationError, match="sample: n must be a whole number ≥ 1"):
        g.sample(n="5")
    with pytest.raises(ValidationError, match="sample: code must be a string"):
        g.sample(code=1)
    with pytest.raises(ValidationError, match="call fit"):  # valid arguments: the missing model is what is said
        g.sample(per_class=3, seed=1, temperature=0.5, anchor=False)


def test_sample_speaks_of_its_own_keywords(tiny):
    with pytest.raises(ValidationError, match=r"sample: n=5 is fewer than the 10 classes.*give n=10 or more, or "
                                              r"per_class=N") as err:
        tiny.sample(n=5)
    assert "label-weights" not in str(err.value) and "--" not in str(err.value)
    with pytest.raises(ValidationError, match=r"^sample: code='client:99': unknown client"):
        tiny.sample(per_class=2, code="client:99")
    assert len(tiny.sample(n=10, seed=1, temperature=0.5)) == 10


# --------------------------------------------------------------------------------------------------------- embed(...)
def test_embed_refuses_bad_sources_and_sizes_before_any_work(tmp_path):
    with pytest.raises(ValidationError, match=r"embed: source must be a bundled dataset name or an image folder .*"
                                              r"got None"):
        fedhype.embed(None)
    image = tmp_path / "image.png"
    image.write_bytes(b"\x89PNG")
    with pytest.raises(ValidationError, match=r"embed: '.*image.png' is a file, not a folder; embed takes a folder of "
                                              r"images .* or a bundled dataset name \(digits-domains"):
        fedhype.embed(image)
    with pytest.raises(ValidationError, match=r"embed: '.*nowhere': no such folder"):
        fedhype.embed(str(tmp_path / "nowhere"))
    # limit 0 is refused as `fedhype embed --limit 0` is (it never meant "every image": that is None)
    for limit in (0, -1, 2.5, "10"):
        with pytest.raises(ValidationError,
                           match=r"embed: limit must be a whole number ≥ 1 .* or None for every image"):
            fedhype.embed("digits-domains", limit=limit)
    for size in (0, -84, "84"):
        with pytest.raises(ValidationError, match=r"embed: image_size must be a whole number ≥ 1 \(the input side in "
                                                  r"pixels\) or None"):
            fedhype.embed("digits-domains", image_size=size)
    with pytest.raises(ValidationError, match=r"embed: seed must be a whole number ≥ 0"):
        fedhype.embed("digits-domains", seed="x")


def test_a_temporary_run_is_kept_until_a_later_fit_succeeds(real_store, clients):
    """Without out= the run lives in a temporary folder owned by the object. A probe's Ctrl-C in a second fit deleted
    the first fit's folder before the new one existed: sample() then failed with 'model not found'. A failed or
    interrupted fit now leaves the model the object had and removes only its own folder; a fit that succeeds
    replaces it."""
    import gc

    g = fedhype.FedHypeVAE(**TINY).fit(real_store, clients)
    first = g.run_dir_
    before = g.sample(per_class=2, seed=1).embeddings
    from fedhype.privacy.ledger import PrivacyLedger

    first_ledger = PrivacyLedger.load(first / "ledger.json")
    first_events = {c: [e for e in first_ledger.events if e.client == c] for c in first_ledger.clients()}

    def stop(_metrics):
        raise KeyboardInterrupt

    made = set(first.parent.parent.glob("fedhype-run-*"))
    with pytest.raises(KeyboardInterrupt):
        g.fit(real_store, clients, progress=stop)
    assert g.run_dir_ == first and (first / "model.safetensors").is_file()
    assert (g.sample(per_class=2, seed=1).embeddings == before).all()
    assert set(first.parent.parent.glob("fedhype-run-*")) == made  # the failed fit's folder is gone
    with pytest.warns(FedhypeWarning, match=r"fit: this object was already fitted once \(ε = .*the fits compose"):
        g.fit(real_store, clients)  # a helper's refit released again, and nothing said the first fit's ε still counts
    assert g.run_dir_ != first and not first.parent.exists() and (g.run_dir_ / "model.safetensors").is_file()
    # a third fit: the earlier two composed (a helper's third fit was told of one fit at ε 3.998 while 7.8 was spent)
    from fedhype.privacy.ledger import PrivacyLedger
    from fedhype.privacy.site_ledger import composed

    second = PrivacyLedger.load(g.run_dir_ / "ledger.json")
    eps = max(second.epsilons().values())
    both = max(composed([*first_events[c], *[e for e in second.events if e.client == c]], second.delta,
                        seeded_infinite=False) for c in second.clients())
    assert eps < both < 2 * eps
    with pytest.warns(FedhypeWarning) as said:
        g.fit(real_store, clients)
    note = next(str(w.message) for w in said if "already fitted" in str(w.message))
    assert f"already fitted 2 times (ε = {eps:.4g}, {eps:.4g}" in note, note
    assert f"have spent ε = {both:.4g} at δ = {second.delta:g}" in note, note
    last = g.run_dir_.parent
    del g
    gc.collect()
    assert not last.exists()


def test_embed_names_its_own_arguments_in_the_encoders_refusals(tmp_path):
    """A probe: fedhype.embed(..., image_size=113) was refused as "--image-size 113 …", a flag the API does not have."""
    from PIL import Image

    (tmp_path / "imgs" / "a").mkdir(parents=True)
    Image.new("RGB", (32, 32), 90).save(tmp_path / "imgs" / "a" / "0.png")
    for kw, start in ((dict(image_size=113), "embed: image_size=113 is not a multiple of the patch size 14; use 112 or 126"),
                      (dict(pooling="max"), "embed: pooling must be one of ['cls', 'mean'], got 'max'"),
                      (dict(dtype="float8"), "embed: dtype must be one of"),
                      (dict(device="tpu"), "embed: device must be auto, cpu or cuda, got 'tpu'")):
        with pytest.raises(ValidationError) as info:
            fedhype.embed(tmp_path / "imgs", layout="class", progress=False, cache_dir=tmp_path / "cache", **kw)
        assert str(info.value).startswith(start), str(info.value)
