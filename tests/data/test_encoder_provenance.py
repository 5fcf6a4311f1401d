"""What a site publishes of its encoder (:func:`fedhype.data.sites.encoder_of`): a hub id whole, a local folder by its
last component only (the site's directory layout is not public)."""

from __future__ import annotations

import dataclasses

import pytest

from fedhype.data.sites import encoder_of


@pytest.mark.parametrize("given, published", [
    ("hf:facebook/dinov2-base", "hf:facebook/dinov2-base"),           # a hub id: owner/name
    ("hf:bert-base-uncased", "hf:bert-base-uncased"),                 # a legacy hub id: name
    ("dinov2-vits14", "dinov2-vits14"),                               # a bundled encoder
    ("timm:hf-hub:timm/vit_small_patch14_dinov2.lvd142m", "timm:hf-hub:timm/vit_small_patch14_dinov2.lvd142m"),
    ("hf:/srv/hospA/cancer_study/vit", "hf:<local>/vit"),             # absolute
    ("hf:./models/vit", "hf:<local>/vit"),
    ("hf:~/vit/", "hf:<local>/vit"),
    ("hf:data/hospA_ct_finetune/vit", "hf:<local>/vit"),              # relative, more than one '/': a privacy probe's
    ("hf:C:/Users/alice/cancer_study/vit", "hf:<local>/vit"),         # a Windows path, either separator
    ("hf:C:\\Users\\alice\\cancer_study\\vit", "hf:<local>/vit"),
])
def test_a_local_encoder_folder_is_named_by_its_last_component_only(real_store, given, published):
    store = dataclasses.replace(real_store, meta={**real_store.meta, "encoder": given})
    out = encoder_of(store)
    assert out["encoder"] == published and out["dim"] == real_store.dim
    assert "alice" not in str(out) and "hospA" not in str(out) and "cancer_study" not in str(out)


def test_cards_state_the_precision_and_sites_that_differ_are_warned_about(real_store, tmp_path):
    """Two sites embedded in float32 and in bfloat16 autocast (each its CPU's `--dtype auto`) were federated without
    a word, the cards stating no precision (a probe). The card states it; a roster of cards that differ warns, naming
    each site's; a card written before (no dtype) still loads and matches its site."""
    import json
    import warnings

    from fedhype.data.roster import Roster
    from fedhype.data.sites import Site, SiteCard, make_site
    from fedhype.errors import FedhypeWarning

    cards = []
    for name, dtype in (("a", "float32"), ("b", "bfloat16-autocast")):
        store = dataclasses.replace(real_store, meta={**real_store.meta, "dtype": dtype})
        store.save(tmp_path / f"{name}.safetensors")
        make_site(store, tmp_path / f"{name}.safetensors", name, min_train=5).save(tmp_path / name)
        cards.append(SiteCard.load(tmp_path / name))
        assert cards[-1].dtype == dtype and json.loads((tmp_path / name / "card.json").read_text())["dtype"] == dtype
        assert Site.load(tmp_path / name).public_card() == cards[-1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Roster.from_cards(cards)
        Roster.from_cards([cards[0], dataclasses.replace(cards[1], dtype="float32")])  # one precision: nothing said
        Roster.from_cards([cards[0], dataclasses.replace(cards[1], dtype=None)])  # an older card: nothing known
    said = [str(w.message) for w in caught if issubclass(w.category, FedhypeWarning)]
    assert len(said) == 1 and "the sites embedded in different precisions (a: float32, b: bfloat16-autocast)" in said[0]
    old = json.loads((tmp_path / "b" / "card.json").read_text())
    del old["dtype"]
    (tmp_path / "b" / "card.json").write_text(json.dumps(old))
    assert SiteCard.load(tmp_path / "b").dtype is None and Site.load(tmp_path / "b").public_card().dtype is None
