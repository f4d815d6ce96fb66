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


def _runs(losses: list[float], acc: list[list[float]] | None = None) -> list[dict]:
    runs = []
    for i, loss in enumerate(losses):
        run: dict = {"seed": 1234 + i, "loss": loss}
        if acc is not None:
            items = acc[i]
            run["tasks"] = {"t": {"acc": sum(items) / len(items), "per_item": {"acc": items}}}
        runs.append(run)
    return runs


def test_table_has_mean_spread_and_delta_to_the_base() -> None:
    rows = table_rows(
        [
            {"variant": "base", "docs": 10, "tokens": 900, "runs": _runs([4.0, 4.2])},
            {"variant": "clf", "docs": 6, "tokens": 500, "runs": _runs([3.5, 3.7])},
            {"variant": "broken", "runs": [], "status": "failed to build: no model"},
        ],
        tokens_seen=1000,
    )
    assert rows[0]["eval_loss"] == 4.1 and rows[0]["delta_vs_base"] == 0.0
    assert rows[1]["eval_loss"] == 3.6 and rows[1]["delta_vs_base"] == -0.5
    assert rows[1]["loss_std"] == round(math.sqrt(0.02), 4) and rows[1]["loss_range"] == [3.5, 3.7]
    assert rows[1]["eval_ppl"] == round(math.exp(3.6), 2)
    assert rows[1]["epochs"] == 2.0 and rows[1]["docs_seen"] == 12 and rows[1]["tokens_seen"] == 1000
    assert rows[2]["eval_loss"] is None and rows[2]["status"].startswith("failed to build")
    text = format_table(rows, "equal tokens: ...")
    assert "broken" in text and "-0.5000" in text and "failed to build: no model" in text
    assert text.startswith("equal tokens: ...")


def test_intervals_over_seeds_and_items_and_the_paired_difference() -> None:
    """Loss: a t-interval over 3 seeds; paired differences by seed (a constant shift is beyond noise even when
    the seeds spread widely); task accuracy: a bootstrap over items, paired on the same items."""
    base_acc = [[1, 0, 0, 1, 0, 0, 1, 0]] * 3
    better = [[1, 1, 1, 1, 1, 0, 1, 1]] * 3
    rows = table_rows(
        [
            {"variant": "base", "docs": 10, "tokens": 900, "runs": _runs([4.0, 4.6, 5.2], base_acc)},
            {"variant": "shift", "docs": 10, "tokens": 900, "runs": _runs([3.9, 4.5, 5.1], better)},
            {"variant": "same", "docs": 10, "tokens": 900, "runs": _runs([4.1, 4.5, 5.2], base_acc)},
        ]
    )
    loss = rows[1]["metrics"]["eval_loss"]
    half = 4.3027 * 0.6 / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(n)
    assert loss["ci"] == [round(4.5 - half, 4), round(4.5 + half, 4)]
    assert loss["delta"] == -0.1 and loss["delta_ci"] == [-0.1, -0.1] and loss["within_noise"] is False
    acc = rows[1]["metrics"]["t.acc"]
    assert acc["mean"] == 0.875 and acc["ci"] == [0.875, 0.875] and acc["item_ci"][0] < 0.875
    assert acc["delta"] == 0.5 and acc["delta_item_ci"][0] > 0 and acc["within_noise"] is False
    same = rows[2]["metrics"]
    assert same["eval_loss"]["within_noise"] is True and same["t.acc"]["within_noise"] is True
    assert rows[0]["metrics"]["eval_loss"]["delta"] == 0.0
    text = format_table(rows)
    assert "beyond noise" in text and "within noise" in text and "t.acc" in text


def test_t_quantiles_and_a_fixed_bootstrap() -> None:
    import numpy as np

    from training.intervals import bootstrap_interval, t_interval, t_quantile_95

    assert t_quantile_95(1) == 12.7062 and t_quantile_95(30) == 2.0423
    assert abs(t_quantile_95(40) - 2.0211) < 1e-3 and abs(t_quantile_95(1000) - 1.9623) < 1e-3
    assert t_interval([1.0]) is None and t_interval([1.0, 1.0]) == (1.0, 1.0)
    scores = np.array([1, 0, 1, 1, 0, 1, 0, 1, 1, 1], dtype=float)
    assert bootstrap_interval(scores) == bootstrap_interval(scores)  # a fixed generator seed
    low, high = bootstrap_interval(scores)
    assert low < 0.7 < high and bootstrap_interval(scores[:1]) is None
