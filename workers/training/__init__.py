"""Training inside a cluster: the two Nebula-I scenarios as role functions over a `Link`.

- `electra/`     Scenario-I: `run_electra_generator`, `run_electra_discriminator`,
                 `ElectraConfig` and its presets (`tiny`, `paper`), the two models and their
                 sides, the wire types, the discriminator's replicas (torch.distributed),
                 `train_electra_local` (the single-process reference), the `model` artifact.
- `role.py`      `RoleLoop`, the skeleton of a two-sided role (hello, peer check, resume,
                 step, checkpoint, metrics), and `StepSync`.
- `abnet/`       Scenario-II: `run_abnet_encoder`, `run_abnet_decoder` (a 1F1B pipeline,
                 codecs on helper threads), `AbnetConfig`, `train_abnet_local`, the model,
                 the wire types, the `adapters` artifact, mask-predict decoding, BLEU.
- `bert.py`      the transformer body both scenarios share.
- `data.py`      `write_demo_corpus`, WordPiece tokenizers, batch order.
- `configs.py`   `training_config`: a job's validated config as `ElectraConfig` or `AbnetConfig`.
- `hooks.py`     `Hooks` (what a role's caller gives it), `RoleResult`, `ReportableError`.
- `messages.py`  wire messages (`pack_message`), the hello, `CodecBook`.
- `checkpoints.py`  `CheckpointStore`, a role's training state and where two roles resume.
- `schedule.py`  the learning-rate schedule.
- `pipeline.py`  `AsyncSender` and the helper threads that overlap sends with compute.

Nothing is imported here, so `import workers.training` stays cheap.
"""
