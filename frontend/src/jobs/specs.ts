/** What each job kind needs: inputs by name and kind, and the roles to place on clusters. */
import type { DatasetKind, JobKind } from "../api/types";

export interface InputSpec {
  name: string;
  label: string;
  kind: DatasetKind;
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

export const COMPRESSION_CHOICES = [
  { value: "", label: "Preset default" },
  { value: "none", label: "None" },
  { value: "fp16", label: "FP16" },
  { value: "int8", label: "INT8" },
  { value: "svd", label: "SVD low-rank" },
  { value: "fp16_svd", label: "FP16 of SVD" },
];

export interface AdvancedOptions {
  steps: string;
  compression: string;
  svdKeepRatio: string;
  compressionStartStep: string;
}

/** The job config: the preset plus only the overrides the user filled in. */
export function buildConfig(preset: Preset, advanced: AdvancedOptions): Record<string, unknown> {
  const config: Record<string, unknown> = { preset };
  if (advanced.steps.trim()) config.steps = Number(advanced.steps);
  if (advanced.compression) {
    config.compression = advanced.compression;
    if (advanced.compression.includes("svd") && advanced.svdKeepRatio.trim()) config.svd_keep_ratio = Number(advanced.svdKeepRatio);
    if (advanced.compressionStartStep.trim()) config.compression_start_step = Number(advanced.compressionStartStep);
  }
  return config;
}
