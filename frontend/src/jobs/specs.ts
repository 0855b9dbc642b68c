/** What each job kind needs: inputs by name and kind, and the roles to place on clusters. */
import type { DatasetKind, JobKind } from "../api/types";

export interface InputSpec {
  name: string;
  label: string;
  kind: DatasetKind;
  /** May be left out of the submission. */
  optional?: boolean;
  hint?: string;
}

export interface RoleSpec {
  name: string;
  label: string;
  hint: string;
}

export interface JobSpec {
  kind: JobKind;
  label: string;
  description: string;
  inputs: InputSpec[];
  roles: RoleSpec[];
}

export const JOB_SPECS: Record<JobKind, JobSpec> = {
  electra_pretrain: {
    kind: "electra_pretrain",
    label: "ELECTRA pre-training",
    description: "Generator on one cluster, discriminators on another; only token ids and a small sync tensor cross the link.",
    inputs: [{ name: "text", label: "Text corpus", kind: "text" }],
    roles: [
      { name: "generator", label: "Generator", hint: "Masks tokens and proposes replacements." },
      { name: "discriminator", label: "Discriminator", hint: "Detects replaced tokens; the root scatters to sub-discriminators." },
    ],
  },
  abnet_finetune: {
    kind: "abnet_finetune",
    label: "ABNet fine-tuning",
    description: "Frozen source model with adapters on one cluster, frozen target model with cross-attention adapters on another.",
    inputs: [
      { name: "parallel", label: "Parallel corpus", kind: "parallel" },
      { name: "source_model", label: "Source model", kind: "model" },
      { name: "target_model", label: "Target model", kind: "model" },
      { name: "eval", label: "Evaluation split", kind: "parallel", optional: true, hint: "Optional parallel test split: the job reports BLEU on it." },
    ],
    roles: [
      { name: "encoder", label: "Encoder", hint: "Source side: sends activations, receives gradients." },
      { name: "decoder", label: "Decoder", hint: "Target side: receives activations, sends gradients." },
    ],
  },
};

export const PRESETS = [
  { value: "tiny", label: "tiny", hint: "Small models and few steps: runs on CPU in minutes. Good for a first try." },
  { value: "paper", label: "paper", hint: "The paper's model sizes: needs accelerators and hours." },
] as const;

export type Preset = (typeof PRESETS)[number]["value"];

/** Codec specs the server understands (contract/codec_spec.py); any other valid spec may be typed in.
 * ABNet's streams are per sample, where the server refuses error feedback (ef); `auto` lets the link choose. */
export const CODEC_SUGGESTIONS = [
  "auto",
  "none",
  "fp16",
  "bf16",
  "int8",
  "fp16(lowrank(0.2))",
  "fp16(lowrank(0.2,method=power))",
  "int8(lowrank(0.5))",
];

/** The ABNet codecs when the user leaves them blank (AbnetJobConfig's defaults). */
export const DEFAULT_CODECS = { forward: "fp16", backward: "int8" } as const;

/** Overrides as typed in the form; blank means "the preset's value". */
export interface AdvancedOptions {
  steps: string;
  batchSize: string;
  ckptEvery: string;
  seed: string;
  /** ELECTRA only. */
  nDiscriminators: string;
  /** ELECTRA only: when off, the discriminators' cluster gets no copy of the text, but whole corrupted sequences cross (see whatEachClusterSees). */
  discriminatorReadsText: boolean;
  /** ABNet only: codec spec for activations, encoder to decoder. */
  forwardCodec: string;
  /** ABNet only: codec spec for gradients, decoder to encoder. */
  backwardCodec: string;
  /** ABNet only: steps before this one send float32. */
  compressFromStep: string;
}

export const NO_ADVANCED: AdvancedOptions = {
  steps: "",
  batchSize: "",
  ckptEvery: "",
  seed: "",
  nDiscriminators: "",
  discriminatorReadsText: true,
  forwardCodec: "",
  backwardCodec: "",
  compressFromStep: "",
};

function setNumber(config: Record<string, unknown>, key: string, value: string): void {
  if (value.trim()) config[key] = Number(value);
}

/**
 * The job config for a kind: the preset plus only the overrides the user filled in, with the
 * keys of app/jobs/schemas.py (ElectraJobConfig, AbnetJobConfig; extra keys are refused).
 */
export function buildConfig(kind: JobKind, preset: Preset, advanced: AdvancedOptions): Record<string, unknown> {
  const config: Record<string, unknown> = { preset };
  setNumber(config, "seed", advanced.seed);
  setNumber(config, "steps", advanced.steps);
  setNumber(config, "batch_size", advanced.batchSize);
  setNumber(config, "ckpt_every", advanced.ckptEvery);
  if (kind === "electra_pretrain") {
    setNumber(config, "n_discriminators", advanced.nDiscriminators);
    if (!advanced.discriminatorReadsText) config.discriminator_reads_text = false;
  } else {
    if (advanced.forwardCodec.trim()) config.forward_codec = advanced.forwardCodec.trim();
    if (advanced.backwardCodec.trim()) config.backward_codec = advanced.backwardCodec.trim();
    setNumber(config, "compress_from_step", advanced.compressFromStep);
  }
  return config;
}

/**
 * What each role's cluster receives, for a job kind and its config: the truth the job page
 * shows (README, "Which cluster sees what"). Neither ELECTRA mode hides the text from the
 * discriminators' cluster.
 */
export function whatEachClusterSees(kind: JobKind, config: Record<string, unknown> = {}): Record<string, string> {
  if (kind === "electra_pretrain") {
    const generator = "The whole text, decrypted after the grant check; it trains the tokenizer and the generator.";
    if (config.discriminator_reads_text === false) {
      return {
        generator,
        discriminator:
          "No copy of the dataset, but every corrupted sequence (about 85% of its tokens as in the text) and the tokenizer to decode them: it can read the text nearly verbatim. It writes the model, with the tokenizer.",
      };
    }
    return {
      generator,
      discriminator:
        "The whole text too (its own copy, to rebuild the sequences), the tokenizer, and only the replaced tokens from the generator. It writes the model, with the tokenizer.",
    };
  }
  return {
    encoder: "The source column of the parallel corpus and the source model; gradients from the decoder. Never a target sentence.",
    decoder:
      "The target column and the target model; the encoder's (compressed) activations of each source sentence, which carry what it says. Never the source text itself. Both roles on one cluster is refused.",
  };
}
