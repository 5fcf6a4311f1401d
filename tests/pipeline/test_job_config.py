"""A job folder whose training started refuses other settings, naming what differs."""

import json

import pytest

from fedhype.errors import ArtifactError, ValidationError
from fedhype.pipeline.config import resolve
from fedhype.pipeline.job import run_job


def test_a_started_job_names_the_setting_that_differs(tmp_path):
    out = tmp_path / "job"
    (out / "run").mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(resolve(None, ["train.epsilon=1"])))
    (out / "run" / "config.json").write_text("{}")  # training had started
    with pytest.raises(ValidationError, match=r"train\.epsilon: 1 → 4"):
        run_job(resolve(None, ["train.epsilon=4"]), out, log=lambda s: None)


def test_config_toml_round_trips_any_string_and_lists_what_is_unset(tmp_path):
    import tomllib

    from fedhype.pipeline.config import resolve, to_toml

    odd = 'C:\\images\\site "a"\\'  # backslashes and quotes: the old hand-written writer emitted invalid TOML
    conf = resolve(None, [f"data.images='{odd}'"])  # a TOML literal string: taken as written
    assert conf["data"]["images"] == odd
    text = to_toml(conf)
    back = tomllib.loads(text)
    assert back["data"]["images"] == conf["data"]["images"]
    assert text.startswith("# not set (none): ") and "train.noise_multiplier" in text.splitlines()[0]
    (tmp_path / "job.toml").write_text(text)
    assert resolve(tmp_path / "job.toml") == conf  # the written file reproduces the job
    # the bundled dataset's name is not written beside an image folder (a helper read it as the job's data)
    assert "dataset" not in back["data"] and "# data.dataset is not used: data.images names the real data" in text
    assert tomllib.loads(to_toml(resolve(None)))["data"]["dataset"] == "digits-domains"


def test_data_store_takes_an_existing_real_store_and_refuses_the_rest(real_store, tmp_path):
    import pytest
    import torch

    from fedhype.data.store import EmbeddingStore
    from fedhype.errors import ValidationError
    from fedhype.pipeline.config import resolve
    from fedhype.pipeline.job import embed_store

    real_store.save(tmp_path / "emb.safetensors")
    conf = resolve(None, [f"data.store='{tmp_path / 'emb.safetensors'}'"])
    got = embed_store(conf["data"], progress=False)
    assert torch.equal(got.embeddings, real_store.embeddings) and got.sample_ids == real_store.sample_ids
    syn = EmbeddingStore(real_store.embeddings[:10], real_store.labels[:10], real_store.domains[:10],
                         real_store.sample_ids[:10], real_store.class_names, real_store.domain_names, {"kind": "synthetic"})
    syn.save(tmp_path / "syn.safetensors")
    with pytest.raises(ArtifactError, match="is a 'synthetic' store"):
        embed_store(resolve(None, [f"data.store='{tmp_path / 'syn.safetensors'}'"])["data"])
    with pytest.raises(ValidationError, match="data.store = .*: no such file"):
        embed_store(resolve(None, [f"data.store='{tmp_path / 'nope.safetensors'}'"])["data"])
    with pytest.raises(ValidationError, match="data.images .* and data.store .* both name the real data"):
        resolve(None, [f"data.store='{tmp_path / 'emb.safetensors'}'", f"data.images='{tmp_path}'"])
    # embedding settings the store contradicts are refused, not recorded as if used (a new user's probe)
    emb = f"data.store='{tmp_path / 'emb.safetensors'}'"
    crop = real_store.meta["preprocess"]["crop"]
    for extra, msg in (("data.limit=60", "data.limit = 60"), ("data.image_size=224", f"embedded at {crop} px"),
                       ("data.encoder='bogus'", "data.encoder = 'bogus'"), ("data.pooling='mean'", "data.pooling = 'mean'"),
                       ("data.layout='class'", "data.layout = 'class'")):
        with pytest.raises(ValidationError, match=msg):
            embed_store(resolve(None, [emb, extra])["data"])
    got = embed_store(resolve(None, [emb, f"data.image_size={crop}", f"data.encoder='{real_store.meta['encoder']}'"])["data"])
    assert len(got) == len(real_store)  # the store's own settings, spelled out, are fine


def test_no_dp_beside_a_config_files_privacy_setting_is_refused_naming_both(tmp_path):
    """A probe's `--config job.toml --set train.no_dp=true` (job.toml: epsilon = 2.0) ran the whole job without
    privacy and without a word. Any user layer's ε, σ or max ε beside train.no_dp = true from any layer is refused,
    naming both sources and how to ask for either run; the bundled defaults' ε (TrainConfig's 1.0) is no request."""
    job = tmp_path / "job.toml"
    job.write_text("[train]\nepsilon = 2.0\n")
    with pytest.raises(ValidationError) as err:
        resolve(job, ["train.no_dp=true"])
    assert str(err.value) == (
        f"{job} sets train.epsilon = 2.0 and --set train.no_dp=true turns DP off: a job is never silently run without "
        f"the privacy it asks for (nothing was done); for a non-private run use a config without train.epsilon (drop "
        f"it from {job} and set train.no_dp = true there, or unset it here with --set train.epsilon=none); for a "
        f"private run drop --set train.no_dp=true")
    for key, value in (("noise_multiplier", "1.5"), ("max_epsilon", "3.0")):
        (tmp_path / f"{key}.toml").write_text(f"[train]\n{key} = {value}\n")
        with pytest.raises(ValidationError, match=rf"{key}.toml sets train.{key} = {value} and --set train.no_dp=true "
                                                  r"turns DP off"):
            resolve(tmp_path / f"{key}.toml", ["train.no_dp=true"])
    # the Python API's no_dp over a config file's ε: the same refusal
    with pytest.raises(ValidationError, match=r"job.toml sets train.epsilon = 2.0 and FedHypeVAE: no_dp = True turns DP off"):
        resolve(job, values={"train.no_dp": True}, where="FedHypeVAE:")
    # the other order: a file's no_dp and a later ε
    off = tmp_path / "off.toml"
    off.write_text("[train]\nno_dp = true\n")
    with pytest.raises(ValidationError) as err:
        resolve(off, ["train.epsilon=4"])
    assert str(err.value).startswith(f"--set train.epsilon=4 asks for privacy and {off} sets train.no_dp = true: ")
    assert str(err.value).endswith(f"for a private run drop train.no_dp from {off} (or add --set train.no_dp=false); "
                                   "for a non-private run drop --set train.epsilon=4")
    # both in one file
    both = tmp_path / "both.toml"
    both.write_text("[train]\nno_dp = true\nepsilon = 2.0\n")
    with pytest.raises(ValidationError, match=r"both.toml sets both train.epsilon = 2.0 and train.no_dp = true; a job is "
                                              r"private or not \(nothing was done\): drop one of the two"):
        resolve(both)
    # what the refusals offer works: ε unset by a later layer, no_dp in the file alone, the defaults' ε alone
    conf = resolve(job, ["train.no_dp=true", "train.epsilon=none"])
    assert conf["train"]["no_dp"] is True and conf["train"]["epsilon"] is None
    assert resolve(off)["train"]["no_dp"] is True and resolve(off)["train"]["epsilon"] is None
    assert resolve(None, ["train.no_dp=true"])["train"]["epsilon"] is None
    assert resolve(job, ["train.no_dp=false"])["train"]["epsilon"] == 2.0
    # a written config.toml of a non-private job leaves ε out and resolves again (resume with --config)
    from fedhype.pipeline.config import to_toml

    (tmp_path / "written.toml").write_text(to_toml(conf))
    assert resolve(tmp_path / "written.toml") == conf


def test_partition_alpha_without_the_dirichlet_scheme_is_refused(tmp_path):
    """A probe's ``partition.alpha = 0.05`` with the default scheme "domain" was ignored silently; a config
    file's default value (a written config.toml lists every key) and alpha with scheme "dirichlet" are taken."""
    with pytest.raises(ValidationError, match=r"--set partition.alpha=0.05: partition.alpha applies to "
                                              r"partition.scheme = \"dirichlet\" only .* the scheme is 'domain'"):
        resolve(None, ["partition.alpha=0.05"])
    with pytest.raises(ValidationError, match="partition.alpha applies"):  # the default value too, on the command line
        resolve(None, ["partition.alpha=0.3"])
    (tmp_path / "written.toml").write_text('[partition]\nscheme = "domain"\nalpha = 0.3\n')
    assert resolve(tmp_path / "written.toml")["partition"]["alpha"] == 0.3
    conf = resolve(None, ["partition.alpha=0.05", "partition.scheme='dirichlet'", "partition.clients=4"])
    assert conf["partition"]["alpha"] == 0.05


@pytest.mark.parametrize("setting", ["data.store=", 'data.store=""', "data.images=''"])
def test_an_empty_data_store_or_folder_on_the_command_line_is_refused(setting, tmp_path):
    """A probe's ``--set data.store=`` trained on the bundled digits instead of refusing; a written
    config.toml (which lists every key, empty ones included) still reads as before."""
    with pytest.raises(ValidationError, match=r"data\.(store|images) is empty"):
        resolve(None, [setting])
    (tmp_path / "job.toml").write_text('[data]\nstore = ""\nimages = ""\n')
    assert resolve(tmp_path / "job.toml")["data"]["store"] == ""


def test_old_partition_keys_are_read_under_the_clis_names_with_a_warning(tmp_path):
    # the job keys are the CLI's words (--fractions, --min-records); the old ones still work, saying so
    (tmp_path / "job.toml").write_text("[partition]\nsplit = [0.5, 0.25, 0.25]\nmin_train = 7\n")
    said = []
    conf = resolve(tmp_path / "job.toml", ["partition.min_train=9"], warn=said.append)
    assert conf["partition"]["fractions"] == [0.5, 0.25, 0.25] and conf["partition"]["min_records"] == 9
    assert "split" not in conf["partition"] and "min_train" not in conf["partition"]
    assert len(said) == 3 and all("is deprecated" in m for m in said)
    assert "partition.split" in said[0] and "use partition.fractions" in said[0] and str(tmp_path / "job.toml") in said[0]
    assert "--set partition.min_train=9" in said[2] and "use partition.min_records" in said[2]
    with pytest.warns(FutureWarning, match="partition.min_records"):
        assert resolve(None, ["partition.min_train=3"])["partition"]["min_records"] == 3
    assert resolve(None, ["partition.fractions=[0.8, 0.1, 0.1]"], warn=said.append)["partition"]["fractions"] == [0.8, 0.1, 0.1]
    assert len(said) == 3  # the new names say nothing
    # the old and the new name of one setting in the same layer: refused, naming both
    (tmp_path / "both.toml").write_text("[partition]\nsplit = [0.6, 0.2, 0.2]\nfractions = [0.5, 0.25, 0.25]\n")
    with pytest.raises(ValidationError, match=r"partition.fractions and partition.split .* give only partition.fractions"):
        resolve(tmp_path / "both.toml", warn=said.append)
    with pytest.raises(ValidationError, match="old and new names"):
        resolve(None, ["partition.fractions=[0.8, 0.1, 0.1]", "partition.split=[0.6, 0.2, 0.2]"], warn=said.append)
    # a later layer may override an earlier one under either name
    assert resolve(tmp_path / "job.toml", ["partition.fractions=[0.8, 0.1, 0.1]"],
                   warn=said.append)["partition"]["fractions"] == [0.8, 0.1, 0.1]


def test_bundled_configs_use_the_current_keys():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for cfg in sorted((root / "configs").glob("*.toml")):
        said = []
        resolve(cfg, warn=said.append)
        assert said == [], cfg  # no deprecated key in what we ship
    for script in sorted((root / "benchmarks").glob("*.py")):  # nor in the benchmarks that read a job's partition
        text = script.read_text()
        assert '["split"]' not in text and '["min_train"]' not in text, script


def test_a_job_folder_written_with_the_old_partition_keys_resumes(tmp_path):
    from fedhype.pipeline.config import upgrade_keys

    conf = resolve(None, ["train.epsilon=1"])
    old = json.loads(json.dumps(conf))
    old["partition"]["split"] = old["partition"].pop("fractions")
    old["partition"]["min_train"] = old["partition"].pop("min_records")
    assert upgrade_keys(json.loads(json.dumps(old))) == json.loads(json.dumps(conf))
    out = tmp_path / "job"
    (out / "run").mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(old))
    (out / "run" / "config.json").write_text("{}")  # training had started: only the same settings may resume
    with pytest.raises(ValidationError, match=r"train\.epsilon: 1 → 4") as err:  # a real difference is still named
        run_job(resolve(None, ["train.epsilon=4"]), out, log=lambda s: None)
    assert "partition" not in str(err.value)  # and the renamed keys are not differences


@pytest.mark.parametrize("sets, msg", [
    (["partition.scheme='iid'", "partition.clients=-3"], r"^partition.clients = -3: partition.scheme = 'iid' needs the "
                                                          r"number of clients, an integer ≥ 1"),
    (["partition.clients=-3"], r"^partition.clients = -3: give the number of clients, an integer ≥ 1, or 0 for one "
                               r"client per domain; nothing was embedded$"),
    (["partition.scheme='dirichlet'", "partition.clients=4", "partition.alpha=0"],
     r"^partition.alpha = 0: the Dirichlet concentration must be a number > 0"),
    (["partition.fractions=[0.5, 0.5, 0.5]"], r"^partition.fractions = \[0.5, 0.5, 0.5\]: give three fractions, train, "
                                              r"val and test, each ≥ 0 with train > 0, summing to 1 \(e.g. \[0.6, 0.2, "
                                              r"0.2\]\); these sum to 1.5; nothing was embedded$"),
    # a probe's two fractions: "error:  (scheme = 'domain', clients = 0): …" (no field named; no clients asked)
    (["partition.fractions=[0.5, 0.5]"], r"^partition.fractions = \[0.5, 0.5\]: give three fractions, train, val and "
                                         r"test, each ≥ 0 with train > 0, summing to 1 \(e.g. \[0.6, 0.2, 0.2\]\); "
                                         r"nothing was embedded$"),
    (["partition.fractions='abc'"], r"^partition.fractions = 'abc': give three fractions"),
    (["partition.min_records=-1"], r"^partition.min_records = -1: the smallest client training set must be an integer ≥ 0"),
    (["partition.scheme='bogus'"], r"^partition.scheme = 'bogus': unknown scheme; expected one of domain, dirichlet, iid"),
])
def test_bad_partition_settings_are_refused_before_the_embedding(tmp_path, monkeypatch, sets, msg):
    """`fedhype run --set partition.clients=-3 …` embedded 6,797 images for 6 minutes and then refused the partition
    (a new user's probe); the [partition] section is now checked with the others, before anything runs."""
    import fedhype.pipeline.job as job

    def no_embedding(*a, **k):
        raise AssertionError("embedded before the partition settings were checked")

    monkeypatch.setattr(job, "_embed_store", no_embedding)
    with pytest.raises(ValidationError, match=msg) as err:
        run_job(resolve(None, sets), tmp_path / "job", log=lambda s: None)
    assert "clients = 0" not in str(err.value) and "[" + "partition]" not in str(err.value)  # (rich ate "[partition]")
    assert not (tmp_path / "job").exists()  # nothing written either


def test_a_class_with_few_training_records_is_named_before_training(real_store):
    """A class of one image trained without a word (a new user's probe, TSTR 0.250 against chance 0.200)."""
    import torch

    from fedhype.data.partition import make_partition
    from fedhype.data.store import EmbeddingStore
    from fedhype.pipeline.job import thin_classes

    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    assert thin_classes(part, real_store) is None  # every class of the test store has dozens
    keep = (real_store.labels != 3) | (torch.arange(len(real_store)) < 0)
    first3 = [i for i in range(len(real_store)) if int(real_store.labels[i]) == 3][:4]  # 4 records of class 3 left
    idx = [i for i in range(len(real_store)) if bool(keep[i]) or i in first3]
    small = EmbeddingStore(real_store.embeddings[idx], real_store.labels[idx], real_store.domains[idx],
                           [real_store.sample_ids[i] for i in idx], real_store.class_names, real_store.domain_names,
                           real_store.meta)
    part = make_partition(small, scheme="iid", n_clients=2, min_train_per_client=0, seed=0)
    w = thin_classes(part, small)
    n3 = int((part.split_store(small, "train").labels == 3).sum())
    assert n3 < 4 and w is not None and f"{real_store.class_names[3]!r} ({n3})" in w and "fewer than 10" in w


def test_a_misspelt_key_or_section_is_refused_naming_the_closest_one(tmp_path):
    """A probe's job file with ``epsilom`` listed the 26 known keys; the closest is named first."""
    from fedhype.errors import ValidationError
    from fedhype.pipeline.config import resolve

    with pytest.raises(ValidationError, match=r"unknown key train\.epsilom \(did you mean train\.epsilon\?\)"):
        resolve(None, ["train.epsilom=1"])
    with pytest.raises(ValidationError, match=r"unknown section 'trian' \(did you mean 'train'\?\)"):
        resolve(None, ["trian.epsilon=1"])
    with pytest.raises(ValidationError) as e:
        resolve(None, ["train.zzzzzz=1"])
    assert "did you mean" not in str(e.value) and "known:" in str(e.value)


def test_a_store_that_is_a_folder_is_named_as_a_folder(tmp_path):
    from fedhype.errors import ValidationError
    from fedhype.pipeline.job import _embed_store

    with pytest.raises(ValidationError, match="is a folder, not a file"):
        _embed_store({"store": str(tmp_path)}, progress=False)


def test_a_setting_left_out_and_the_same_setting_at_its_default_are_one_job():
    """``fedhype run`` compares a job's settings with its folder's to resume (a probe: a job begun without
    ``--set train.min_records=20``, or without the bundled configs/digits-domains.toml, which spells the defaults
    out with image_size = 112 for the default 0, was refused as "a different configuration")."""
    from pathlib import Path

    from fedhype.federated.config import TrainConfig
    from fedhype.federated.run_plan import _differences
    from fedhype.pipeline.config import resolve, with_defaults_spelled_out as spelled

    bare = spelled(resolve(None, []))
    root = Path(__file__).resolve().parents[2]
    assert _differences(bare, spelled(resolve(root / "configs" / "digits-domains.toml", []))) == []
    assert spelled(resolve(None, [f"train.min_records={TrainConfig.min_records}"])) == bare
    assert bare["train"]["min_records"] == TrainConfig.min_records and "lr_server" in bare["train"]
    assert bare["data"]["image_size"] == 112  # the bundled encoder's default size
    # a different value, or another encoder's default size, stays a difference
    assert _differences(bare, spelled(resolve(None, ["train.min_records=21"]))) == [
        f"train.min_records: {TrainConfig.min_records} → 21"]
    assert _differences(bare, spelled(resolve(None, ["data.image_size=224"]))) == ["data.image_size: 112 → 224"]
    other = spelled(resolve(None, ['data.encoder="timm:vit_small_patch16_224"']))
    assert other["data"]["image_size"] == 0


def test_a_target_epsilon_no_noise_can_meet_is_refused_before_the_embedding(tmp_path, monkeypatch):
    """A probe's `fedhype run --set train.epsilon=1e9` embedded for 10 minutes, then failed naming --epsilon: the
    statistics release is one un-subsampled Gaussian step, whose σ₀ needs no record count, so it is checked first."""
    import fedhype.pipeline.job as job
    from fedhype.pipeline.config import resolve

    def no_embedding(*a, **k):
        raise AssertionError("embedded before the refusal")

    monkeypatch.setattr(job, "_embed", no_embedding)
    with pytest.raises(ValidationError) as err:
        job.run_job(resolve(None, ["train.epsilon=1e9"]), tmp_path / "absurd", log=lambda s: None)
    assert str(err.value) == ("target ε = 1e+09 (train.epsilon) at δ = 0.0001 (train.delta): the statistics release's "
                              "share, 0.95 × ε = 9.5e+08, is met even by σ < 1e-4; lower train.epsilon (nothing was "
                              "done)")
    assert not (tmp_path / "absurd").exists()


def test_a_config_file_of_another_kind_is_an_artifact_error_and_a_toml_typo_a_validation_error(real_store, tmp_path):
    """A probe's `fedhype run --config emb.safetensors` exited 2 ("not valid TOML"), where the README's exit codes say
    4 for a file of another kind than the option asks; a typo in a TOML file stays a usage error (2)."""
    from fedhype.errors import ArtifactError

    store = tmp_path / "emb.safetensors"
    real_store.save(store)
    card = tmp_path / "card.json"
    card.write_text(json.dumps({"name": "a", "n_train": 10}))
    typo = tmp_path / "job.toml"
    typo.write_text("[train]\nepsilon 2\n")
    with pytest.raises(ArtifactError, match=r"emb\.safetensors: not a text file .*TOML") as binary:
        resolve(str(store))
    with pytest.raises(ArtifactError, match=r"card\.json: a JSON file, not TOML"):
        resolve(str(card))
    with pytest.raises(ValidationError, match=r"job\.toml: not valid TOML") as text:
        resolve(str(typo))
    assert (binary.value.exit_code, text.value.exit_code) == (4, 2)


def test_a_job_resumed_from_another_folder_or_with_another_spelling_of_its_paths_is_the_same_job(tmp_path, monkeypatch,
                                                                                                 real_store):
    """A helper's rerun from `/` with the absolute path of the folder it gave as `data` was refused as "a different
    configuration (data.images: 'data' → '/tmp/…/data')". The job records data.images / data.store as absolute paths
    and compares them resolved; a real difference is still named, and a store file that now holds other records than
    the job's copy of it is refused (it was used silently)."""
    from fedhype.pipeline.job import absolute_paths

    real_store.save(tmp_path / "s.safetensors")
    monkeypatch.chdir(tmp_path)
    conf = absolute_paths(resolve(None, ["data.store='s.safetensors'", "train.epsilon=1"]))
    assert conf["data"]["store"] == str(tmp_path / "s.safetensors")
    out = tmp_path / "job"
    (out / "run").mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(conf))  # as the job writes it now (a relative path before)
    (out / "run" / "config.json").write_text("{}")  # training had started: only the same settings may resume
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    for spelled in (str(tmp_path / "s.safetensors"), "../s.safetensors"):
        with pytest.raises(ValidationError, match=r"train\.epsilon: 1 → 4") as err:  # the real difference, alone
            run_job(resolve(None, [f"data.store='{spelled}'", "train.epsilon=4"]), out, log=lambda s: None)
        assert "data.store" not in str(err.value), str(err.value)
    # the job's copy of its store, and the store file now holding other records
    from fedhype.pipeline import job as job_mod

    real_store.save(out / "embeddings.safetensors")
    real_store.subset(list(range(100))).save(tmp_path / "s.safetensors")
    with pytest.raises(ValidationError, match=r"now holds other records than the job embedded from it"):
        job_mod._embed(conf, out, lambda s: None, reuse=True)


def test_a_config_toml_edited_by_hand_is_kept_aside_and_said_so(tmp_path):
    """A helper edited train.epsilon in a job folder's config.toml and reran: the edit was ignored, then overwritten
    without a word. The edited file is kept as config.edited.toml, with a warning saying how to run it; the file as
    the job wrote it says nothing."""
    from fedhype.pipeline.config import to_toml
    from fedhype.pipeline.job import _keep_edited_toml, absolute_paths

    conf = absolute_paths(resolve(None, ["train.epsilon=1"]))
    (tmp_path / "config.toml").write_text(to_toml(conf))
    said: list[str] = []
    _keep_edited_toml(tmp_path, json.loads(json.dumps(conf)), said.append)
    assert said == [] and not (tmp_path / "config.edited.toml").exists()
    text = to_toml(conf).replace("epsilon = 1", "epsilon = 8")
    assert text != to_toml(conf)
    (tmp_path / "config.toml").write_text(text)
    _keep_edited_toml(tmp_path, json.loads(json.dumps(conf)), said.append)
    assert len(said) == 1 and "was edited by hand" in said[0] and "fedhype run --config" in said[0]
    assert (tmp_path / "config.edited.toml").read_text() == text
    # a job on the user's own images or store: the file leaves out data.dataset, which config.json keeps (a helper's
    # every rerun of such a job was told its untouched file was edited)
    for own in (f"data.images={tmp_path}", f"data.store={tmp_path / 's.safetensors'}"):
        (tmp_path / "config.edited.toml").unlink(missing_ok=True)
        conf = absolute_paths(resolve(None, [own]))
        assert conf["data"]["dataset"] and "dataset" not in to_toml(conf).split("[data]")[1].split("[")[0]
        (tmp_path / "config.toml").write_text(to_toml(conf))
        said = []
        _keep_edited_toml(tmp_path, json.loads(json.dumps(conf)), said.append)
        assert said == [] and not (tmp_path / "config.edited.toml").exists(), said
