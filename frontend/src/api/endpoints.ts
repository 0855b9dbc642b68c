/** Typed calls for each endpoint the UI uses. */
import { api, buildUrl, request, uploadWithProgress, type Query } from "./client";
import type {
  AccessRequest,
  ApiToken,
  Artifact,
  AuditEvent,
  AuditVerification,
  Certificate,
  Cluster,
  ClusterSet,
  Dataset,
  DatasetKind,
  EnrollmentToken,
  Job,
  JobMetrics,
  JobKindSpec,
  JobOverview,
  JobSubmission,
  NamedAuditEvent,
  NewApiToken,
  OidcInfo,
  Page,
  Presence,
  ReleaseRequest,
  ResetLink,
  Role,
  SignedCertificate,
  TotpEnrolment,
  TotpStatus,
  User,
  WorkerCredential,
  Workspace,
} from "./types";

const enc = encodeURIComponent;

export interface PageQuery {
  limit?: number;
  offset?: number;
}

/** Some list endpoints may answer a bare array; the UI treats both the same. */
export function asPage<T>(value: Page<T> | T[] | undefined): Page<T> {
  if (!value) return { items: [], total: 0 };
  if (Array.isArray(value)) return { items: value, total: value.length };
  return { items: value.items ?? [], total: value.total ?? value.items?.length ?? 0 };
}

async function page<T>(path: string, query?: Query): Promise<Page<T>> {
  return asPage(await api.get<Page<T> | T[]>(path, query));
}

// Accounts
export const auth = {
  login: (email: string, password: string, otp?: string) =>
    request<{ user: User; expires_at: string }>("/auth/login", {
      method: "POST",
      json: otp ? { email, password, otp } : { email, password },
      expectUnauthorized: true,
    }),
  oidcInfo: () => request<OidcInfo>("/auth/oidc", { expectUnauthorized: true }),
  forgotPassword: (email: string) => api.post<{ detail: string }>("/auth/forgot-password", { email }),
  resetPassword: (token: string, new_password: string) =>
    request<void>("/auth/reset-password", { method: "POST", json: { token, new_password }, expectUnauthorized: true }),
  totpStatus: () => api.get<TotpStatus>("/me/totp"),
  totpEnrol: () => api.post<TotpEnrolment>("/me/totp", {}),
  totpConfirm: (code: string) => api.post<{ recovery_codes: string[] }>("/me/totp/confirm", { code }),
  totpRemove: (code: string) => api.post<void>("/me/totp/remove", { code }),
  logout: () => api.post<void>("/auth/logout"),
  me: () => request<User>("/me", { expectUnauthorized: true }),
  changePassword: (current_password: string, new_password: string) =>
    api.post<void>("/me/password", { current_password, new_password }),
  listTokens: () => page<ApiToken>("/me/tokens"),
  createToken: (name: string, expires_in_days: number, otp?: string) =>
    api.post<NewApiToken>("/me/tokens", otp ? { name, expires_in_days, otp } : { name, expires_in_days }),
  revokeToken: (id: string) => api.del(`/me/tokens/${enc(id)}`),
  myAudit: (q: PageQuery = {}) => page<AuditEvent>("/me/audit", { ...q }),
};

export const users = {
  list: (q: PageQuery = {}) => page<User>("/users", { ...q }),
  create: (body: { email: string; display_name: string; role: Role; password: string }) => api.post<User>("/users", body),
  update: (id: string, body: { display_name?: string; role?: Role }) => api.patch<User>(`/users/${enc(id)}`, body),
  suspend: (id: string) => api.post<User>(`/users/${enc(id)}/suspend`),
  reactivate: (id: string) => api.post<User>(`/users/${enc(id)}/reactivate`),
  remove: (id: string) => api.del(`/users/${enc(id)}`),
  resetLink: (id: string) => api.post<ResetLink>(`/users/${enc(id)}/reset-link`),
};

// Workspaces and datasets
export const workspaces = {
  list: (q: PageQuery = {}) => page<Workspace>("/workspaces", { limit: 500, ...q }),
  get: (ws: string) => api.get<Workspace>(`/workspaces/${enc(ws)}`),
  create: (name: string) => api.post<Workspace>("/workspaces", { name }),
  remove: (ws: string) => api.del(`/workspaces/${enc(ws)}`),
  /** Admin: the workspaces of another user. */
  listOwnedBy: (owner_id: string, q: PageQuery = {}) => page<Workspace>("/workspaces", { limit: 500, ...q, owner_id }),
  /** Admin: change a workspace's quotas. */
  setQuota: (ws: string, body: { storage_bytes_limit?: number; max_concurrent_jobs?: number }) =>
    api.patch<Workspace>(`/workspaces/${enc(ws)}/quota`, body),
};

export const datasets = {
  list: (ws: string, q: PageQuery = {}) => page<Dataset>(`/workspaces/${enc(ws)}/datasets`, { limit: 500, ...q }),
  get: (id: string) => api.get<Dataset>(`/datasets/${enc(id)}`),
  remove: (id: string) => api.del(`/datasets/${enc(id)}`),
  setDiscoverable: (id: string, discoverable: boolean) => api.patch<Dataset>(`/datasets/${enc(id)}`, { discoverable }),
  contentUrl: (id: string) => buildUrl(`/datasets/${enc(id)}/content`),
  upload: (
    ws: string,
    fields: { file: File; name: string; kind: DatasetKind; discoverable: boolean },
    onProgress: (loaded: number, total: number) => void,
  ) => {
    const form = new FormData();
    form.append("file", fields.file);
    form.append("name", fields.name);
    form.append("kind", fields.kind);
    form.append("discoverable", fields.discoverable ? "true" : "false");
    return uploadWithProgress<Dataset>(`/workspaces/${enc(ws)}/datasets`, form, onProgress);
  },
  catalog: (q: PageQuery & { q?: string; kind?: string } = {}) => page<Dataset>("/catalog", { limit: 500, ...q }),
};

export const access = {
  list: (direction: "incoming" | "outgoing") => page<AccessRequest>("/access-requests", { direction, limit: 500 }),
  create: (dataset_id: string, purpose: string) => api.post<AccessRequest>("/access-requests", { dataset_id, purpose }),
  approve: (id: string, expires_at?: string, clusters?: ClusterSet) =>
    api.post<AccessRequest>(`/access-requests/${enc(id)}/approve`, {
      ...(expires_at ? { expires_at } : {}),
      ...(clusters !== undefined ? { clusters } : {}),
    }),
  narrow: (id: string, clusters: string[]) => api.post<AccessRequest>(`/access-requests/${enc(id)}/narrow`, { clusters }),
  deny: (id: string) => api.post<AccessRequest>(`/access-requests/${enc(id)}/deny`),
  revoke: (id: string) => api.post<AccessRequest>(`/access-requests/${enc(id)}/revoke`),
  withdraw: (id: string) => api.post<AccessRequest>(`/access-requests/${enc(id)}/withdraw`),
};

export const releases = {
  list: (direction: "incoming" | "outgoing") => page<ReleaseRequest>("/release-requests", { direction, limit: 500 }),
  create: (dataset_id: string, purpose: string) => api.post<ReleaseRequest>(`/datasets/${enc(dataset_id)}/release-requests`, { purpose }),
  approve: (id: string) => api.post<ReleaseRequest>(`/release-requests/${enc(id)}/approve`),
  deny: (id: string) => api.post<ReleaseRequest>(`/release-requests/${enc(id)}/deny`),
};

// Clusters and certificates
export const clusters = {
  list: () => page<Cluster>("/clusters", { limit: 500 }),
  create: (body: { name: string; switch_host: string; switch_port: number }) => api.post<Cluster>("/clusters", body),
  remove: (id: string) => api.del(`/clusters/${enc(id)}`),
  certificates: (id: string) => page<Certificate>(`/clusters/${enc(id)}/certificates`, { limit: 500 }),
  enrollmentToken: (id: string, expires_in_minutes = 60) =>
    api.post<EnrollmentToken>(`/clusters/${enc(id)}/enrollment-tokens`, { expires_in_minutes }),
  signCsr: (id: string, csr_pem: string) => api.post<SignedCertificate>(`/clusters/${enc(id)}/csr`, { csr_pem }),
  revokeCertificate: (serial: string, reason: string) =>
    api.post<Certificate>(`/certificates/${enc(serial)}/revoke`, { reason }),
  presence: (id: string) => page<Presence>(`/clusters/${enc(id)}/presence`),
  workerCredential: (id: string) => api.post<WorkerCredential>(`/clusters/${enc(id)}/worker-credentials`),
};

// Across tenants (admins)
export const overview = {
  activeJobs: () => page<JobOverview>("/admin/jobs", { limit: 500 }),
};

// Jobs
export const jobs = {
  kinds: () => api.get<{ items: JobKindSpec[] }>("/job-kinds"),
  list: (ws: string, q: PageQuery = {}) => page<Job>(`/workspaces/${enc(ws)}/jobs`, { ...q }),
  submit: (ws: string, body: JobSubmission) => api.post<{ id: string; status: string }>(`/workspaces/${enc(ws)}/jobs`, body),
  get: (id: string) => api.get<Job>(`/jobs/${enc(id)}`),
  metrics: (id: string) => api.get<JobMetrics>(`/jobs/${enc(id)}/metrics`),
  cancel: (id: string) => api.post<unknown>(`/jobs/${enc(id)}/cancel`),
  artifacts: (id: string) => page<Artifact>(`/jobs/${enc(id)}/artifacts`),
  eventsUrl: (id: string) => buildUrl(`/jobs/${enc(id)}/events`),
};

// Audit
export interface AuditFilter extends PageQuery {
  actor_id?: string;
  action?: string;
  outcome?: string;
  since?: string;
  until?: string;
}

export const audit = {
  list: (filter: AuditFilter) => page<NamedAuditEvent>("/audit", { ...filter }),
  verify: () => api.get<AuditVerification>("/audit/verify"),
  /** The whole log in chain order. */
  exportUrl: (format: "jsonl" | "csv") => buildUrl("/audit/export", { format }),
};
