/**
 * The web UI's side of the job kinds table. The table itself (roles, peers, inputs, presets,
 * what each cluster receives) comes from the server, GET /job-kinds (contract/kinds.py):
 * nothing here names a role or an input.
 */
import type { JobKindSpec, Preset } from "../api/types";

export type { Preset };

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
  "fp16(lowrank(0.2,method=stream))",
  "int8(lowrank(0.5))",
];

/** A preset's value of a config field, as the server's table states it ("" when it sets none). */
export function presetValue(spec: JobKindSpec, preset: Preset, field: string): string {
  const value = spec.presets.find((p) => p.name === preset)?.values[field];
  return value === undefined || value === null ? "" : String(value);
}

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
  /** The device every role needs: "" (any: what its worker has), "cpu" or "cuda". */
  device: "" | "cpu" | "cuda";
  /** ABNet only: "" (the default, `sync`) or "stale1": the next step's forwards overlap this step's last round trip. */
  schedule: "" | "sync" | "stale1";
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
  device: "",
  schedule: "",
};

function setNumber(config: Record<string, unknown>, fields: Set<string>, key: string, value: string): void {
  if (fields.has(key) && value.trim()) config[key] = Number(value);
}

function setText(config: Record<string, unknown>, fields: Set<string>, key: string, value: string): void {
  if (fields.has(key) && value.trim()) config[key] = value.trim();
}

/**
 * The job config for a kind: the preset plus only the overrides the user filled in, each sent
 * only when the kind's config has that field (`config_fields` of GET /job-kinds; the server
 * refuses any other key).
 */
export function buildConfig(spec: Pick<JobKindSpec, "config_fields">, preset: Preset, advanced: AdvancedOptions): Record<string, unknown> {
  const fields = new Set(spec.config_fields);
  const config: Record<string, unknown> = { preset };
  setNumber(config, fields, "seed", advanced.seed);
  setNumber(config, fields, "steps", advanced.steps);
  setNumber(config, fields, "batch_size", advanced.batchSize);
  setNumber(config, fields, "ckpt_every", advanced.ckptEvery);
  setNumber(config, fields, "n_discriminators", advanced.nDiscriminators);
  if (fields.has("discriminator_reads_text") && !advanced.discriminatorReadsText) config.discriminator_reads_text = false;
  setText(config, fields, "forward_codec", advanced.forwardCodec);
  setText(config, fields, "backward_codec", advanced.backwardCodec);
  setNumber(config, fields, "compress_from_step", advanced.compressFromStep);
  setText(config, fields, "device", advanced.device);
  setText(config, fields, "schedule", advanced.schedule);
  return config;
}

/** The device a role of a job needs: its `role_devices` entry, else the job's `device`, else "any". */
export function roleDevice(config: Record<string, unknown> | undefined, role: string): string {
  const perRole = config?.role_devices as Record<string, unknown> | undefined;
  const need = perRole?.[role] ?? config?.device;
  return typeof need === "string" ? need : "any";
}

/**
 * What each role's cluster receives, for a job kind and its config: the truth the job page
 * shows (README, "Which cluster sees what"), from the server's table. A role whose `read_if`
 * field is false in the config reads less, and the table says what it receives then.
 */
export function whatEachClusterSees(spec: Pick<JobKindSpec, "roles">, config: Record<string, unknown> = {}): Record<string, string> {
  return Object.fromEntries(
    spec.roles.map((role) => {
      const withheld = Object.values(role.read_if).some((field) => config[field] === false);
      return [role.name, withheld && role.sees_otherwise ? role.sees_otherwise : role.sees];
    }),
  );
}
