"""The ablation's arithmetic: variant specs, the equal token budget, the table with spread and delta."""

from __future__ import annotations

import math

import pytest

from flows.train.ablate_plan import format_table, parse_variant, parse_variants, steps_for_tokens, table_rows


def test_variant_specs_split_at_keys_not_inside_values() -> None:
    v = parse_variant("clf=--set clean.classifier.keep_fraction=0.5,clean.url.banned_words=[a,b]")
    assert v.name == "clf"
    assert v.overrides == {"clean.classifier.keep_fraction": 0.5, "clean.url.banned_words": ["a", "b"]}
    assert parse_variant("rules=clean.quality.enabled=true").overrides == {"clean.quality.enabled": True}
    assert parse_variant("same=").overrides == {}


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["noequals"], "NAME=key=value"),
        (["base=x=1"], "'base' is the base"),
        (["a=x=1", "a=y=2"], "must differ"),
        (["a=x"], "KEY=VALUE"),
        ([".a=x=1"], "dataset name"),
    ],
)
def test_bad_variant_specs_name_themselves(specs: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_variants(specs)


def test_every_variant_trains_on_at_least_the_budget() -> None:
    assert steps_for_tokens(10_000, 1024) == 10 and steps_for_tokens(1, 1024) == 2
    with pytest.raises(ValueError, match="--tokens"):
        steps_for_tokens(0, 1024)


def test_table_has_mean_spread_and_delta_to_the_base() -> None:
    rows = table_rows(
        [
            {"variant": "base", "docs": 10, "tokens": 900, "losses": [4.0, 4.2]},
            {"variant": "clf", "docs": 6, "tokens": 500, "losses": [3.5, 3.7]},
            {"variant": "broken", "losses": [], "status": "failed to build: no model"},
        ]
    )
    assert rows[0]["eval_loss"] == 4.1 and rows[0]["delta_vs_base"] == 0.0
    assert rows[1]["eval_loss"] == 3.6 and rows[1]["delta_vs_base"] == -0.5
    assert rows[1]["loss_std"] == round(math.sqrt(0.02), 4) and rows[1]["loss_range"] == [3.5, 3.7]
    assert rows[1]["eval_ppl"] == round(math.exp(3.6), 2)
    assert rows[2]["eval_loss"] is None and rows[2]["status"].startswith("failed to build")
    text = format_table(rows)
    assert "broken" in text and "-0.5000" in text and "failed to build: no model" in text
