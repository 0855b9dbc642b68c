"""Training inside a cluster: the two Nebula-I scenarios as role functions over a `Link`.

- `electra.py`   Scenario-I: `run_electra_generator`, `run_electra_discriminator`,
                 `ElectraConfig` (`tiny`, `paper`), `export_pretrained` / `load_pretrained`
                 (the `model` artifact), `train_electra_local` (single-process reference).
- `replicas.py`  the discriminator's data-parallel replicas (torch.distributed).
- `abnet/`       Scenario-II: `run_abnet_encoder`, `run_abnet_decoder` (a 1F1B pipeline,
                 codecs on helper threads), `AbnetConfig`, `train_abnet_local`, the model,
                 the wire types, the `adapters` artifact, mask-predict decoding, BLEU.
- `bert.py`      the transformer body both scenarios share.
- `data.py`      `write_demo_corpus`, WordPiece tokenizers, batch order.
- `configs.py`   `training_config`: a job's validated config as `ElectraConfig` or `AbnetConfig`.
- `runtime.py`   `Hooks`, `RoleResult`, checkpoints, wire messages, overlapped sends, codecs.

Nothing is imported here, so `import workers.training` stays cheap.
"""
