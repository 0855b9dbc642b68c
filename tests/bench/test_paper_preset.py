"""bench/paper_preset.py's code path at tiny sizes, so that the script cannot rot.

The script runs both scenarios split across two switches, each role in a process of its
own; at the `tiny` sizes that takes a minute or two (three under load). The committed figures come from the `paper`
sizes (bench/results/paper_preset.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.paper_preset import link_s, main, synthetic_lines, synthetic_tokenizer, tile
from workers.compression import parse_spec
from workers.training.data import SpecialIds, encode_lines


def test_the_synthetic_tokenizer_has_the_vocabulary_asked_and_fills_every_sequence() -> None:
    tok = synthetic_tokenizer(1000)
    assert tok.get_vocab_size() == 1000
    ids = encode_lines(tok, synthetic_lines(tok, 4, 30, seed=1), 24)
    special = SpecialIds.of(tok)
    assert not bool((ids == special.pad).any())  # full length: the most that crosses
    assert int(special.is_special(ids[:, 1:-1]).sum()) == 0  # no [UNK]: every word known


def test_repeating_sentences_and_the_link_time() -> None:
    x = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(tile(x, 5), torch.tensor([[0, 1], [2, 3], [4, 5], [0, 1], [2, 3.0]]))
    assert torch.equal(tile(x, 2), x[:2])
    # 7.5 MB one way at 60 Mbit/s is one second; the slower direction sets the pace
    assert link_s(7_500_000, 100, 60.0) == pytest.approx(1.0)
    assert link_s(100, 7_500_000, 60.0) == pytest.approx(1.0)


@pytest.mark.slow
def test_the_script_runs_both_scenarios_and_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "paper_preset.json"
    written = main(["--size", "tiny", "--out", str(out)])
    figures = json.loads(out.read_text())
    assert figures == json.loads(json.dumps(written))
    for scenario, roles in (("electra", 2), ("abnet", 2)):
        step = figures[scenario]["step_s"]
        assert 0 < step["min"] <= step["median"] <= step["max"]
        # warm-up and timed steps each saw the load average taken
        assert len(figures[scenario]["load_average_at_step"]) >= 4
        rss = figures[scenario]["peak_rss_mib"]
        assert len(rss) == roles and all(v > 50 for v in rss.values())
    assert figures["paper_electra_step_s_cpu"] == figures["electra"]["step_s"]["median"]
    assert figures["paper_abnet_step_s_cpu"] == figures["abnet"]["step_s"]["median"]
    # the bytes computed from the codecs are those the roles counted on the wire
    assert figures["electra"]["computed_vs_measured"] == pytest.approx(1.0, abs=0.01)
    for ratio in figures["abnet"]["computed_vs_measured"].values():
        assert ratio == pytest.approx(1.0, abs=0.01)
    rows = figures["abnet"]["table5_rows_paper_sizes"]
    assert set(rows) == {
        "none_none",
        "fp16_int8",
        "fp16_lowrank02_svd_int8",
        "fp16_lowrank02_power_int8",
        "fp16_lowrank02_stream_int8",
        "auto_auto",
    }
    for row in rows.values():
        for spec in (*row["forward_spec"], row["backward_spec"]):
            parse_spec(spec)
    assert rows["none_none"]["bytes_vs_none"] == 1.0
    # fp16 halves float32, int8 quarters it (plus the scales); low rank sends fewer still
    fp16_int8 = rows["fp16_int8"]
    assert fp16_int8["forward"] < 0.51 * rows["none_none"]["forward"]
    assert fp16_int8["backward"] < 0.27 * rows["none_none"]["backward"]
    assert rows["fp16_lowrank02_svd_int8"]["forward"] < fp16_int8["forward"]
    assert rows["fp16_lowrank02_stream_int8"]["forward"] < fp16_int8["forward"]
