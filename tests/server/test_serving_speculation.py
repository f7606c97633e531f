"""`accel serve EXPORT` speculates with the export's own drafter unless told otherwise (`serving_speculation`)."""

import json

import pytest

from accel.export.load import ModelLoadError, export_speculative_config
from accel.server.serve import serving_speculation, speculative_config


def _export(tmp_path, speculation, draft: bool = False):
    """A folder with the accel.json an export carries: the recipe's `speculation` section as written."""
    out = tmp_path / "checkpoint"
    out.mkdir()
    (out / "accel.json").write_text(json.dumps({"format_version": 1, "recipe": {"speculation": speculation}}))
    if draft:
        (out / "draft").mkdir()
        (out / "draft" / "config.json").write_text("{}")
    return out


def test_an_export_serves_with_the_drafter_it_was_optimized_with(tmp_path):
    ngram = {"method": "ngram", "num_speculative_tokens": 5, "ngram_min_n": 2, "ngram_max_n": 6, "adaptive": True,
             "distill": {"kind": "eagle"}}
    spec = serving_speculation(_export(tmp_path, ngram))
    assert (spec.method, spec.num_speculative_tokens, spec.ngram_max_n) == ("ngram", 5, 6)


def test_a_distilled_draft_is_served_from_the_exports_own_draft_folder(tmp_path):
    export = _export(tmp_path, {"method": "distilled", "num_speculative_tokens": 3}, draft=True)
    spec = export_speculative_config(export)
    assert (spec.method, spec.draft_model, spec.num_speculative_tokens) == ("draft", str(export / "draft"), 3)
    assert spec.draft_ngram_first  # as the pipeline evaluated it: lookup first, the draft where nothing matches


def test_method_none_serves_without_and_a_plain_folder_has_no_drafter(tmp_path):
    export = _export(tmp_path, {"method": "ngram", "num_speculative_tokens": 4})
    assert serving_speculation(export, '{"method": "none"}') is None
    assert serving_speculation(export, {"method": "ngram", "num_speculative_tokens": 2}).num_speculative_tokens == 2
    plain = tmp_path / "plain"
    plain.mkdir()
    assert serving_speculation(plain) is None
    (tmp_path / "off").mkdir()
    assert serving_speculation(_export(tmp_path / "off", {"method": "none"})) is None


def test_bad_drafter_settings_are_refused_naming_them(tmp_path):
    with pytest.raises(ValueError, match=r"method 'none' takes no other fields; got \['num_speculative_tokens'\]"):
        speculative_config({"method": "none", "num_speculative_tokens": 3})
    broken = _export(tmp_path, {"method": "draft", "num_speculative_tokens": 3})  # no draft model anywhere
    with pytest.raises(ModelLoadError, match="does not make a drafter .*needs a draft folder.*method.*none"):
        serving_speculation(broken)
    (broken / "accel.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not a readable accel manifest"):
        export_speculative_config(broken)
