"""Training inside a cluster: the two Nebula-I scenarios as role functions over a `Link`.

- `electra.py`   Scenario-I's roles: `run_electra_generator`, `run_electra_discriminator`.
- `electra_config.py`    `ElectraConfig` and its presets (`tiny`, `paper`).
- `electra_model.py`     the generator and the discriminator, one step of each
                         (`GeneratorSide`, `DiscriminatorSide`), `train_electra_local`
                         (the single-process reference).
- `electra_wire.py`      what crosses between the two roles (batches, `StepSync`).
- `electra_artifact.py`  `export_pretrained` / `load_pretrained`: the `model` artifact.
- `replicas.py`  the discriminator's data-parallel replicas (torch.distributed).
- `role.py`      `RoleLoop`, the skeleton of a two-sided role (hello, peer check, resume,
                 step, checkpoint, metrics), and `StepSync`.
- `abnet/`       Scenario-II: `run_abnet_encoder`, `run_abnet_decoder` (a 1F1B pipeline,
                 codecs on helper threads), `AbnetConfig`, `train_abnet_local`, the model,
                 the wire types, the `adapters` artifact, mask-predict decoding, BLEU.
- `bert.py`      the transformer body both scenarios share.
- `data.py`      `write_demo_corpus`, WordPiece tokenizers, batch order.
- `configs.py`   `training_config`: a job's validated config as `ElectraConfig` or `AbnetConfig`.
- `runtime.py`   `Hooks`, `RoleResult`, checkpoints, wire messages, overlapped sends, codecs.

Nothing is imported here, so `import workers.training` stays cheap.
"""
