"""A Nebula-trained ELECTRA leaves as a Hugging Face folder that `transformers` loads and that
computes Nebula's own logits (to 1e-5).

The models are trained here for a few steps with BERT's post-LN layout (`post_ln`),
uploaded as Nebula model files, and fetched with `?format=huggingface`; the tar is
unpacked and read by `transformers` alone.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import torch
import transformers
from fastapi.testclient import TestClient
from tokenizers import Tokenizer

from support import Platform
from tests.app.datasets.test_datasets import API, new_workspace, upload
from workers.training.electra import ElectraConfig, export_pretrained, train_electra_local

TOLERANCE = 1e-5


def trained(
    lines: list[str], *, post_ln: bool
) -> tuple[torch.nn.Module, torch.nn.Module, Tokenizer]:
    cfg = ElectraConfig.tiny(steps=3, batch_size=8, warmup_steps=1, post_ln=post_ln)
    run = train_electra_local(cfg, lines[:200], seed=3)
    return run.generator.model.eval(), run.discriminator.model.eval(), run.tokenizer


def fetch_folder(client: TestClient, alice: object, dataset_id: str, into: Path) -> Path:
    answer = client.get(
        f"{API}/datasets/{dataset_id}/content",
        params={"format": "huggingface"},
        headers=alice.headers,  # type: ignore[attr-defined]
    )
    assert answer.status_code == 200, answer.text
    assert int(answer.headers["content-length"]) == len(answer.content)
    with tarfile.open(fileobj=io.BytesIO(answer.content)) as tar:
        names = tar.getnames()
        tar.extractall(into, filter="data")
    [folder] = {name.split("/")[0] for name in names}
    return into / folder


def ids_of(tokenizer: Tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    encoded = [tokenizer.encode(t).ids for t in ("la casa es grande", "the house is big and old")]
    width = max(len(e) for e in encoded)
    ids = torch.zeros(len(encoded), width, dtype=torch.long)  # [PAD] is 0
    for row, e in enumerate(encoded):
        ids[row, : len(e)] = torch.tensor(e)
    return ids, (ids != 0).long()


def test_a_trained_electra_exports_and_transformers_computes_its_logits(
    client: TestClient,
    platform: Platform,
    tmp_path: Path,
    text_lines: list[str],
    request: pytest.FixtureRequest,
) -> None:
    if "postgresql" in request.node.callspec.id:
        pytest.skip("the numerics do not depend on the database; sqlite runs them")
    generator, discriminator, tokenizer = trained(text_lines, post_ln=True)
    alice = platform.user()
    ws = new_workspace(client, alice)
    ids, mask = ids_of(tokenizer)
    valid = mask.bool()
    for model, architecture in (
        (discriminator, "ElectraForPreTraining"),
        (generator, "ElectraForMaskedLM"),
    ):
        status, body = upload(
            client, alice, ws, export_pretrained(model, tokenizer), kind="model", name=architecture
        )
        assert status == 201, body
        folder = fetch_folder(client, alice, body["id"], tmp_path / architecture)
        assert sorted(p.name for p in folder.iterdir()) == [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
        assert json.loads((folder / "config.json").read_text())["architectures"] == [architecture]
        assert Tokenizer.from_file(str(folder / "tokenizer.json")).to_str() == tokenizer.to_str()
        body_only = transformers.AutoModel.from_pretrained(folder).eval()
        assert isinstance(body_only, transformers.ElectraModel)
        reference = getattr(transformers, architecture).from_pretrained(folder).eval()
        with torch.no_grad():
            hidden = body_only(input_ids=ids, attention_mask=mask).last_hidden_state
            logits = reference(input_ids=ids, attention_mask=mask).logits
            ours_hidden = model.body(ids, valid)
            if architecture == "ElectraForMaskedLM":
                ours = model(ids, valid, torch.ones_like(valid))
                logits = logits.reshape(-1, logits.shape[-1])
            else:
                ours = model(ids, valid)
        assert (hidden - ours_hidden).abs().max().item() <= TOLERANCE
        assert logits.shape == ours.shape
        assert (logits - ours).abs().max().item() <= TOLERANCE


def test_a_pre_ln_model_or_a_text_does_not_export(
    client: TestClient, platform: Platform, text_lines: list[str], request: pytest.FixtureRequest
) -> None:
    if "postgresql" in request.node.callspec.id:
        pytest.skip("sqlite runs it")
    _, discriminator, tokenizer = trained(text_lines, post_ln=False)
    alice = platform.user()
    ws = new_workspace(client, alice)
    status, body = upload(
        client, alice, ws, export_pretrained(discriminator, tokenizer), kind="model"
    )
    assert status == 201, body
    answer = client.get(
        f"{API}/datasets/{body['id']}/content",
        params={"format": "huggingface"},
        headers=alice.headers,
    )
    assert answer.status_code == 409 and "post_ln" in answer.json()["detail"]
    status, text = upload(client, alice, ws, b"a line\n", kind="text")
    answer = client.get(
        f"{API}/datasets/{text['id']}/content",
        params={"format": "huggingface"},
        headers=alice.headers,
    )
    assert answer.status_code == 422
    # someone else's model answers 404 whatever the format
    bob = platform.user()
    answer = client.get(
        f"{API}/datasets/{body['id']}/content",
        params={"format": "huggingface"},
        headers=bob.headers,
    )
    assert answer.status_code == 404
