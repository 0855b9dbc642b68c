"""The job kinds table: what each kind of job is made of, in one place.

For each kind: its config model (what a submission may set), its roles with their peer,
the inputs each reads (and which column of a parallel corpus), the artifact each stores,
the role whose steps measure progress, and the roles that must run apart. The control
plane validates and places jobs by it, the cluster runs roles by it, and the web UI reads
it from `GET /api/v1/job-kinds`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from contract.codec_spec import PER_SAMPLE, SpecError, check_stream_spec
from contract.devices import ANY_DEVICE, DeviceNeed
from contract.fields import StrictIn
from contract.presets import ABNET_PRESETS, ELECTRA_PRESETS, Preset

# The grammar (contract.codec_spec) is recursive; the document names it as a format.
CodecSpec = Annotated[
    str,
    Field(
        max_length=200,
        json_schema_extra={"format": "codec-spec"},
        description="A codec spec: none, fp16, bf16, int8, "
        "lowrank(r, method=svd|rsvd|power|stream), each optionally wrapping lowrank, "
        "and ef(<spec>) for error feedback (refused on per-sample streams); "
        "`auto` where a kind lets the link's measurement choose",
        examples=["fp16", "int8", "fp16(lowrank(0.25,method=power))", "auto"],
    ),
]


# fp32, or bf16 autocast (matmuls in bfloat16, norms and losses in float32), CPU or CUDA
Precision = Literal["fp32", "bf16"]

AUTO_CODEC = "auto"  # a codec field's value that lets the link's measurement choose

# ABNet's pipeline: `sync` waits for a step's last gradient before the next step's
# forwards; `stale1` starts them on the encoder's weights of one update earlier
Schedule = Literal["sync", "stale1"]
SCHEDULES: tuple[str, ...] = get_args(Schedule)


def _role_names(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """The document names the keys `role_devices` takes: the kind's placed roles."""
    roles: tuple[str, ...] = getattr(model, "ROLES", ())
    if roles and "role_devices" in schema.get("properties", {}):
        field = schema["properties"]["role_devices"]
        field["propertyNames"] = {"enum": list(roles)}
        field["examples"] = [{roles[-1]: "cuda"}]


class JobConfig(StrictIn):
    """What every kind's config holds: the preset, the seed and the job's overrides."""

    model_config = ConfigDict(**StrictIn.model_config, json_schema_extra=_role_names)

    preset: Preset = "tiny"
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    # the device every role needs (cpu, cuda, or any: whatever its worker has), and per
    # role where one differs; a worker that lacks it is refused at claim and the job fails
    device: DeviceNeed = Field(
        default=ANY_DEVICE,
        description="The device every role needs: cpu, cuda, or any (what its worker has). "
        "A worker that lacks it refuses the role at claim, and the job fails saying so.",
    )
    role_devices: dict[str, DeviceNeed] = Field(
        default_factory=dict,
        max_length=8,
        description="Per placed role, a device other than `device` (a discriminator's "
        "replicas follow it)",
    )

    # the training-config fields a job may set on top of its preset
    OVERRIDES: ClassVar[tuple[str, ...]] = ()
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}
    ROLES: ClassVar[tuple[str, ...]] = ()  # the kind's placed roles (role_devices' keys)

    @field_validator("role_devices")
    @classmethod
    def _known_roles(cls, value: dict[str, DeviceNeed]) -> dict[str, DeviceNeed]:
        unknown = sorted(set(value) - set(cls.ROLES))
        if unknown:
            raise ValueError(f"role_devices: no role {unknown[0]!r}; roles: {', '.join(cls.ROLES)}")
        return value

    def overrides(self) -> dict[str, Any]:
        """The training-config fields this job sets on top of its preset."""
        return {k: getattr(self, k) for k in self.OVERRIDES if getattr(self, k) is not None}

    def training_values(self) -> dict[str, Any]:
        """The training-config fields of this job: its preset's, with its overrides."""
        return {**self.PRESETS[self.preset], **self.overrides()}

    def total_steps(self) -> int:
        """How many optimizer steps the job runs."""
        return int(self.training_values()["steps"])


class ElectraJobConfig(JobConfig):
    """Scenario-I: generator on one cluster, discriminators on another."""

    OVERRIDES = (
        "steps",
        "batch_size",
        "n_discriminators",
        "ckpt_every",
        "dropout",
        "post_ln",
        "precision",
        "max_lag",
    )
    PRESETS = ELECTRA_PRESETS
    ROLES = ("generator", "discriminator")

    steps: int | None = Field(default=None, ge=1, le=10_000_000)
    batch_size: int | None = Field(default=None, ge=2, le=4096)
    n_discriminators: int | None = Field(default=None, ge=1, le=16)
    dropout: float | None = Field(default=None, ge=0.0, le=0.5)
    ckpt_every: int | None = Field(default=None, ge=1, le=10_000_000)
    # When the discriminator's cluster may read the same text, only masked positions cross.
    discriminator_reads_text: bool = True
    # BERT's post-LN body instead of Nebula's pre-LN one: the model then exports as a
    # Hugging Face ELECTRA (GET /datasets/{id}/content?format=huggingface)
    post_ln: bool | None = None
    precision: Precision | None = None
    # steps the generator may run ahead of the discriminator's last sync (2 by default);
    # "auto": derived from the measured round trip and both roles' step times
    max_lag: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] | None = None


class AbnetJobConfig(JobConfig):
    """Scenario-II: encoder + adapters on one cluster, decoder + adapters on another."""

    OVERRIDES = (
        "steps",
        "batch_size",
        "micro_batches",
        "ckpt_every",
        "forward_codec",
        "backward_codec",
        "auto_max_error",
        "compress_from_step",
        "precision",
        "schedule",
    )
    PRESETS = ABNET_PRESETS
    ROLES = ("encoder", "decoder")

    steps: int | None = Field(default=None, ge=1, le=10_000_000)
    batch_size: int | None = Field(default=None, ge=2, le=4096)
    micro_batches: int | None = Field(default=None, ge=1, le=16)
    ckpt_every: int | None = Field(default=None, ge=1, le=10_000_000)
    # both streams are per sample (activations S -> T, their gradients T -> S), so ef(...)
    # is refused; `auto` lets the link's measurement choose, within auto_max_error
    forward_codec: CodecSpec = "fp16"
    backward_codec: CodecSpec = "int8"
    auto_max_error: float | None = Field(default=None, gt=0.0, lt=1.0)
    compress_from_step: int = Field(default=0, ge=0, le=10_000_000)
    precision: Precision | None = None
    schedule: Schedule | None = Field(
        default=None,
        description="sync (the default): a step's forwards wait until the previous step's "
        "update; stale1: they start before its last gradient is back, on the encoder's "
        "adapters of one update earlier (PipeDream-2BW), keeping the encoder busy through "
        "the round trip",
    )

    @field_validator("forward_codec", "backward_codec")
    @classmethod
    def _valid_codec(cls, spec: str, info: ValidationInfo) -> str:
        if spec == AUTO_CODEC:
            return spec
        try:
            check_stream_spec(spec, str(info.field_name), PER_SAMPLE)
        except SpecError as exc:
            raise ValueError(str(exc)) from None
        return spec


SOURCE, TARGET = 0, 1  # the columns of a parallel corpus (source \t target)


class RoleSpec(BaseModel):
    """One role of a job kind: its peer, what it may read, what it stores, what its cluster
    receives (as the web UI tells it)."""

    peer: str
    # input name -> the column of a parallel corpus the role receives (None: all of it)
    reads: dict[str, int | None]
    artifact: str | None = None  # the kind of artifact the role stores, if any
    # input name -> a boolean field of the job's config: the role reads that input only
    # while the field is true
    read_if: dict[str, str] = {}
    label: str = ""
    hint: str = ""
    sees: str = ""  # what the role's cluster receives
    sees_otherwise: str = ""  # ... when a `read_if` field is false


class InputText(BaseModel):
    """How the web UI names an input."""

    label: str
    hint: str = ""


class JobKindSpec(BaseModel):
    """What a job kind needs: its config model, roles, and inputs (name -> dataset kind)."""

    label: str
    description: str
    config: type[JobConfig]
    roles: dict[str, RoleSpec]
    inputs: dict[str, str]
    optional_inputs: dict[str, str] = {}
    input_text: dict[str, InputText] = {}
    primary_role: str  # the role whose steps measure the job's progress
    # roles that must run on different clusters: ABNet's encoder gets only the source
    # column and its decoder only the target, so that no cluster holds a sentence pair
    apart: tuple[str, ...] = ()
    # every metric name a role of the kind may report (per step, in its final report and
    # its extra figures): a name is a channel out of the cluster, so it is never free text
    metrics: frozenset[str] = frozenset()


def _auto_metrics(*streams: str) -> frozenset[str]:
    """What the `auto` codec reports for each of `streams` (workers/training/abnet/wire.py)."""
    fields = (
        "choice",
        "rel_error",
        "wire_bytes",
        "measured",
        "bandwidth_mbit",
        "measured_error",
        "profiles",
        "over_bound",
    )
    return frozenset(f"auto.{stream}.{field}" for stream in streams for field in fields)


_GENERATOR_SEES = (
    "The whole text, decrypted after the grant check; it trains the tokenizer and the generator."
)

KINDS: dict[str, JobKindSpec] = {
    "electra_pretrain": JobKindSpec(
        label="ELECTRA pre-training",
        description="Generator on one cluster, discriminators on another; only token ids and "
        "a small sync tensor cross the link.",
        config=ElectraJobConfig,
        roles={
            "generator": RoleSpec(
                peer="discriminator",
                reads={"text": None, "init_generator": None},
                label="Generator",
                hint="Masks tokens and proposes replacements.",
                sees=_GENERATOR_SEES,
            ),
            "discriminator": RoleSpec(
                peer="generator",
                reads={"text": None, "init_discriminator": None},
                read_if={"text": "discriminator_reads_text"},
                artifact="model",
                label="Discriminator",
                hint="Detects replaced tokens; the root scatters to sub-discriminators.",
                sees="The whole text too (its own copy, to rebuild the sequences), the "
                "tokenizer, and only the replaced tokens from the generator. It writes the "
                "model, with the tokenizer.",
                # neither mode hides the text from the discriminators' cluster
                sees_otherwise="No copy of the dataset, but every corrupted sequence (about "
                "85% of its tokens as in the text) and the tokenizer to decode them: it can "
                "read the text nearly verbatim. It writes the model, with the tokenizer.",
            ),
        },
        inputs={"text": "text"},
        # continued pre-training, or the paper's trained generator: a Nebula model or an
        # imported Hugging Face one, whose tokenizer then is the job's
        optional_inputs={"init_generator": "model", "init_discriminator": "model"},
        input_text={
            "text": InputText(label="Text corpus"),
            "init_generator": InputText(
                label="Generator to start from",
                hint="Optional: a model (Nebula's, or an imported ELECTRA or BERT); its "
                "tokenizer is used",
            ),
            "init_discriminator": InputText(
                label="Discriminator to start from",
                hint="Optional: a model sharing the generator's tokenizer",
            ),
        },
        primary_role="discriminator",
        metrics=frozenset(
            {
                "mlm_loss",
                "tokens_per_s",
                "bytes_to_discriminator",
                "bytes_to_discriminator_total",
                "bytes_per_token",
                "rtd_loss",
                "rtd_accuracy",
                "bytes_to_generator",
                "bytes_to_generator_total",
                "mode_shared",
                "replica_max_abs_diff",
                # with max_lag auto: the lag chosen and the medians it rests on
                "max_lag",
                "lag.rtt_s",
                "lag.discriminator_step_s",
                "lag.generator_step_s",
            }
        ),
    ),
    "abnet_finetune": JobKindSpec(
        label="ABNet fine-tuning",
        description="Frozen source model with adapters on one cluster, frozen target model "
        "with cross-attention adapters on another.",
        config=AbnetJobConfig,
        roles={
            # each side of a parallel corpus gets only its own column: no cluster holds pairs
            "encoder": RoleSpec(
                peer="decoder",
                reads={"parallel": SOURCE, "eval": SOURCE, "source_model": None},
                artifact="adapters",
                label="Encoder",
                hint="Source side: sends activations, receives gradients.",
                sees="The source column of the parallel corpus and the source model; "
                "gradients from the decoder. Never a target sentence.",
            ),
            "decoder": RoleSpec(
                peer="encoder",
                reads={"parallel": TARGET, "eval": TARGET, "target_model": None},
                artifact="adapters",
                label="Decoder",
                hint="Target side: receives activations, sends gradients.",
                sees="The target column and the target model; the encoder's (compressed) "
                "activations of each source sentence, which carry what it says. Never the "
                "source text itself. Both roles on one cluster is refused.",
            ),
        },
        inputs={"parallel": "parallel", "source_model": "model", "target_model": "model"},
        optional_inputs={"eval": "parallel"},
        input_text={
            "parallel": InputText(label="Parallel corpus"),
            "source_model": InputText(label="Source model"),
            "target_model": InputText(label="Target model"),
            "eval": InputText(
                label="Evaluation split",
                hint="Optional parallel test split: the job reports BLEU on it.",
            ),
        },
        primary_role="decoder",
        apart=("encoder", "decoder"),
        metrics=frozenset(
            {
                "loss",
                "token_loss",
                "length_loss",
                "token_accuracy",
                "seconds",
                "tokens_per_s",
                "bytes_to_decoder",
                "bytes_to_decoder_total",
                "bytes_to_encoder",
                "bytes_to_encoder_total",
                "bleu",
            }
        )
        | _auto_metrics("forward", "backward"),
    ),
}


# The discriminator's data-parallel replicas 1..n-1 are roles of their own, each a task on
# the discriminator's cluster (its own worker process); they join the discriminator's
# process group at the rendezvous it publishes, read no input and store nothing.
REPLICA_PREFIX = "replica-"
REPLICA_OF = "discriminator"
MAX_REPLICAS = 16
REPLICA = RoleSpec(peer=REPLICA_OF, reads={})


def replica_rank(role: str) -> int | None:
    """The rank of a replica role (`replica-2` -> 2), None for any other role."""
    if role.startswith(REPLICA_PREFIX) and role[len(REPLICA_PREFIX) :].isdigit():
        rank = int(role[len(REPLICA_PREFIX) :])
        return rank if 1 <= rank < MAX_REPLICAS else None
    return None


def role_spec(kind: str, role: str) -> RoleSpec:
    """One role of a job kind, replicas included; KeyError for a role the kind has not."""
    if kind == "electra_pretrain" and replica_rank(role) is not None:
        return REPLICA
    return KINDS[kind].roles[role]


def job_roles(kind: str, config: dict[str, Any], placement: dict[str, str]) -> dict[str, str]:
    """Every role of a job and its cluster: the placed ones and the replicas they imply."""
    roles = {role: placement[role] for role in KINDS[kind].roles}
    if kind == "electra_pretrain":
        for rank in range(1, int(config.get("n_discriminators") or 1)):
            roles[f"{REPLICA_PREFIX}{rank}"] = placement[REPLICA_OF]
    return roles


def device_need(kind: str, role: str, config: dict[str, Any]) -> DeviceNeed:
    """The device one role of a job needs (a replica needs what its discriminator does)."""
    placed = REPLICA_OF if kind == "electra_pretrain" and replica_rank(role) is not None else role
    parsed = KINDS[kind].config.model_validate(config)
    return parsed.role_devices.get(placed, parsed.device)


def role_reads(kind: str, role: str, config: dict[str, Any]) -> dict[str, int | None]:
    """The inputs one role of a job may read, with the column it gets of each."""
    spec = role_spec(kind, role)
    reads = dict(spec.reads)
    for name, flag in spec.read_if.items():
        if not config.get(flag, True):
            reads.pop(name, None)
    return reads
