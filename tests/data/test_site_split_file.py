"""``split_file``: the file of a site folder holding the split with a given site key (``site.json``, or the
``site.<first 8 hex digits>.json`` that ``fedhype site --overwrite`` keeps), for the message that tells a user which
split a run used: a probe was told to use ``site.30046d30.json`` (the current split's key), which is no file."""

from __future__ import annotations

import json

from fedhype.data.sites import split_file

OLD, NEW = "2922b685" + "a" * 24, "30046d30" + "b" * 24


def test_split_file_names_the_file_that_exists(tmp_path):
    (tmp_path / "site.json").write_text(json.dumps({"key": NEW}))
    (tmp_path / f"site.{OLD[:8]}.json").write_text(json.dumps({"key": OLD}))
    assert split_file(tmp_path, NEW) == tmp_path / "site.json"  # the current split: site.json, not site.30046d30.json
    assert split_file(tmp_path, OLD) == tmp_path / "site.2922b685.json"
    assert split_file(tmp_path, "c" * 32) is None
    (tmp_path / f"site.{OLD[:8]}.json").write_text(json.dumps({"key": "d" * 32}))  # another key under that name
    assert split_file(tmp_path, OLD) is None
