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
