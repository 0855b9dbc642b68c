/** Shapes of the API's answers (../shared/API.md). Optional fields are extras the UI uses when present. */

export type Role = "admin" | "member" | "auditor";
export type UserStatus = "active" | "suspended" | "deleted";

export interface Page<T> {
  items: T[];
  total: number;
}

export interface User {
  id: string;
  email: string;
  display_name: string;
  role: Role;
  status: UserStatus;
  created_at?: string;
}

/** A one-time password reset link an admin issues (POST /users/{id}/reset-link): shown once. */
export interface ResetLink {
  url: string;
  expires_at: string;
}

export interface ApiToken {
  id: string;
  name: string;
  expires_at: string | null;
  created_at?: string;
  last_used_at?: string | null;
  revoked_at?: string | null;
}

export interface NewApiToken extends ApiToken {
  token: string;
}

export interface OidcInfo {
  enabled: boolean;
  /** As in "Sign in with <provider>". */
  provider_name: string;
  /** False where an admin requires single sign-on for everyone. */
  password_login: boolean;
}

export interface TotpStatus {
  enrolled: boolean;
  recovery_codes_left: number;
  /** The platform requires a second factor for this account (admins, where set). */
  required: boolean;
}

export interface TotpEnrolment {
  secret: string;
  otpauth_uri: string;
  /** The otpauth URI as an SVG QR code, made by the server. */
  qr_svg: string;
}

export interface Workspace {
  id: string;
  name: string;
  owner_id: string;
  storage_bytes_used: number;
  storage_bytes_limit: number;
  max_concurrent_jobs: number;
  created_at?: string;
  is_personal?: boolean;
  owner_email?: string;
}

export type DatasetKind = "text" | "parallel" | "model";

export interface Dataset {
  id: string;
  name: string;
  kind: DatasetKind;
  size_bytes: number;
  sha256: string | null; // null in the catalog without a grant: it would confirm a guess
  discoverable: boolean;
  workspace_id?: string | null;
  owner_id?: string;
  owner_email?: string;
  owner_display_name?: string | null;
  created_at?: string;
  description?: string;
  /** Source dataset ids a job derived it from (those the caller may know of). */
  derived_from?: string[];
  /** Whether its sources' owners must release it before it downloads. */
  release?: ReleaseState;
  derived_by_job_id?: string | null;
  /** The names of the `derived_from` datasets. */
  derived_from_names?: Record<string, string>;
  /** What an approval allows when the owner names no clusters. */
  default_clusters?: ClusterSet;
  /** Where the caller's jobs may send it (their grant, or their sources' grants). */
  allowed_clusters?: ClusterSet;
}

/** The clusters data may go to: a list of cluster names, or "any". */
export type ClusterSet = string[] | "any";

export type ReleaseState = "not_needed" | "required" | "pending" | "released";
export type ReleaseStatus = "pending" | "approved" | "denied";

export interface ReleaseApproval {
  owner_id: string;
  owner_display_name: string;
  status: ReleaseStatus;
  decided_at: string | null;
}

export interface ReleaseRequest {
  id: string;
  dataset_id: string;
  requester_id: string;
  purpose: string;
  status: ReleaseStatus;
  created_at?: string;
  decided_at?: string | null;
  dataset_name?: string;
  dataset_kind?: DatasetKind;
  dataset_size_bytes?: number;
  requester_email?: string;
  requester_display_name?: string;
  approvals: ReleaseApproval[];
  /** The sources behind it: all of them for the requester, their own for a source owner. */
  sources?: { id: string; name: string; kind: DatasetKind; owner_id: string }[];
}

export type AccessStatus = "pending" | "approved" | "denied" | "revoked" | "withdrawn" | "expired";

export interface AccessRequest {
  id: string;
  dataset_id: string;
  requester_id: string;
  owner_id: string;
  purpose: string;
  status: AccessStatus;
  expires_at?: string | null;
  created_at?: string;
  decided_at?: string | null;
  dataset_name?: string;
  dataset_kind?: DatasetKind;
  requester_email?: string;
  requester_display_name?: string;
  owner_email?: string;
  /** Where the data may go once approved; null while pending. */
  clusters?: ClusterSet | null;
  /** The dataset's default set, which an approval naming none applies. */
  dataset_default_clusters?: ClusterSet;
}

export interface Cluster {
  id: string;
  name: string;
  switch_host: string;
  switch_port: number;
  created_at?: string;
  /** The switch holds an unexpired, unrevoked certificate from the platform CA. */
  has_valid_certificate?: boolean;
  /** Its switch reported in lately. */
  switch_online?: boolean;
  /** Worker processes that reported in lately. */
  workers_online?: number;
  /** Jobs with a running role on this cluster. */
  running_jobs?: number;
  /** How many roles may run there at once; null: unbounded. */
  role_slots?: number | null;
  slots_in_use?: number;
  /** Who holds the slots (an admin sees emails; others "you" and "other tenants"). */
  slots_by_tenant?: { tenant: string; slots: number; you?: boolean }[];
  /** Jobs waiting for slots there. */
  queued_jobs?: number;
  /** The online workers' devices, alike ones together, CUDA first. */
  worker_devices?: WorkerDevices[];
  /** Its RabbitMQ user: "missing" when making it failed (broker_problem says why and the fix). */
  broker_user?: "ok" | "missing" | null;
  broker_problem?: string | null;
}

/** What a worker trains on, as it reported it (`nebula worker --device`). */
export interface Device {
  kind: "cpu" | "cuda";
  /** CUDA: the first device's name; CPU: the processor's model, or "". */
  name?: string;
  /** CUDA devices visible to the worker; CPU: cores it may use. */
  count?: number;
  /** CUDA: the first device's memory. */
  memory_bytes?: number | null;
  /** CUDA: the CUDA runtime torch was built with. */
  runtime?: string;
}

/** Online workers of a cluster with the same device. */
export interface WorkerDevices {
  device: Device;
  workers: number;
}

/** A switch or worker process of a cluster that reports in. */
export interface Presence {
  kind: "switch" | "worker";
  instance: string;
  version: string;
  started_at: string;
  last_seen: string;
  /** job/role pairs it runs now */
  running_roles: string[];
  /** A worker's device; a switch has none. */
  device?: Device | null;
}

export interface WorkerCredential {
  id: string;
  cluster_id: string;
  created_at: string;
  revoked_at: string | null;
  /** Only in the answer that made it. */
  token?: string;
}

/** An active job as an admin sees it across tenants: metadata, no data. */
export interface JobOverview {
  id: string;
  kind: JobKind;
  status: JobStatus;
  owner_id: string;
  owner_email: string;
  workspace_id: string;
  placement: Record<string, string>;
  progress: number;
  step: number;
  total_steps: number;
  attempt: number;
  created_at: string;
  started_at: string | null;
  waiting?: JobWaiting | null;
}

export interface Certificate {
  serial: string;
  cluster_id?: string;
  not_before?: string;
  not_after: string;
  revoked_at?: string | null;
  revocation_reason?: string | null;
  subject?: string;
  status?: string;
}

export interface SignedCertificate {
  serial: string;
  certificate_pem: string;
  not_after: string;
}

export interface EnrollmentToken {
  token: string;
  expires_at: string;
}

export type JobKind = "electra_pretrain" | "abnet_finetune";
export type Preset = "tiny" | "paper";
export type JobStatus = "queued" | "running" | "succeeded" | "failed" | "cancelled";

export interface Job {
  id: string;
  kind: JobKind;
  status: JobStatus;
  progress: number;
  step: number;
  total_steps: number;
  /** Latest value of each `role.metric`. */
  metrics: Record<string, number> | null;
  error: string | null;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
  workspace_id?: string;
  paused?: boolean;
  attempt?: number;
  config?: Record<string, unknown>;
  inputs?: Record<string, string>;
  placement?: Record<string, string>;
  /** Queued for role slots: why, and its place in the fair order. */
  waiting?: JobWaiting | null;
  /** Per cluster: its roles and the grants that let the job's data go there. */
  residency?: ClusterResidency[];
}

export interface JobWaiting {
  reason: string;
  position: number;
  cluster: string;
  kind: "cluster_full" | "tenant_limit";
}

export interface ClusterResidency {
  cluster: string;
  roles: string[];
  allowed: boolean;
  grants: { grant_id: string; input: string; dataset_id: string; clusters: ClusterSet }[];
}

/** One role of a job kind (GET /job-kinds). */
export interface JobKindRole {
  name: string;
  label: string;
  hint: string;
  peer: string;
  reads: string[];
  /** input -> config field: the role reads that input only while the field is true. */
  read_if: Record<string, string>;
  artifact: string | null;
  /** What the role's cluster receives. */
  sees: string;
  /** ... when one of its `read_if` fields is false. */
  sees_otherwise: string;
}

export interface JobKindInput {
  name: string;
  /** The dataset kind it must be. */
  kind: string;
  optional: boolean;
  label: string;
  hint: string;
}

export interface JobKindPreset {
  name: string;
  hint: string;
  /** The training-config fields the preset sets. */
  values: Record<string, unknown>;
}

/** A job kind as the server's table tells it: the one source of roles, inputs and presets. */
export interface JobKindSpec {
  kind: JobKind;
  label: string;
  description: string;
  primary_role: string;
  apart: string[];
  roles: JobKindRole[];
  inputs: JobKindInput[];
  presets: JobKindPreset[];
  /** The fields a submission's config may hold. */
  config_fields: string[];
}

export interface JobSubmission {
  kind: JobKind;
  config: Record<string, unknown>;
  inputs: Record<string, string>;
  placement: Record<string, string>;
}

export type SeriesPoint = [number, number];

/** `{series: {"role.metric": [[step, value], ...]}}`. */
export interface JobMetrics {
  series: Record<string, SeriesPoint[]>;
}

/** The data of an SSE `event: status` on GET /jobs/{id}/events: a snapshot of the job. */
export interface JobEvent {
  id?: string;
  status?: JobStatus;
  progress?: number;
  step?: number;
  total_steps?: number;
  metrics?: Record<string, number>;
  error?: string | null;
  attempt?: number;
}

export type ArtifactKind = "model" | "adapters" | "report";

/** A file a job wrote; a model or adapters artifact is stored as a dataset in the owner's workspace. */
export interface Artifact {
  id: string;
  name: string;
  kind: ArtifactKind | string;
  dataset_id: string | null;
  size_bytes: number;
  details: Record<string, unknown>;
  created_at: string;
}

export interface AuditEvent {
  id: string;
  seq: number;
  at: string;
  actor_id: string | null;
  action: string;
  subject_type: string | null;
  subject_id: string | null;
  outcome: string;
  ip: string | null;
  details: unknown;
  hash: string;
  prev_hash: string | null;
}

/** Who a user id is, as the audit listing names it. */
export interface AuditPerson {
  email: string;
  display_name: string;
}

/** An event of the audit listing, with the names its ids have now (not part of the chain). */
export interface NamedAuditEvent extends AuditEvent {
  actor: AuditPerson | null;
  subject_name: string | null;
  subject_email: string | null;
}

/** One finding of the audit chain's verification, over a run of events. */
export interface AuditProblem {
  kind: "removed" | "rewritten" | "forged" | "tail_deleted" | "unanchored" | "anchors_disagree";
  first_seq: number;
  last_seq: number;
  detail: string;
}

export interface AuditVerification {
  ok: boolean;
  count: number;
  first_bad_seq: number | null;
  anchored_seq?: number | null;
  problems?: AuditProblem[];
}
